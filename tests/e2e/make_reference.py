#!/usr/bin/python3
"""Reference loss curves for napkin's end-to-end trainer tests, from PyTorch.

Regenerate (needs /usr/bin/python3 with torch 1.13 and numpy, and git, because
the GPT's training text is read from a pinned commit of this repository):

    /usr/bin/python3 tests/e2e/make_reference.py            # writes tests/e2e/data/**
    /usr/bin/python3 tests/e2e/make_reference.py --check    # regenerates in memory, compares with the files

The output is committed, so CI never needs PyTorch. Rerunning gives
byte-identical files (fixed seeds, torch.set_num_threads(1), fixed text, fixed
JSON formatting); `--check` verifies that.

What it writes, per model, under tests/e2e/data/<model>/:

  mlp  (models/mlp.yaml --dims batch=16,d_in=64,hidden=32; classes 10)
    images.npy       f32 [256, 64]   standard normal rows
    labels.npy       i32 [256]       argmax of a fixed random two-layer teacher (learnable)
    init.safetensors the six parameters, drawn as the YAML's inits say (xavier: N(0, 1/fan_in)
                     truncated at +-3 std; zeros)
  gpt  (models/gpt.yaml --dims batch=4,seq=32,d=64,heads=4,layers=2; vocab 256, head_dim 16, hidden 256)
    tokens.u16       16,384 byte tokens (raw little-endian u16): the first 16 KiB of
                     README.md + docs/training.md + docs/autodiff.md at commit TEXT_COMMIT
    init.safetensors every parameter by napkin's name (wte, wpe, lnf_g, lnf_b, blocks.N.*),
                     normal(std) / ones / zeros as in the YAML (w_proj, w_out: 0.02/sqrt(2*layers) = 0.01)
  expected.json      {"model", "dims", "steps", "losses" (float32 torch), "losses_f64" (the same run
                     in float64 from the same f32 initial values), "trainer_args", "grad_norms"
                     (pre-clip global norms: gpt's are all > 1, so clipping acts at every step), ...}

The PyTorch run is the model exactly as napkin defines it (frontend defaults,
docs/model-language.md; interpreter kernels, interp/nn_kernels.cpp):
  - layernorm: biased variance over the last axis, eps 1e-5 inside the sqrt (F.layer_norm);
  - gelu: the tanh approximation (napkin's default; torch's default is erf);
  - attention: scores = q k^T / sqrt(head_dim), -inf above the diagonal, softmax over the last axis;
    qkv split as "b s (three h hd) -> three b h s hd", heads merged back as "b h s hd -> b s (h hd)";
  - logits tied to wte ("b s d, v d -> b s v"); cross_entropy is the mean over all positions;
  - AdamW as passes/optimizer.cpp (= torch.optim.AdamW): p *= 1 - lr*wd, then Adam with bias
    corrections; wd = 0 for parameters matching a no_decay glob (napkin's glob: '*' any run of
    characters, dots included; '?' one character; matched against the full name);
  - gpt: grad_clip 1.0 = torch.nn.utils.clip_grad_norm_(all params, 1.0) before the step;
  - lr schedule constant (neither YAML sets one);
  - data in sequential order, the trainer's rule:
      tokens: window p = step_index*batch + row (both from 0) starts at (p mod W)*seq, with
              W = (n_train - 1) // seq and n_train = floor(split * n_tokens), split 0.9 (gpt.yaml);
              tokens = window[0:seq], targets = window[1:seq+1];
      npy:    row b of step_index i is row (i*batch + b) mod N.
  - losses[s-1] is the loss of step s's forward pass, before that step's update.
"""
import argparse
import hashlib
import io
import json
import math
import os
import re
import struct
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "e2e", "data")
REL_DATA = "tests/e2e/data"  # paths in trainer_args are relative to the repository root

STEPS = 50
# The GPT's text: these files at this commit (so edits to the docs do not change the reference).
TEXT_COMMIT = "d43dae22c1c2f1e3a70a651d651b57d0cb2e3642"
TEXT_FILES = ["README.md", "docs/training.md", "docs/autodiff.md"]
N_TOKENS = 16384


# ---------------------------------------------------------------------------
# File formats, by hand
# ---------------------------------------------------------------------------

