#!/usr/bin/python3
"""Training step time: napkin's generated trainer vs PyTorch (1.13 eager, or 2 with torch.compile), on this CPU.

For each model (cruncher, mlp, gpt at their YAML sizes, fp32 or bf16-mixed) the script

  napkin: builds the trainer (`napkin build models/X.yaml -o TMP/X`), writes
          random data files in a temp dir (npy per input, or a u16 token file),
          runs WARMUP + STEPS steps with `--order sequential --log-every 1
          --metrics TMP/X.jsonl --threads T --quiet`, and takes the median
          `step_ms` of the steps after the warmup;
  torch:  builds the same model by hand (same shapes, same math: tanh gelu,
          layernorm eps 1e-5, causal attention through the full T x T scores,
          tied logits, AdamW/Adagrad with the YAML's options, no_decay groups,
          clip_grad_norm_ where the YAML has grad_clip), torch.set_num_threads(T),
          and times each full step with time.perf_counter(): zero_grad
          (set_to_none), forward, backward, clipping, optimizer.step. The
          optimizer's foreach=True and foreach=False are both timed and the
          faster one is reported (torch 1.13 has `foreach` on AdamW and Adagrad;
          it has no F.scaled_dot_product_attention, so attention is
          matmul + masked_fill + softmax).

Before timing, the same computation is checked: the trainer saves its
initial weights (--steps 0), torch loads them, and torch's first two losses
(before and after one update) on the same batches must be napkin's within
1e-4 relative (fp32) or 2e-2 (bf16-mixed); a model that differs is an
error and is not timed.

The two sides alternate (--rounds, default 2: napkin, torch, napkin, torch)
so that both see the same background load, and each side's time is its best
median over the rounds. The script prints the step times, the ratio torch/napkin (> 1: napkin is
faster), and the achieved GFLOP/s of each, computed from napkin's static
FLOPs per step (`napkin report MODEL --json`, key flops.total, the same count
for both) over the median step time, against the CPU's GEMM peak (--peak,
GFLOP/s, default 350). Targets: napkin >= 1.2x torch on cruncher and mlp,
>= 2x on gpt; each row says PASS or MISS.

--precision bf16-mixed: napkin builds a temp copy of the model YAML with
`precision: bf16-mixed` (the mixed-precision pass casts matmul inputs to bf16,
fp32 accumulation) and the trainer must then run bf16 matmuls (checked in its
--print-program; a trainer without any is reported as an error, not timed as
if it were bf16); torch runs the forward under torch.autocast("cpu",
dtype=torch.bfloat16) (backward and optimizer outside it, as the autocast docs
prescribe), fp32 master weights on both sides. Target: napkin at least as fast
as torch (>= 1.0x) on every model. --peak stays the fp32 peak.

--compile (PyTorch 2, the venv bench/peers/setup.sh makes: run this script
with its python): torch.compile (inductor) on the loss function, whose
backward AOTAutograd compiles too, and on the update (clipping and
optimizer.step); each row prints the first step's seconds, compilation
included. Before anything is timed the torch side is checked as
bench/peers/check.py checks it (a real BLAS, --threads threads) and
refused otherwise (exit 2).

Exit status: 0 when every target is met; 1 when one is missed or napkin's
trainer could not be built or run (the reason is printed, and the torch half
still runs); 2 on a usage error.

Usage: bench/train_vs_torch.py [--napkin build/tools/napkin] [--steps 30] [--warmup 5]
                               [--threads 2] [--rounds 2] [--peak 350] [--only cruncher,mlp,gpt]
                               [--precision fp32|bf16-mixed] [--torch-only] [--compile] [--keep]
"""
import argparse
import fnmatch
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (YAML, target ratio torch/napkin)
MODELS = {
    "cruncher": ("models/cruncher.yaml", 1.2),
    "mlp": ("models/mlp.yaml", 1.2),
    "gpt": ("models/gpt.yaml", 2.0),
}
# Models bench/train_vs_peers.py times besides MODELS (this script's default list): name -> (YAML, target).
LLAMA = {"llama": ("models/llama.yaml", 1.2), "moe": ("models/moe.yaml", 1.2)}
DIMS = {  # the YAMLs' own dims (no --dims: the trainers are built as the files are)
    "cruncher": {"batch": 256, "d": 1024, "layers": 4},
    "mlp": {"batch": 512, "d_in": 784, "hidden": 1024, "classes": 10},
    "gpt": {"batch": 16, "seq": 128, "vocab": 256, "d": 256, "heads": 4, "layers": 4},
    # gpt.yaml built with --dims (GPT_VARIANTS): wider and longer, head_dim 64 as in GPT-2
    "gpt-d512": {"batch": 8, "seq": 256, "vocab": 256, "d": 512, "heads": 8, "layers": 4},
    "llama": {"batch": 8, "seq": 256, "vocab": 256, "d": 512, "heads": 16, "kv_heads": 16, "hidden": 1344,
              "layers": 4, "rope_theta": 10000},
    "moe": {"batch": 4, "seq": 256, "vocab": 256, "d": 256, "heads": 8, "kv_heads": 4, "experts": 8, "top_k": 2,
            "expert_hidden": 512, "capacity_percent": 125, "layers": 4, "rope_theta": 10000},
}
# Variants of a YAML at other sizes: name -> (YAML, napkin --dims). Not in MODELS (this script's default
# list); bench/train_vs_peers.py times them.
GPT_VARIANTS = {"gpt-d512": ("models/gpt.yaml", "batch=8,seq=256,d=512,heads=8")}


