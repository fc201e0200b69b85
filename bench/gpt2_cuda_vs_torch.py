#!/usr/bin/env python3
"""GPT-2 124M training on one GPU: napkin's CUDA trainer vs PyTorch eager and torch.compile.

Run on the GPU machine, in one call (bench/gpu/run.sh does it), with a trainer
built beforehand on a machine that has napkin's compiler:

    napkin build models/gpt2-124m.yaml --target cuda -o build/bench/gpt2-cuda

  napkin: runs the trainer for WARMUP + STEPS steps with `--order sequential
          --log-every 1 --metrics TMP --quiet --data DATA`, takes the median
          `step_ms` after the warmup; its static FLOPs and tokens per step,
          its planned arena and scratch come from `--print-program`.
  torch:  the same model by hand (models/gpt2-124m.yaml: pre-norm blocks,
          biases, tanh gelu, layernorm eps 1e-5, tied wte, causal attention
          through F.scaled_dot_product_attention, AdamW with the YAML's betas,
          eps, weight decay and no_decay groups, clip_grad_norm_ 1.0), fp32
          master weights, the forward under torch.autocast(bfloat16), the
          same batch and sequence length, the same token file. Eager, then
          torch.compile(model). Each step is timed with CUDA events around
          zero_grad, forward, backward, clipping and optimizer.step; median of
          STEPS after WARMUP. Peak memory: torch.cuda.max_memory_allocated
          over the timed steps.

MFU for both sides is napkin's static FLOPs per step (the same count) over the
median step time, against --peak (dense bf16, TFLOP/s; H100 SXM and H200:
989.5). napkin's memory is what it allocates on the device: arena + scratch +
the cuBLASLt workspace (32 MiB).

Targets (issue 6): napkin MFU >= 45%, napkin tokens/s >= torch.compile's,
napkin memory <= torch's (each mode). Each row says PASS or MISS; the exit
status is 1 when one is missed or a side failed to run.

--smoke: the torch side alone at tiny dims on whatever device torch has
(CPU here), to check the script itself without a GPU.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

GPT2_DIMS = dict(vocab=50257, d=768, heads=12, layers=12, seq=1024, batch=8)
ADAMW = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
CUBLASLT_WORKSPACE = 32 << 20


class GPT2(torch.nn.Module):
    def __init__(self, vocab, d, heads, layers, seq):
        super().__init__()
        self.heads = heads
        p = lambda *shape, std=None, fill=None: torch.nn.Parameter(
            torch.empty(*shape).normal_(0, std) if std is not None else torch.full(shape, float(fill)))
        self.wte = p(vocab, d, std=0.02)
        self.wpe = p(seq, d, std=0.01)
        self.lnf_g, self.lnf_b = p(d, fill=1), p(d, fill=0)
        proj_std = 0.02 / math.sqrt(2 * layers)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            b = torch.nn.Module()
            b.ln1_g, b.ln1_b = p(d, fill=1), p(d, fill=0)
            b.attn_w, b.attn_b = p(d, 3 * d, std=0.02), p(3 * d, fill=0)
            b.proj_w, b.proj_b = p(d, d, std=proj_std), p(d, fill=0)
            b.ln2_g, b.ln2_b = p(d, fill=1), p(d, fill=0)
            b.fc_w, b.fc_b = p(d, 4 * d, std=0.02), p(4 * d, fill=0)
            b.fc_proj_w, b.fc_proj_b = p(4 * d, d, std=proj_std), p(d, fill=0)
            self.blocks.append(b)

    def forward(self, tokens, targets):
        B, T = tokens.shape
        d = self.wte.shape[1]
        x = self.wte[tokens] + self.wpe[:T]
        for b in self.blocks:
            h = F.layer_norm(x, (d,), b.ln1_g, b.ln1_b, 1e-5)
            q, k, v = (h @ b.attn_w + b.attn_b).view(B, T, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            if hasattr(F, "scaled_dot_product_attention"):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # torch < 2.0 (the --smoke run on Debian's torch 1.13)
                s = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.heads)
                s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
                y = s.softmax(-1) @ v
            x = x + y.transpose(1, 2).reshape(B, T, d) @ b.proj_w + b.proj_b
            h = F.layer_norm(x, (d,), b.ln2_g, b.ln2_b, 1e-5)
            x = x + F.gelu(h @ b.fc_w + b.fc_b, approximate="tanh") @ b.fc_proj_w + b.fc_proj_b
        logits = F.layer_norm(x, (d,), self.lnf_g, self.lnf_b, 1e-5) @ self.wte.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def no_decay(name):  # the YAML's no_decay: ["*_b", "*_g", "wpe"]
    leaf = name.split(".")[-1]
    return leaf.endswith("_b") or leaf.endswith("_g") or leaf == "wpe"


def batches(tokens, batch, seq, count, device):
    """Sequential (tokens, targets) batches from the token file, like the trainer's --order sequential."""
    out, need = [], batch * (seq + 1)
    for i in range(count):
        start = (i * batch * seq) % max(1, len(tokens) - need)
        rows = [tokens[start + r * seq: start + r * seq + seq + 1] for r in range(batch)]
        t = torch.tensor(np.stack(rows).astype(np.int64), device=device)
        out.append((t[:, :-1].contiguous(), t[:, 1:].contiguous()))
    return out