def safetensors_bytes(tensors, metadata):
    """tensors: list of (name, np.float32 array) in file order."""
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, a in tensors:
        a = np.ascontiguousarray(a, dtype="<f4")
        raw = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def read_safetensors(blob):
    """Returns {name: np.float32 array} (F32 only); the inverse of safetensors_bytes."""
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(blob[8 + n + b:8 + n + e], dtype="<f4").reshape(info["shape"])
    return out


def npy_bytes(a):
    f = io.BytesIO()
    np.save(f, a, allow_pickle=False)
    return f.getvalue()


# ---------------------------------------------------------------------------
# napkin semantics
# ---------------------------------------------------------------------------

def glob_match(pattern, name):
    """passes/optimizer.cpp glob_match: '*' any run (dots included), '?' one character."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, name, flags=re.DOTALL) is not None


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def init_normal(gen, shape, std):
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * std).numpy()


def init_xavier(gen, shape):
    """napkin's xavier: N(0, std^2), std = 1/sqrt(fan_in), truncated at +-3 std (by resampling)."""
    fan_in = math.prod(shape[:-1])
    std = 1.0 / math.sqrt(fan_in)
    t = torch.randn(shape, generator=gen, dtype=torch.float32)
    while True:
        bad = t.abs() > 3.0
        k = int(bad.sum())
        if k == 0:
            break
        t[bad] = torch.randn(k, generator=gen, dtype=torch.float32)
    return (t * std).numpy()


def train(init, loss_fn, batch_fn, opt, dtype):
    """The reference loop. init: [(name, f32 array)]; loss_fn(params, inputs) -> scalar;
    batch_fn(step_index) -> inputs; opt: dict of the YAML's adamw options. Returns the losses."""
    params = {n: torch.tensor(a, dtype=dtype).requires_grad_(True) for n, a in init}
    decay = [p for n, p in params.items() if not any(glob_match(g, n) for g in opt["no_decay"])]
    no_decay = [p for n, p in params.items() if any(glob_match(g, n) for g in opt["no_decay"])]
    groups = [{"params": decay, "weight_decay": opt["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=opt["lr"], betas=opt["betas"], eps=opt["eps"], foreach=False)
    losses, norms = [], []
    for i in range(STEPS):
        loss = loss_fn(params, batch_fn(i, dtype))
        losses.append(float(loss.item()))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad)
                                                                 for p in params.values()]))))
        if opt["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), opt["grad_clip"])
        optimizer.step()
    return losses, norms


# ---------------------------------------------------------------------------
# mlp
# ---------------------------------------------------------------------------

MLP_DIMS = {"batch": 16, "d_in": 64, "hidden": 32}  # --dims; classes stays 10
MLP_ROWS = 256
MLP_OPT = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01, "no_decay": ["b*"], "grad_clip": 0.0}


def make_mlp():
    B, I, H = (MLP_DIMS[k] for k in ("batch", "d_in", "hidden"))
    C = 10  # classes, as in models/mlp.yaml
    gen = torch.Generator().manual_seed(1234)
    images = torch.randn(MLP_ROWS, I, generator=gen, dtype=torch.float32)
    t1 = torch.randn(I, 48, generator=gen, dtype=torch.float64) / math.sqrt(I)
    t2 = torch.randn(48, C, generator=gen, dtype=torch.float64)
    labels = torch.argmax(torch.tanh(images.double() @ t1) @ t2, dim=1).to(torch.int32)
    images, labels = images.numpy(), labels.numpy()

    gen = torch.Generator().manual_seed(0)
    init = []
    for name, shape, kind in [("w1", (I, H), "xavier"), ("b1", (H,), "zeros"), ("w2", (H, H), "xavier"),
                              ("b2", (H,), "zeros"), ("w3", (H, C), "xavier"), ("b3", (C,), "zeros")]:
        init.append((name, init_xavier(gen, shape) if kind == "xavier" else np.zeros(shape, np.float32)))

    def batch(i, dtype):
        rows = [(i * B + b) % MLP_ROWS for b in range(B)]
        return torch.tensor(images[rows], dtype=dtype), torch.tensor(labels[rows], dtype=torch.long)

    def loss_fn(p, inputs):
        x, y = inputs
        h1 = gelu_tanh(x @ p["w1"] + p["b1"])
        h2 = gelu_tanh(h1 @ p["w2"] + p["b2"])
        logits = h2 @ p["w3"] + p["b3"]
        return F.cross_entropy(logits, y)

    files = {"images.npy": npy_bytes(images.astype("<f4")), "labels.npy": npy_bytes(labels.astype("<i4"))}
    args = ["--data-file", f"images={REL_DATA}/mlp/images.npy",
            "--data-file", f"labels={REL_DATA}/mlp/labels.npy"]
    data_note = (f"npy, {MLP_ROWS} rows; row b of step_index i is row (i*{B} + b) mod {MLP_ROWS}; labels = argmax of "
                 "a fixed random tanh teacher")
    return "mlp", "models/mlp.yaml", MLP_DIMS, init, loss_fn, batch, MLP_OPT, files, args, data_note