def kind(name):
    """The model family a name builds: gpt-d512 is a gpt."""
    return "gpt" if name.startswith("gpt") else name


def napkin_dims(name):
    """napkin's --dims for a variant, or None (the YAML's own sizes)."""
    return GPT_VARIANTS[name][1] if name in GPT_VARIANTS else None
TARGETS_BF16 = {"cruncher": 1.0, "mlp": 1.0, "gpt": 1.0}  # --precision bf16-mixed: at least torch's autocast speed
DATA_BATCHES = 8  # random data: this many batches' worth of rows (sequential order cycles through them)


def glob_match(pattern, name):  # napkin's no_decay glob: '*' any run (dots included), '?' one character
    return fnmatch.fnmatchcase(name, pattern.replace("[", "[[]"))


# ---------------------------------------------------------------------------
# Random data files for napkin and the same batches for torch
# ---------------------------------------------------------------------------

def make_data(name, tmp, rng):
    """Writes the data files; returns (trainer flags, torch batches: list of input tuples)."""
    dm = DIMS[name]
    if kind(name) == "cruncher":
        n = dm["batch"] * DATA_BATCHES
        x = rng.standard_normal((n, dm["d"]), dtype=np.float32)
        y = rng.standard_normal(n, dtype=np.float32)
        np.save(os.path.join(tmp, "x.npy"), x)
        np.save(os.path.join(tmp, "y.npy"), y)
        flags = ["--data-file", f"x={tmp}/x.npy", "--data-file", f"y={tmp}/y.npy"]
        b = dm["batch"]
        batches = [(torch.from_numpy(x[i * b:(i + 1) * b]), torch.from_numpy(y[i * b:(i + 1) * b]))
                   for i in range(DATA_BATCHES)]
        return flags, batches
    if kind(name) == "mlp":
        n = dm["batch"] * DATA_BATCHES
        images = rng.standard_normal((n, dm["d_in"]), dtype=np.float32)
        labels = rng.integers(0, dm["classes"], n, dtype=np.int32)
        np.save(os.path.join(tmp, "images.npy"), images)
        np.save(os.path.join(tmp, "labels.npy"), labels)
        flags = ["--data-file", f"images={tmp}/images.npy", "--data-file", f"labels={tmp}/labels.npy"]
        b = dm["batch"]
        batches = [(torch.from_numpy(images[i * b:(i + 1) * b]), torch.from_numpy(labels[i * b:(i + 1) * b]).long())
                   for i in range(DATA_BATCHES)]
        return flags, batches
    if kind(name) in ("gpt", "llama", "moe"):
        b, t = dm["batch"], dm["seq"]
        # enough tokens that the 0.9 training split holds DATA_BATCHES batches of windows
        n = int(math.ceil((b * t * DATA_BATCHES + t + 1) / 0.9)) + t
        tokens = rng.integers(0, dm["vocab"], n, dtype=np.uint16)
        tokens.astype("<u2").tofile(os.path.join(tmp, "tokens.u16"))
        flags = ["--data", f"{tmp}/tokens.u16"]
        tok = torch.from_numpy(tokens.astype(np.int64))
        batches = []
        for i in range(DATA_BATCHES):
            rows = [tok[(i * b + r) * t:(i * b + r) * t + t + 1] for r in range(b)]
            w = torch.stack(rows)
            batches.append((w[:, :t].contiguous(), w[:, 1:].contiguous()))
        return flags, batches
    raise ValueError(name)


# ---------------------------------------------------------------------------
# The models in PyTorch eager, the fastest straightforward formulation
# ---------------------------------------------------------------------------

def xavier(shape):  # napkin's xavier: N(0, 1/fan_in) truncated at 3 std
    t = torch.empty(shape)
    torch.nn.init.trunc_normal_(t, std=1.0, a=-3.0, b=3.0)
    return (t / math.sqrt(math.prod(shape[:-1]))).requires_grad_(True)


def normal(shape, std):
    return (torch.randn(shape) * std).requires_grad_(True)