def time_torch(mode, dims, tokens, steps, warmup, device):
    torch.manual_seed(0)
    model = GPT2(dims["vocab"], dims["d"], dims["heads"], dims["layers"], dims["seq"]).to(device)
    params = list(model.named_parameters())
    groups = [{"params": [p for n, p in params if not no_decay(n)], "weight_decay": ADAMW["weight_decay"]},
              {"params": [p for n, p in params if no_decay(n)], "weight_decay": 0.0}]
    fused = {"fused": True} if device == "cuda" else {}
    opt = torch.optim.AdamW(groups, lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"], **fused)
    step_fn = torch.compile(model) if mode == "compile" else model
    data = batches(tokens, dims["batch"], dims["seq"], 8, device)
    cuda = device == "cuda"
    times = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for i in range(warmup + steps):
        x, y = data[i % len(data)]
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            t0 = __import__("time").perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if cuda:
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end)
        else:
            ms = 1e3 * (__import__("time").perf_counter() - t0)
        if i >= warmup:
            times.append(ms)
    if not math.isfinite(loss.item()):
        raise RuntimeError(f"torch {mode}: loss {loss.item()}")
    memory = torch.cuda.max_memory_allocated() if cuda else 0
    return statistics.median(times), memory, loss.item()


def time_napkin(trainer, data, steps, warmup, tmp):
    program = json.loads(subprocess.run([trainer, "--print-program"], check=True, capture_output=True, text=True).stdout)
    metrics = os.path.join(tmp, "napkin.jsonl")
    cmd = [trainer, "--steps", str(warmup + steps), "--order", "sequential", "--log-every", "1", "--metrics", metrics,
           "--quiet", "--data", data, "--eval-every", "0", "--checkpoint-every", "0"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {run.returncode}:\n{run.stdout}{run.stderr}")
    rows = [json.loads(l) for l in open(metrics) if '"step_ms"' in l]
    times = [r["step_ms"] for r in rows if r["step"] > warmup]
    memory = program["arena_bytes"] + program.get("cuda", {}).get("scratch_bytes", 0) + CUBLASLT_WORKSPACE
    return statistics.median(times), memory, rows[-1]["loss"], program


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trainer", action="append", default=[],
                    help="napkin's CUDA trainer for models/gpt2-124m.yaml (repeat: each is timed and checked, "
                         "e.g. one built with --memory-budget)")
    ap.add_argument("--data", help="u16 token file (GPT-2 token ids)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--peak", type=float, default=989.5, help="dense bf16 peak, TFLOP/s (H100/H200: 989.5)")
    ap.add_argument("--no-torch", action="store_true", help="time napkin's trainers only")
    ap.add_argument("--smoke", action="store_true", help="torch side only, tiny dims, any device (checks the script)")
    a = ap.parse_args()

    if a.smoke:
        dims = dict(vocab=256, d=64, heads=4, layers=2, seq=32, batch=2)
        tokens = np.random.default_rng(0).integers(0, 256, 4096).astype(np.uint16)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        ms, mem, loss = time_torch("eager", dims, tokens, 3, 1, device)
        print(f"smoke: torch eager on {device}: {ms:.2f} ms/step, loss {loss:.4f}")
        return 0
    if not (a.trainer and a.data):
        ap.error("--trainer and --data are required (or --smoke)")
    if not torch.cuda.is_available():
        print("error: no CUDA device visible to torch", file=sys.stderr)
        return 1
    tokens = np.fromfile(a.data, dtype=np.uint16)
    failed = False
    results = {}
    napkin_rows = []
    flops, tokens_per_step = None, GPT2_DIMS["batch"] * GPT2_DIMS["seq"]
    with tempfile.TemporaryDirectory() as tmp:
        for trainer in a.trainer:
            name = "napkin" if len(a.trainer) == 1 else f"napkin:{os.path.basename(trainer)}"
            try:
                ms, mem, loss, program = time_napkin(trainer, a.data, a.steps, a.warmup, tmp)
                results[name] = (ms, mem, loss)
                napkin_rows.append(name)
                # The FLOPs of the step as the model states it: a trainer built
                # with --memory-budget recomputes activations, which costs it
                # time but is not useful work, so the smallest count is the MFU's.
                flops = program["flops_per_step"] if flops is None else min(flops, program["flops_per_step"])
                tokens_per_step = program["tokens_per_step"]
            except (RuntimeError, subprocess.CalledProcessError) as e:
                print(f"{name} failed: {e}", file=sys.stderr)
                failed = True
    dims = dict(GPT2_DIMS)
    for mode in () if a.no_torch else ("eager", "compile"):
        try:
            results[mode] = time_torch(mode, dims, tokens, a.steps, a.warmup, "cuda")
        except Exception as e:  # a torch failure is reported, the other side still prints
            print(f"torch {mode} failed: {e}", file=sys.stderr)
            failed = True
    if flops is None:
        flops = 6 * 124_439_808 * tokens_per_step  # only when napkin failed: 6ND for the MFU column
    print(f"GPT-2 124M, batch {GPT2_DIMS['batch']} x seq {GPT2_DIMS['seq']}, bf16-mixed, AdamW; {torch.cuda.get_device_name()}; "
          f"torch {torch.__version__}; {flops / 1e12:.2f} TFLOP/step (napkin's static count); peak {a.peak} TFLOP/s")
    print(f"{'':8} {'ms/step':>9} {'tokens/s':>10} {'MFU':>6} {'memory':>10} {'final loss':>10}")
    for name, (ms, mem, loss) in results.items():
        print(f"{name:8} {ms:9.2f} {tokens_per_step / ms * 1e3:10.0f} {100 * flops / (ms / 1e3) / (a.peak * 1e12):5.1f}% "
              f"{mem / 2**30:8.2f} GiB {loss:10.4f}")
    for name in napkin_rows[:1]:  # the targets are the default trainer's; the others are comparisons
        ms, mem, _ = results[name]
        mfu = flops / (ms / 1e3) / (a.peak * 1e12)
        checks = [(f"{name} MFU >= 45%", mfu >= 0.45, f"{100 * mfu:.1f}%")]
        for mode in ("eager", "compile"):
            if mode in results:
                tms, tmem, _ = results[mode]
                checks.append((f"{name} tokens/s vs torch {mode}", tms / ms >= 1.0 if mode == "compile" else True,
                               f"{tms / ms:.2f}x"))
                checks.append((f"{name} memory vs torch {mode}", mem <= tmem, f"{mem / tmem:.2f}x"))
        for what, ok, value in checks:
            print(f"{'PASS' if ok else 'MISS'}  {what}: {value}")
            failed |= not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