# ---------------------------------------------------------------------------
# gpt
# ---------------------------------------------------------------------------

GPT_DIMS = {"batch": 4, "seq": 32, "d": 64, "heads": 4, "layers": 2}
GPT_SPLIT = 0.9
GPT_OPT = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1,
           "no_decay": ["*_g", "*_b", "wpe"], "grad_clip": 1.0}


def gpt_text():
    parts = []
    for path in TEXT_FILES:
        try:
            parts.append(subprocess.run(["git", "-C", ROOT, "show", f"{TEXT_COMMIT}:{path}"], check=True,
                                        capture_output=True).stdout)
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit(f"make_reference.py: cannot read {path} at commit {TEXT_COMMIT} with git ({e}); "
                     "the GPT's token file is made from that commit's text")
    text = b"".join(parts)
    if len(text) < N_TOKENS:
        sys.exit(f"make_reference.py: only {len(text)} bytes of text, need {N_TOKENS}")
    return text[:N_TOKENS]


def make_gpt():
    B, T, D, H, L = (GPT_DIMS[k] for k in ("batch", "seq", "d", "heads", "layers"))
    V, HD, FF = 256, D // H, 4 * D
    tokens = np.frombuffer(gpt_text(), dtype=np.uint8).astype("<u2")
    n_train = int(math.floor(GPT_SPLIT * len(tokens)))
    W = (n_train - 1) // T
    assert STEPS * B <= W, "the reference should not wrap around the training split"

    gen = torch.Generator().manual_seed(0)
    init = [("wte", init_normal(gen, (V, D), 0.02)), ("wpe", init_normal(gen, (T, D), 0.02)),
            ("lnf_g", np.ones(D, np.float32)), ("lnf_b", np.zeros(D, np.float32))]
    small = 0.02 / math.sqrt(2 * L)
    for i in range(L):
        init += [(f"blocks.{i}.ln1_g", np.ones(D, np.float32)), (f"blocks.{i}.ln1_b", np.zeros(D, np.float32)),
                 (f"blocks.{i}.w_qkv", init_normal(gen, (D, 3 * D), 0.02)),
                 (f"blocks.{i}.w_proj", init_normal(gen, (D, D), small)),
                 (f"blocks.{i}.ln2_g", np.ones(D, np.float32)), (f"blocks.{i}.ln2_b", np.zeros(D, np.float32)),
                 (f"blocks.{i}.w_fc", init_normal(gen, (D, FF), 0.02)),
                 (f"blocks.{i}.w_out", init_normal(gen, (FF, D), small))]

    def batch(i, dtype):
        xs, ys = [], []
        for b in range(B):
            start = ((i * B + b) % W) * T
            xs.append(tokens[start:start + T])
            ys.append(tokens[start + 1:start + T + 1])
        return (torch.tensor(np.stack(xs).astype(np.int64)), torch.tensor(np.stack(ys).astype(np.int64)))

    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)

    def loss_fn(p, inputs):
        tok, tgt = inputs
        x = p["wte"][tok] + p["wpe"][torch.arange(T)]
        for i in range(L):
            q = lambda n: p[f"blocks.{i}.{n}"]
            qkv = F.layer_norm(x, (D,), q("ln1_g"), q("ln1_b"), eps=1e-5) @ q("w_qkv")
            qh, kh, vh = qkv.view(B, T, 3, H, HD).permute(2, 0, 3, 1, 4).unbind(0)
            scores = (qh @ kh.transpose(-1, -2)) / math.sqrt(HD)
            att = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
            y = (att @ vh).permute(0, 2, 1, 3).reshape(B, T, D)
            x = x + y @ q("w_proj")
            h = gelu_tanh(F.layer_norm(x, (D,), q("ln2_g"), q("ln2_b"), eps=1e-5) @ q("w_fc"))
            x = x + h @ q("w_out")
        logits = F.layer_norm(x, (D,), p["lnf_g"], p["lnf_b"], eps=1e-5) @ p["wte"].t()
        return F.cross_entropy(logits.reshape(B * T, V), tgt.reshape(B * T))

    files = {"tokens.u16": tokens.astype("<u2").tobytes()}
    args = ["--data", f"{REL_DATA}/gpt/tokens.u16"]
    data_note = (f"tokens.u16: {len(tokens)} byte tokens of {', '.join(TEXT_FILES)} at commit {TEXT_COMMIT[:12]}; "
                 f"split {GPT_SPLIT}: n_train {n_train}, W = (n_train - 1) // {T} = {W} windows; window p = "
                 f"step_index*{B} + row starts at (p mod W)*{T}; tokens = window[0:{T}], targets = window[1:{T + 1}]")
    return "gpt", "models/gpt.yaml", GPT_DIMS, init, loss_fn, batch, GPT_OPT, files, args, data_note