class Cruncher:
    def __init__(self, name="cruncher"):
        dm = DIMS[name]
        self.params = {"final": xavier((dm["d"], 1))}
        for i in range(dm["layers"]):
            self.params[f"layers.{i}.w"] = xavier((dm["d"], dm["d"]))
        self.ws = [self.params[f"layers.{i}.w"] for i in range(dm["layers"])]

    def loss(self, x, y):
        for w in self.ws:
            x = x @ w
        return F.mse_loss((x @ self.params["final"]).view(-1), y)

    def optimizer(self, foreach):  # adagrad(lr=0.01), eps 1e-10 (torch's default too)
        return torch.optim.Adagrad(list(self.params.values()), lr=0.01, eps=1e-10, foreach=foreach), 0.0


class MLP:
    def __init__(self, name="mlp"):
        dm = DIMS[name]
        I, H, C = dm["d_in"], dm["hidden"], dm["classes"]
        self.params = {"w1": xavier((I, H)), "b1": torch.zeros(H, requires_grad=True),
                       "w2": xavier((H, H)), "b2": torch.zeros(H, requires_grad=True),
                       "w3": xavier((H, C)), "b3": torch.zeros(C, requires_grad=True)}

    def loss(self, images, labels):
        p = self.params
        # addmm (bias fused into the GEMM) is what a torch user gets from nn.Linear; same math as `@ w + b`
        h1 = F.gelu(torch.addmm(p["b1"], images, p["w1"]), approximate="tanh")
        h2 = F.gelu(torch.addmm(p["b2"], h1, p["w2"]), approximate="tanh")
        return F.cross_entropy(torch.addmm(p["b3"], h2, p["w3"]), labels)

    def optimizer(self, foreach):  # adamw(lr=1e-3, weight_decay=0.01, no_decay=["b*"])
        return adamw(self.params, lr=1e-3, betas=(0.9, 0.999), wd=0.01, no_decay=["b*"], foreach=foreach), 0.0


class GPT:
    def __init__(self, name="gpt"):
        dm = DIMS[name]
        self.B, self.T, self.V, self.D, self.H, self.L = (dm[k] for k in ("batch", "seq", "vocab", "d", "heads", "layers"))
        D, T, V, L = self.D, self.T, self.V, self.L
        self.HD = D // self.H
        small = 0.02 / math.sqrt(2 * L)
        p = {"wte": normal((V, D), 0.02), "wpe": normal((T, D), 0.02),
             "lnf_g": torch.ones(D, requires_grad=True), "lnf_b": torch.zeros(D, requires_grad=True)}
        for i in range(L):
            p.update({f"blocks.{i}.ln1_g": torch.ones(D, requires_grad=True),
                      f"blocks.{i}.ln1_b": torch.zeros(D, requires_grad=True),
                      f"blocks.{i}.w_qkv": normal((D, 3 * D), 0.02),
                      f"blocks.{i}.w_proj": normal((D, D), small),
                      f"blocks.{i}.ln2_g": torch.ones(D, requires_grad=True),
                      f"blocks.{i}.ln2_b": torch.zeros(D, requires_grad=True),
                      f"blocks.{i}.w_fc": normal((D, 4 * D), 0.02),
                      f"blocks.{i}.w_out": normal((4 * D, D), small)})
        self.params = p
        self.blocks = [[p[f"blocks.{i}.{n}"] for n in ("ln1_g", "ln1_b", "w_qkv", "w_proj", "ln2_g", "ln2_b",
                                                       "w_fc", "w_out")] for i in range(L)]
        self.mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        self.pos = torch.arange(T)

    def loss(self, tokens, targets):
        B, T, D, H, HD, V = self.B, self.T, self.D, self.H, self.HD, self.V
        p = self.params
        x = F.embedding(tokens, p["wte"]) + F.embedding(self.pos, p["wpe"])   # [B, T, D]
        x = x.view(B * T, D)
        scale = 1.0 / math.sqrt(HD)
        for ln1_g, ln1_b, w_qkv, w_proj, ln2_g, ln2_b, w_fc, w_out in self.blocks:
            qkv = F.layer_norm(x, (D,), ln1_g, ln1_b, 1e-5) @ w_qkv              # [B*T, 3D], one GEMM
            q, k, v = qkv.view(B, T, 3, H, HD).permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, T, HD] views
            att = torch.matmul(q, k.transpose(-1, -2)) * scale
            att = torch.softmax(att.masked_fill_(self.mask, float("-inf")), dim=-1)
            y = torch.matmul(att, v).transpose(1, 2).reshape(B * T, D)
            x = x + y @ w_proj
            h = F.gelu(F.layer_norm(x, (D,), ln2_g, ln2_b, 1e-5) @ w_fc, approximate="tanh")
            x = x + h @ w_out
        logits = F.layer_norm(x, (D,), p["lnf_g"], p["lnf_b"], 1e-5) @ p["wte"].t()  # tied, [B*T, V]
        return F.cross_entropy(logits, targets.view(-1))

    def optimizer(self, foreach):
        # adamw(lr=3e-4, betas=[0.9, 0.95], weight_decay=0.1, grad_clip=1.0, no_decay=["*_g", "*_b", "wpe"])
        return adamw(self.params, lr=3e-4, betas=(0.9, 0.95), wd=0.1, no_decay=["*_g", "*_b", "wpe"],
                     foreach=foreach), 1.0


