#!/usr/bin/env python3
"""Decode speed: napkin sample's compiled KV-cache decoder vs PyTorch with a KV cache, on this CPU.

The model is models/gpt.yaml (a char-level GPT: 4 layers, d=256, 4 heads,
context 128, vocab 256, fp32), with the weights of one checkpoint: --checkpoint
FILE, or else napkin's initial weights (`napkin train ... -- --steps 0`
writes them to a temp dir).

  napkin: `napkin sample models/gpt.yaml --checkpoint C --prompt P --tokens N
          --temperature 0 --threads T`, which prints the generated text on
          stdout and, on stderr, its decode steps' tokens/s (the wall time of
          the decode steps: inputs written, kernels run, logits read, token
          chosen) and napkin's roofline prediction for them;
  torch:  the same model written by hand (tanh gelu, layernorm eps 1e-5,
          tied head) over a static KV cache [B, H, T, hd] per layer, as
          napkin's: a prefill of the prompt, then one step per token that
          writes its k and v at its position and attends to the rows up to
          it (F.scaled_dot_product_attention on the cache's first pos + 1
          rows), in torch.inference_mode(), torch.set_num_threads(T); greedy
          argmax; the decode steps timed with time.perf_counter() from the
          first step to the last token chosen. --compile also times the step
          function under torch.compile (inductor; dynamic=True, since the
          number of cache rows read grows each step).

Correctness first: both sides decode greedily from the same prompt, and the
generated tokens must agree (at least the first --agree tokens; fp32 sums in
another order may flip a near tie later), else the script stops with exit
status 1 and nothing is timed against it. PyTorch is checked with
bench/peers/check.py's rules first (a real BLAS, --threads threads).

The sides alternate (--rounds, default 3) and each reports its best round.
The table prints tokens/s, ms per token, and the ratio napkin/torch (> 1:
napkin decodes faster).

Usage: bench/decode_vs_torch.py [--napkin build/tools/napkin] [--checkpoint FILE]
                                [--tokens 100] [--threads 2] [--rounds 3] [--compile]
Run it with the bench venv's python (bash bench/peers/setup.sh) or any
python with PyTorch 2 and numpy.
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROMPT = "The napkin math of "


def read_safetensors(path):
    """{name: numpy array} of a safetensors file (napkin's checkpoints are)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"F32": np.float32, "F64": np.float64, "BF16": None, "I64": np.int64}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        if dtypes.get(t["dtype"]) is None:
            continue  # optimizer state in other dtypes: not needed
        out[name] = np.frombuffer(data[lo:hi], dtype=dtypes[t["dtype"]]).reshape(t["shape"]).copy()
    return out


def napkin_sample(napkin, checkpoint, tokens, threads):
    r = subprocess.run([napkin, "sample", "models/gpt.yaml", "--checkpoint", checkpoint, "--prompt", PROMPT,
                        "--tokens", str(tokens), "--temperature", "0", "--threads", str(threads)],
                       cwd=ROOT, capture_output=True)
    if r.returncode != 0:
        sys.exit("napkin sample failed:\n" + r.stderr.decode(errors="replace"))
    err = r.stderr.decode(errors="replace")
    m = re.search(r"decode (\d+) steps of batch 1 in ([0-9.]+) s, ([0-9.]+) tok/s", err)
    p = re.search(r"roofline on (\S+): ([0-9.]+) tok/s", err)
    if not m:
        sys.exit("napkin sample printed no decode speed:\n" + err)
    generated = list(r.stdout[len(PROMPT.encode()):len(PROMPT.encode()) + tokens])
    return generated, float(m.group(3)), (float(p.group(2)) if p else None)


class TorchGPT:
    """gpt.yaml with a static KV cache, as napkin's inference program."""

    def __init__(self, torch, w, layers=4, heads=4, context=128):
        self.t, self.F = torch, torch.nn.functional
        self.w = {k: torch.from_numpy(v) for k, v in w.items()}
        self.layers, self.heads, self.context = layers, heads, context
        d = self.w["wte"].shape[1]
        self.d, self.hd = d, d // heads
        self.k = [torch.zeros(1, heads, context, self.hd) for _ in range(layers)]
        self.v = [torch.zeros(1, heads, context, self.hd) for _ in range(layers)]

    def forward(self, tokens, start):
        """Logits of tokens [1, n] at positions start..start+n-1, writing their k, v into the caches."""
        t, F, w = self.t, self.F, self.w
        n = tokens.shape[1]
        x = w["wte"][tokens] + w["wpe"][start:start + n]
        for i in range(self.layers):
            p = lambda name: w[f"blocks.{i}.{name}"]
            h = F.layer_norm(x, (self.d,), p("ln1_g"), p("ln1_b"), 1e-5)
            qkv = (h @ p("w_qkv")).view(1, n, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            self.k[i][:, :, start:start + n] = k
            self.v[i][:, :, start:start + n] = v
            kc, vc = self.k[i][:, :, :start + n], self.v[i][:, :, :start + n]
            if n == 1:
                y = F.scaled_dot_product_attention(q, kc, vc)
            else:
                y = F.scaled_dot_product_attention(q, kc, vc, is_causal=True)
            x = x + y.transpose(1, 2).reshape(1, n, self.d) @ p("w_proj")
            h = F.layer_norm(x, (self.d,), p("ln2_g"), p("ln2_b"), 1e-5)
            x = x + F.gelu(h @ p("w_fc"), approximate="tanh") @ p("w_out")
        x = F.layer_norm(x, (self.d,), w["lnf_g"], w["lnf_b"], 1e-5)
        return x @ w["wte"].T


def torch_decode(torch, w, tokens, compiled):
    model = TorchGPT(torch, w)
    step = model.forward
    if compiled:
        step = torch.compile(model.forward, dynamic=True)
    prompt = torch.tensor([list(PROMPT.encode())])
    with torch.inference_mode():
        logits = model.forward(prompt, 0)
        out = [int(logits[0, -1].argmax())]
        pos = prompt.shape[1]
        t0 = time.perf_counter()
        for _ in range(tokens - 1):
            logits = step(torch.tensor([[out[-1]]]), pos)
            out.append(int(logits[0, -1].argmax()))
            pos += 1
        seconds = time.perf_counter() - t0
    return out, (tokens - 1) / seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--napkin", default=os.path.join(ROOT, "build/tools/napkin"))
    ap.add_argument("--checkpoint", default="")
    ap.add_argument("--tokens", type=int, default=100, help="tokens to generate (prompt + tokens <= 128: no window)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--agree", type=int, default=20)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    if len(PROMPT) + a.tokens > 128:
        sys.exit("--tokens: the prompt and the tokens must fit the context of 128 (no re-prefill on either side)")
    check = subprocess.run([sys.executable, os.path.join(HERE, "peers/check.py"), "--threads", str(a.threads),
                            "--only", "torch"])
    if check.returncode != 0:
        sys.exit("PyTorch is not fit to be timed here (bench/peers/check.py)")
    import torch
    torch.set_num_threads(a.threads)

    tmp = tempfile.mkdtemp(prefix="napkin-decode-")
    checkpoint = a.checkpoint
    if not checkpoint:
        r = subprocess.run([a.napkin, "train", "models/gpt.yaml", "--", "--steps", "0", "--checkpoint-dir", tmp,
                            "--quiet"], cwd=ROOT, capture_output=True)
        if r.returncode != 0:
            sys.exit("napkin could not write the initial weights:\n" + r.stdout.decode() + r.stderr.decode())
        checkpoint = os.path.join(tmp, sorted(f for f in os.listdir(tmp) if f.endswith(".safetensors"))[-1])
    w = read_safetensors(checkpoint)

    # Correctness: the same greedy tokens.
    ours, _, predicted = napkin_sample(a.napkin, checkpoint, a.tokens, a.threads)
    theirs, _ = torch_decode(torch, w, a.tokens, False)
    agree = next((i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y), min(len(ours), len(theirs)))
    print(f"greedy tokens: napkin and torch agree on the first {agree} of {a.tokens}")
    if agree < min(a.agree, a.tokens):
        sys.exit(f"napkin's and torch's greedy tokens differ at token {agree}: not the same model; nothing timed")

    sides = {"napkin": [], "torch eager": []}
    if a.compile:
        sides["torch.compile"] = []
    for _ in range(a.rounds):
        sides["napkin"].append(napkin_sample(a.napkin, checkpoint, a.tokens, a.threads)[1])
        sides["torch eager"].append(torch_decode(torch, w, a.tokens, False)[1])
        if a.compile:
            torch_decode(torch, w, a.tokens, True)  # compile first
            sides["torch.compile"].append(torch_decode(torch, w, a.tokens, True)[1])
    best = {k: max(v) for k, v in sides.items()}
    print(f"\ndecode of gpt.yaml (batch 1, context 128, fp32), {a.threads} threads, best of {a.rounds} rounds,"
          f" torch {torch.__version__}")
    print(f"{'side':<16}{'tok/s':>10}{'ms/token':>10}{'napkin / side':>15}")
    for k, v in best.items():
        print(f"{k:<16}{v:>10.1f}{1e3 / v:>10.3f}{best['napkin'] / v:>14.2f}x")
    if predicted:
        print(f"napkin's roofline prediction: {predicted:.0f} tok/s (measured {100 * best['napkin'] / predicted:.0f}% of it)")


if __name__ == "__main__":
    main()