# ---------------------------------------------------------------------------

def build(make):
    name, model, dims, init, loss_fn, batch, opt, files, data_args, data_note = make()
    losses, norms = train(init, loss_fn, batch, opt, torch.float32)
    losses64, _ = train(init, loss_fn, batch, opt, torch.float64)
    dims_s = ",".join(f"{k}={v}" for k, v in dims.items())
    init_rel = f"{REL_DATA}/{name}/init.safetensors"
    files["init.safetensors"] = safetensors_bytes(init, {"generator": "tests/e2e/make_reference.py",
                                                         "model": model, "dims": dims_s})
    expected = {
        "model": model,
        "dims": dims_s,
        "steps": STEPS,
        "trainer_args": ["--steps", str(STEPS), "--seed", "0", *data_args, "--order", "sequential",
                         "--init", init_rel, "--log-every", "1"],
        "build_command": f"build/tools/napkin build {model} --dims {dims_s} -o TRAINER",
        "paths": "trainer_args paths are relative to the repository root",
        "data": data_note,
        "optimizer": {k: (list(v) if isinstance(v, tuple) else v) for k, v in opt.items()},
        "losses": losses,
        "losses_f64": losses64,
        "grad_norms": norms,
        "grad_norms_note": "global L2 norm of all gradients of each step, before clipping (float32 run)",
        "max_abs_diff_f32_vs_f64": max(abs(a - b) for a, b in zip(losses, losses64)),
        "max_rel_diff_f32_vs_f64": max(abs(a - b) / abs(b) for a, b in zip(losses, losses64)),
        "reference": f"torch {torch.__version__} CPU, 1 thread, float32 (losses) and float64 (losses_f64), "
                     "tests/e2e/make_reference.py",
        "files": {f: hashlib.sha256(b).hexdigest() for f, b in sorted(files.items())},
    }
    files["expected.json"] = (json.dumps(expected, indent=1) + "\n").encode()
    return name, files


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="regenerate in memory and compare with the files on disk")
    ap.add_argument("--only", choices=["mlp", "gpt"], help="one model")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    status = 0
    for make in (make_mlp, make_gpt):
        if args.only and make.__name__ != f"make_{args.only}":
            continue
        name, files = build(make)
        out_dir = os.path.join(DATA, name)
        exp = json.loads(files["expected.json"])
        print(f"{name}: losses {exp['losses'][0]:.6f} -> {exp['losses'][-1]:.6f} (f64 {exp['losses_f64'][0]:.6f} -> "
              f"{exp['losses_f64'][-1]:.6f}; max |f32 - f64| {exp['max_abs_diff_f32_vs_f64']:.3g})")
        for fname, blob in sorted(files.items()):
            path = os.path.join(out_dir, fname)
            if args.check:
                same = os.path.exists(path) and open(path, "rb").read() == blob
                print(f"  {'same' if same else 'DIFFERENT'}  {os.path.relpath(path, ROOT)}")
                status |= 0 if same else 1
            else:
                os.makedirs(out_dir, exist_ok=True)
                with open(path, "wb") as f:
                    f.write(blob)
                print(f"  wrote {os.path.relpath(path, ROOT)} ({len(blob):,} bytes)")
    return status


if __name__ == "__main__":
    sys.exit(main())