def adamw(params, lr, betas, wd, no_decay, foreach):
    decay = [p for n, p in params.items() if not any(glob_match(g, n) for g in no_decay)]
    nod = [p for n, p in params.items() if any(glob_match(g, n) for g in no_decay)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": nod, "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=1e-8, foreach=foreach)


class Llama:
    """models/llama.yaml: RMSNorm, rotary q and k (transformers' rotate_half), grouped-query attention through
    scaled_dot_product_attention, a SwiGLU MLP, weights stored [out, in] as the YAML (and transformers) store them,
    an untied head."""

    def __init__(self, name="llama"):
        dm = self.shared_dims(name)
        self.F = dm["hidden"]
        D, F_ = self.D, self.F
        p = self.embedding_params()
        for i in range(self.L):
            p.update(self.attention_params(i))
            p.update({f"layers.{i}.mlp_norm": torch.ones(D, requires_grad=True),
                      f"layers.{i}.w_gate": normal((F_, D), 0.02),
                      f"layers.{i}.w_up": normal((F_, D), 0.02),
                      f"layers.{i}.w_down": normal((D, F_), self.small)})
        self.params = p
        self.blocks = [[p[f"layers.{i}.{n}"] for n in ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate",
                                                       "w_up", "w_down")] for i in range(self.L)]

    # What models/llama.yaml and models/moe.yaml (Moe) share: the dims, the embeddings and head, each layer's
    # attention, the rotary tables, the attention sublayer.
    def shared_dims(self, name):
        """Reads the attention's dims and makes the rotary tables; returns the model's DIMS."""
        dm = DIMS[name]
        self.B, self.T, self.V, self.D, self.H, self.KV, self.L = (
            dm[k] for k in ("batch", "seq", "vocab", "d", "heads", "kv_heads", "layers"))
        self.HD = self.D // self.H
        self.small = 0.02 / math.sqrt(2 * self.L)  # the residual projections' init
        inv_freq = 1.0 / (dm["rope_theta"] ** (torch.arange(0, self.HD, 2).float() / self.HD))
        angles = torch.outer(torch.arange(self.T).float(), inv_freq)
        emb = torch.cat([angles, angles], dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()  # [T, HD], once: as napkin's kernels do
        return dm

    def embedding_params(self):
        D, V = self.D, self.V
        return {"wte": normal((V, D), 0.02), "norm_g": torch.ones(D, requires_grad=True), "head": normal((V, D), 0.02)}

    def attention_params(self, i):
        D, H, KV, HD = self.D, self.H, self.KV, self.HD
        return {f"layers.{i}.attn_norm": torch.ones(D, requires_grad=True),
                f"layers.{i}.wq": normal((H * HD, D), 0.02),
                f"layers.{i}.wk": normal((KV * HD, D), 0.02),
                f"layers.{i}.wv": normal((KV * HD, D), 0.02),
                f"layers.{i}.wo": normal((D, H * HD), self.small)}

    def attend(self, x, attn_norm, wq, wk, wv, wo):
        """x plus the causal attention sublayer: RMSNorm, rotary q and k, grouped heads."""
        B, T, D, H, KV, HD = self.B, self.T, self.D, self.H, self.KV, self.HD
        h = F.rms_norm(x, (D,), attn_norm, 1e-5)
        q = self.rotate((h @ wq.t()).view(B, T, H, HD).transpose(1, 2))
        k = self.rotate((h @ wk.t()).view(B, T, KV, HD).transpose(1, 2))
        v = (h @ wv.t()).view(B, T, KV, HD).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=KV != H)
        return x + y.transpose(1, 2).reshape(B, T, D) @ wo.t()

    def rotate(self, x):  # x [B, H, T, HD]
        x1, x2 = x.chunk(2, dim=-1)
        return x * self.cos + torch.cat([-x2, x1], dim=-1) * self.sin

    def loss(self, tokens, targets):
        B, T, D, V = self.B, self.T, self.D, self.V
        p = self.params
        x = F.embedding(tokens, p["wte"])  # [B, T, D]
        for attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down in self.blocks:
            x = self.attend(x, attn_norm, wq, wk, wv, wo)
            h = F.rms_norm(x, (D,), mlp_norm, 1e-5)
            x = x + (F.silu(h @ w_gate.t()) * (h @ w_up.t())) @ w_down.t()
        logits = F.rms_norm(x, (D,), p["norm_g"], 1e-5) @ p["head"].t()
        return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))

    def optimizer(self, foreach):
        # models/llama.yaml: adamw(lr=3e-3, betas=[0.9, 0.95], weight_decay=0.1, grad_clip=1.0, no_decay=["*norm*"])
        return adamw(self.params, lr=3e-3, betas=(0.9, 0.95), wd=0.1, no_decay=["*norm*"], foreach=foreach), 1.0


