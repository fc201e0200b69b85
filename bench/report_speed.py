#!/usr/bin/python3
"""How long does it take to learn what GPT-2 small costs?

napkin: `napkin report models/gpt2-124m.yaml --json` (parse, lower, verify,
count every op's FLOPs and bytes). Peer: what a PyTorch user does today,
building GPT-2 small in PyTorch (python3-torch, CPU, default init) and summing
parameter numels; PyTorch 1.13 has no FLOP counter, so the peer learns less.
Both are timed as whole processes, best of N, side by side in one run.

Usage: bench/report_speed.py [--napkin build/tools/napkin] [--repeat 5]
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TORCH_PEER = r"""
import torch, torch.nn as nn
torch.set_num_threads(2)
V, T, d, L = 50257, 1024, 768, 12
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, d), nn.Embedding(T, d)
        self.h = nn.ModuleList([Block() for _ in range(L)])
        self.lnf = nn.LayerNorm(d)
        self.head = nn.Linear(d, V, bias=False)
        self.head.weight = self.wte.weight  # tied
print(sum(p.numel() for p in GPT().parameters()))
"""


def best_of(repeat, cmd):
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
        times.append(time.perf_counter() - start)
    return min(times), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--napkin", default=os.path.join(ROOT, "build/tools/napkin"))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    napkin_s, report = best_of(args.repeat, [args.napkin, "report", "models/gpt2-124m.yaml", "--json", "--device", "h100"])
    napkin_params = json.loads(report)["params"]
    torch_s, torch_out = best_of(args.repeat, [sys.executable, "-c", TORCH_PEER])
    torch_params = int(torch_out.strip())

    print(f"{'':28} {'seconds (best of %d)' % args.repeat:>22} {'params':>14}")
    print(f"{'napkin report (full report)':28} {napkin_s:22.4f} {napkin_params:14,}")
    print(f"{'pytorch build + count':28} {torch_s:22.4f} {torch_params:14,}")
    print(f"ratio (pytorch / napkin): {torch_s / napkin_s:.1f}x")
    if napkin_params != torch_params:
        print("MISMATCH: parameter counts differ", file=sys.stderr)
        return 1
    if napkin_s >= 1.0:
        print("TARGET MISSED: napkin report should finish in well under a second", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