def moe_layer(x, router, w_gate, w_up, w_down, k, capacity):
    """napkin's moe() (frontend/moe.cpp) in torch, at static shapes: softmax over the experts, the top k
    renormalised, slots filled choice-major (every token's first choice before any second) up to `capacity`
    per expert, the rest dropped; the experts as batched matmuls over [E, C, d]; a weighted gather back."""
    T, D = x.shape
    E = router.shape[0]
    probs = torch.softmax(x @ router.t(), dim=-1)
    top_v, top_i = probs.topk(k, dim=-1)
    weights = top_v / top_v.sum(-1, keepdim=True)
    choice = top_i.t().reshape(-1)  # [k*T], choice-major
    onehot = F.one_hot(choice, E)
    slot = ((onehot.cumsum(0) - 1) * onehot).sum(-1)
    kept = slot < capacity
    dest = torch.where(kept, choice * capacity + slot, torch.full_like(choice, E * capacity))
    token = torch.arange(T, device=x.device).repeat(k)
    xe = x.new_zeros(E * capacity + 1, D).index_copy(0, dest, x[token])[:-1].view(E, capacity, D)
    h = F.silu(torch.bmm(xe, w_gate.transpose(1, 2))) * torch.bmm(xe, w_up.transpose(1, 2))
    ye = torch.bmm(h, w_down.transpose(1, 2)).reshape(E * capacity, D)
    scale = (weights.t().reshape(-1) * kept).unsqueeze(-1)
    y = (ye[torch.where(kept, dest, torch.zeros_like(dest))] * scale).view(k, T, D).sum(0)
    return y, probs, onehot.sum(0)


class Moe(Llama):
    """models/moe.yaml: models/llama.yaml's attention with a mixture of SwiGLU experts for the MLP (moe_layer)
    and Switch's load-balancing loss pooled over the layers (transformers' load_balancing_loss_func)."""

    def __init__(self, name="moe"):
        dm = self.shared_dims(name)
        self.E, self.K, self.F = dm["experts"], dm["top_k"], dm["expert_hidden"]
        tokens = self.B * self.T
        self.C = min(tokens, math.ceil(dm["capacity_percent"] / 100 * tokens * self.K / self.E - 1e-9))
        D, E, F_ = self.D, self.E, self.F
        p = self.embedding_params()
        for i in range(self.L):
            p.update(self.attention_params(i))
            p.update({f"layers.{i}.moe_norm": torch.ones(D, requires_grad=True),
                      f"layers.{i}.router": normal((E, D), 0.02),
                      f"layers.{i}.w_gate": normal((E, F_, D), 0.02),
                      f"layers.{i}.w_up": normal((E, F_, D), 0.02),
                      f"layers.{i}.w_down": normal((E, D, F_), self.small)})
        self.params = p
        self.blocks = [[p[f"layers.{i}.{n}"] for n in ("attn_norm", "wq", "wk", "wv", "wo", "moe_norm", "router",
                                                       "w_gate", "w_up", "w_down")] for i in range(self.L)]

    def loss(self, tokens, targets):
        B, T, D, V = self.B, self.T, self.D, self.V
        p = self.params
        x = F.embedding(tokens, p["wte"])
        counts, probs_sum = 0, 0
        for attn_norm, wq, wk, wv, wo, moe_norm, router, w_gate, w_up, w_down in self.blocks:
            x = self.attend(x, attn_norm, wq, wk, wv, wo)
            h = F.rms_norm(x, (D,), moe_norm, 1e-5).reshape(B * T, D)
            m, probs, assigned = moe_layer(h, router, w_gate, w_up, w_down, self.K, self.C)
            x = x + m.view(B, T, D)
            counts, probs_sum = counts + assigned, probs_sum + probs.sum(0)
        logits = F.rms_norm(x, (D,), p["norm_g"], 1e-5) @ p["head"].t()
        rows = self.L * B * T
        balance = self.E * (counts.to(probs_sum.dtype) * probs_sum).sum() / (rows * rows)
        return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)) + 0.02 * balance

    def optimizer(self, foreach):
        # models/moe.yaml: adamw(lr=1e-3, betas=[0.9, 0.95], weight_decay=0.1, grad_clip=1.0,
        #                        no_decay=["*norm*", "*router*"])
        return adamw(self.params, lr=1e-3, betas=(0.9, 0.95), wd=0.1, no_decay=["*norm*", "*router*"],
                     foreach=foreach), 1.0


TORCH_MODELS = {"cruncher": Cruncher, "mlp": MLP, "gpt": GPT, "llama": Llama, "moe": Moe}


def read_safetensors(path):
    """name -> numpy array of a safetensors file (napkin's checkpoints; its optimizer state too)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}
    return {name: np.frombuffer(data[t["data_offsets"][0]:t["data_offsets"][1]], dtype=dtypes[t["dtype"]])
            .reshape(t["shape"]) for name, t in header.items() if name != "__metadata__"}


def napkin_start(trainer, name, tmp, data_flags):
    """napkin's initial weights (the trainer's --steps 0) and its first two losses on the sequential batches."""
    init = os.path.join(tmp, "init")
    run([trainer, "--steps", "0", "--seed", "0", "--checkpoint-dir", init, *data_flags, "--quiet"], "napkin --steps 0")
    metrics = os.path.join(tmp, f"{name}.start.jsonl")
    run([trainer, "--steps", "2", "--seed", "0", *data_flags, "--order", "sequential", "--log-every", "1",
         "--metrics", metrics, "--quiet", "--checkpoint-every", "0"], f"napkin trainer for {name}")
    losses = [json.loads(line)["loss"] for line in open(metrics) if '"loss"' in line]
    return read_safetensors(os.path.join(init, "step-000000.safetensors")), losses


def time_torch(name, batches, steps, warmup, foreach, precision="fp32", compile_=False, weights=None):
    """The median step in ms, the losses, and the first step's seconds (torch.compile's compilation in it).
    weights: start from these (napkin's initial weights) instead of torch's own draw."""
    torch.manual_seed(0)
    model = TORCH_MODELS[kind(name)](name)
    if weights is not None:
        with torch.no_grad():
            for k, v in model.params.items():
                v.copy_(torch.from_numpy(np.array(weights[k])))
    opt, clip = model.optimizer(foreach)
    params = list(model.params.values())
    bf16 = precision == "bf16-mixed"
    loss_fn = model.loss

    def update():
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()

    if compile_:  # inductor on the forward (and through AOTAutograd the backward), and on the update
        loss_fn, update = torch.compile(model.loss), torch.compile(update)
    times, losses, first = [], [], 0.0
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        inputs = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(*inputs)
        loss = loss.float()
        loss.backward()
        update()
        t1 = time.perf_counter()
        losses.append(loss.item())  # after the clock stops: .item() would only add a sync on GPU anyway
        if i == 0:
            first = t1 - t0
        if i >= warmup:
            times.append((t1 - t0) * 1e3)
    if not all(math.isfinite(v) for v in losses):
        raise RuntimeError(f"torch {name}: non-finite loss")
    return statistics.median(times), losses, first


# ---------------------------------------------------------------------------
# napkin
# ---------------------------------------------------------------------------

class NapkinError(Exception):
    pass


def run(cmd, what, timeout=None):
    print("$ " + shlex.join(cmd), flush=True)
    try:
        # errors="replace": napkin sample writes a byte-level model's bytes, not always UTF-8.
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", cwd=ROOT, timeout=timeout)
    except FileNotFoundError as e:
        raise NapkinError(f"{what}: {e}") from e
    except subprocess.TimeoutExpired as e:
        raise NapkinError(f"{what}: timed out after {timeout} s") from e
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-15:])
        raise NapkinError(f"{what} failed (exit status {r.returncode}):\n{tail}")
    return r.stdout


def napkin_flops(napkin, yaml, dims=None):
    out = run([napkin, "report", yaml, "--json", "--no-ops", *(["--dims", dims] if dims else [])], "napkin report")
    return float(json.loads(out)["flops"]["total"])


def precision_yaml(yaml, precision, tmp):
    """The model file to build: the YAML itself when it already declares `precision` (no `precision:` line
    means fp32), else a temp copy whose top-level `precision:` is `precision` (appended when the file has
    none). models/llama.yaml is bf16-mixed: its fp32 run needs the copy."""
    with open(os.path.join(ROOT, yaml)) as f:
        text = f.read()
    declared = re.search(r"(?m)^precision:\s*(\S+)", text)
    if (declared.group(1) if declared else "fp32") == precision:
        return yaml
    text, n = re.subn(r"(?m)^precision:.*$", f"precision: {precision}", text)
    if n == 0:
        text += f"\nprecision: {precision}\n"
    out = os.path.join(tmp, os.path.basename(yaml))
    with open(out, "w") as f:
        f.write(text)
    return out


def check_low_precision_matmuls(trainer, precision):
    """A bf16-mixed trainer must run its matmuls in bf16: without the
    mixed-precision pass the policy would build an fp32 trainer under a bf16 name."""
    program = json.loads(run([trainer, "--print-program"], "trainer --print-program"))
    matmuls = [k["matmul"] for k in program["kernels"] if k["kind"] == "matmul"]
    low = [m for m in matmuls if m.get("a_dtype") == "bf16"]
    if not low:
        raise NapkinError(f"precision {precision}: the trainer has {len(matmuls)} matmuls and none in bf16 "
                          f"(is the mixed-precision pass in napkin's pipeline?); not timing it as bf16")
    print(f"napkin: {len(low)} of {len(matmuls)} matmuls in bf16")


def build_trainer(napkin, name, yaml, tmp, dims=None):
    trainer = os.path.join(tmp, f"{name}-trainer")
    try:
        run([napkin, "build", yaml, "-o", trainer, *(["--dims", dims] if dims else [])], f"napkin build {yaml}",
            timeout=900)
    except NapkinError as e:
        raise NapkinError(f"could not build napkin's trainer for {name}: {e}") from e
    if not os.access(trainer, os.X_OK):
        raise NapkinError(f"napkin build {yaml} exited 0 but wrote no executable {trainer}")
    return trainer


def time_napkin(trainer, name, tmp, data_flags, steps, warmup, threads, round_):
    metrics = os.path.join(tmp, f"{name}.{round_}.jsonl")
    run([trainer, "--steps", str(warmup + steps), "--seed", "0", *data_flags, "--order", "sequential",
         "--log-every", "1", "--metrics", metrics, "--threads", str(threads), "--quiet", "--checkpoint-every", "0"],
        f"napkin trainer for {name}", timeout=900)
    rows = []
    with open(metrics) as f:
        for line in f:
            line = line.strip()
            if line:
                rec = json.loads(line)
                if "step_ms" in rec and "loss" in rec:
                    rows.append(rec)
    timed = [r["step_ms"] for r in rows if r["step"] > warmup]
    if len(timed) < steps:
        raise NapkinError(f"{metrics}: expected step_ms for steps {warmup + 1}..{warmup + steps}, got {len(timed)} "
                          f"(of {len(rows)} step lines)")
    if not all(math.isfinite(r["loss"]) for r in rows):
        raise NapkinError(f"napkin {name}: non-finite loss in {metrics}")
    return statistics.median(timed)


# ---------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--napkin", default=os.path.join(ROOT, "build/tools/napkin"))
    ap.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads and napkin --threads (default 2)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="alternate napkin and torch this many times; each side's best median counts (default 2)")
    ap.add_argument("--peak", type=float, default=350.0, help="the CPU's measured fp32 GEMM peak, GFLOP/s (default 350)")
    ap.add_argument("--only", default="", help="comma-separated: cruncher,mlp,gpt")
    ap.add_argument("--precision", choices=["fp32", "bf16-mixed"], default="fp32",
                    help="fp32, or bf16-mixed: napkin's policy vs torch.autocast bf16 (default fp32)")
    ap.add_argument("--torch-only", action="store_true", help="time PyTorch alone (no napkin trainer)")
    ap.add_argument("--compile", action="store_true",
                    help="PyTorch 2: torch.compile the loss (forward and backward) and the update (inductor); run "
                         "with the peers' venv python (bench/peers/setup.sh)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (trainers, data, metrics)")
    args = ap.parse_args()
    only = [s for s in args.only.split(",") if s] or list(MODELS)
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("--rounds, --steps and --threads must be >= 1, --warmup >= 0")
    bad = [s for s in only if s not in MODELS]
    if bad:
        ap.error(f"unknown model(s): {', '.join(bad)}; known: {', '.join(MODELS)}")

    sys.stdout.reconfigure(line_buffering=True)  # keep stdout and stderr (napkin's errors) in order
    torch.set_num_threads(args.threads)
    if args.compile and not hasattr(torch, "compile"):
        ap.error(f"--compile needs PyTorch 2 (this is {torch.__version__}): run with the venv bench/peers/setup.sh makes")
    # A peer on the reference BLAS or the wrong thread count is refused, not timed (bench/peers/check.py).
    sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))
    import check as peer_check
    what, backend, threads, gflops, problems = peer_check.check_torch(args.threads, 20.0)
    print(f"peer: {what}, {backend}, {threads} threads, 1024^3 matmul {gflops:.1f} GFLOP/s"
          f"{', torch.compile (inductor)' if args.compile else ', eager'}")
    if problems:
        print("refused: " + "; ".join(problems), file=sys.stderr)
        return 2
    print(f"torch {torch.__version__} ({sys.executable}), {torch.get_num_threads()} threads; napkin --threads "
          f"{args.threads}; {args.warmup} warmup + {args.steps} timed steps, median, best of {args.rounds} "
          f"alternating rounds; {args.precision}; peak {args.peak:g} GFLOP/s (fp32)")
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"warning: load average {load:.2f} before starting; other processes share the CPU and the times "
              "will be noisy (both sides are measured under the same conditions, one after the other)")
    tmp = tempfile.mkdtemp(prefix="napkin-train-bench-")
    rng = np.random.default_rng(0)
    results, errors = [], []
    try:
        for name in only:
            yaml, target = MODELS[name]
            if args.precision == "bf16-mixed":
                target = TARGETS_BF16[name]
            print(f"\n== {name} ({yaml}: " + ", ".join(f"{k}={v}" for k, v in DIMS[name].items()) + ")")
            mdir = os.path.join(tmp, name)
            os.makedirs(mdir)
            yaml = precision_yaml(yaml, args.precision, mdir)
            data_flags, batches = make_data(name, mdir, rng)
            flops = None
            try:
                flops = napkin_flops(args.napkin, yaml)
            except NapkinError as e:
                errors.append(f"{name}: {e}")
                print(f"error: {e}", file=sys.stderr)
            trainer = None
            if not args.torch_only:
                try:
                    trainer = build_trainer(args.napkin, name, yaml, mdir)
                    if args.precision != "fp32":
                        check_low_precision_matmuls(trainer, args.precision)
                except NapkinError as e:
                    trainer = None
                    errors.append(f"{name}: {e}")
                    print(f"error: {e}", file=sys.stderr)
            # The same computation on both sides: from napkin's initial weights, torch's first two losses
            # (before and after one update) must be napkin's (bf16-mixed: to bf16's precision).
            if trainer is not None:
                try:
                    weights, napkin_losses = napkin_start(trainer, name, mdir, data_flags)
                    _, torch_losses, _ = time_torch(name, batches, 2, 0, True, args.precision, args.compile, weights)
                    worst = max(abs(a - b) / abs(a) for a, b in zip(napkin_losses, torch_losses))
                    tolerance = 1e-4 if args.precision == "fp32" else 2e-2
                    print(f"first losses from napkin's initial weights: napkin {napkin_losses}, torch "
                          f"{[round(v, 8) for v in torch_losses]}: relative difference {worst:.2e} (tolerance {tolerance:g})")
                    if worst > tolerance:
                        raise NapkinError(f"{name}: torch's first losses are not napkin's ({worst:.2e} apart): "
                                          "not the same computation, not timed")
                except NapkinError as e:
                    trainer = None
                    errors.append(f"{name}: {e}")
                    print(f"error: {e}", file=sys.stderr)
            # Rounds alternate napkin and torch so that both see the same background load; each side's
            # time is its best median over the rounds. Round 1 times torch's foreach=False and True;
            # later rounds only the faster of the two.
            napkin_ms, variants = None, {}
            for r in range(args.rounds):
                if trainer is not None:
                    try:
                        ms = time_napkin(trainer, name, mdir, data_flags, args.steps, args.warmup, args.threads, r)
                        print(f"round {r + 1}: napkin: median step {ms:.2f} ms")
                        napkin_ms = ms if napkin_ms is None else min(napkin_ms, ms)
                    except NapkinError as e:
                        errors.append(f"{name}: {e}")
                        print(f"error: {e}", file=sys.stderr)
                        trainer = None
                for foreach in ((False, True) if r == 0 else (min(variants, key=variants.get),)):
                    ms, losses, first = time_torch(name, batches, args.steps, args.warmup, foreach, args.precision,
                                                   args.compile)
                    variants[foreach] = min(variants.get(foreach, math.inf), ms)
                    print(f"round {r + 1}: torch (foreach={foreach}): median step {ms:.2f} ms "
                          f"(loss {losses[0]:.4f} -> {losses[-1]:.4f}; first step {first:.1f} s)")
            best = min(variants, key=variants.get)
            results.append((name, target, napkin_ms, variants[best], best, flops))
    finally:
        if args.keep:
            print(f"\nkept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    gf = lambda flops, ms: flops / (ms * 1e-3) / 1e9 if flops and ms else None
    fmt = lambda v, spec: format(v, spec) if v is not None else format("-", ">" + spec.split(".")[0])
    print(f"\nmedian step time (best of {args.rounds} rounds), {args.precision}, {args.threads} threads; GFLOP/s = napkin's flops.total per step / step time; "
          f"peak {args.peak:g} GFLOP/s")
    print(f"{'model':9} {'GFLOP/step':>10} {'napkin ms':>10} {'torch ms':>10} {'torch/napkin':>12} {'target':>7} "
          f"{'napkin GF/s':>11} {'%peak':>6} {'torch GF/s':>10} {'%peak':>6}  torch optimizer  result")
    missed = bool(errors)
    for name, target, nms, tms, foreach, flops in results:
        ratio = tms / nms if nms else None
        ok = ratio is not None and ratio >= target
        missed |= not ok
        ngf, tgf = gf(flops, nms), gf(flops, tms)
        print(f"{name:9} {fmt(flops and flops / 1e9, '10.3f')} {fmt(nms, '10.2f')} {tms:10.2f} "
              f"{fmt(ratio, '11.2f') + ('x' if ratio else ' ')} {target:6.1f}x {fmt(ngf, '11.1f')} "
              f"{fmt(ngf and 100 * ngf / args.peak, '6.1f')} {fmt(tgf, '10.1f')} {fmt(tgf and 100 * tgf / args.peak, '6.1f')}"
              f"  foreach={str(foreach):5}    {'PASS' if ok else ('MISS' if nms else 'n/a (no napkin time)')}")
    if errors:
        print("\nnapkin errors:", file=sys.stderr)
        for e in errors:
            print("  " + e.replace("\n", "\n    "), file=sys.stderr)
    if args.torch_only:
        print("\n--torch-only: napkin's trainer was not run; no target is judged")
        return 0 if not errors else 1
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
