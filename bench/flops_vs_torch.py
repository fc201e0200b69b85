#!/usr/bin/python3
"""An independent check of napkin's matmul FLOPs: count what PyTorch dispatches.

For each model in models/ (linear, cruncher, mlp, gpt, gpt2-124m) this script
builds the same model by hand in PyTorch (python3-torch 1.13, CPU): the same
shapes, the same ops (einsum where the YAML has einsum, `@` where it has `@`,
pre-norm transformer blocks with tied embeddings, causal attention over the
full T x T scores, tanh gelu), with data inputs that do not require grad, as
napkin gives data inputs no gradient. It then runs one training step (forward,
loss.backward(), the optimizer step) under a TorchDispatchMode that sees every
aten op that actually dispatches and counts the contractions (mm, addmm, bmm,
baddbmm, addbmm, mv, addmv, dot, vdot, matmul: 2 FLOPs per multiply-add, i.e.
2*m*n*k), per phase.

The torch counts are compared with `napkin report MODEL --json --no-ops`:
  forward  = flops.param_matmul.forward  + flops.activation_matmul.forward
  backward = flops.param_matmul.backward + flops.activation_matmul.backward
napkin's total forward and backward FLOPs (which also count elementwise ops,
normalizations, softmax and the loss) are printed for reference. The torch
optimizer step must do no matmul work at all. The parameter counts are
compared too (a shape mismatch shows up there first).

gpt2-124m runs with smaller dims (`--dims batch=1,seq=128` for napkin, the
same numbers in torch) so that the step also runs quickly on real CPU tensors.

Exit status: 0 when every matmul ratio is 1 (within 1e-9) and the parameter
counts agree; 1 otherwise, or when an op that looks like a contraction
dispatched without a FLOP rule here.

The default device is 'meta' (shapes only: the same aten ops dispatch, no
arithmetic, about 2 s for all five models); `--device cpu` runs the step on
real CPU tensors (about a minute on 2 vCPUs) and gives the same counts. `--full` drops
the --dims overrides (gpt2-124m at batch 8, seq 1024; meta only in practice).

Usage: bench/flops_vs_torch.py [--napkin build/tools/napkin] [--device meta|cpu]
                               [--full] [--only NAME[,NAME]] [--verbose]
"""
import argparse
import collections
import fnmatch
import json
import math
import os
import shlex
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------
# Counting what dispatches
# ---------------------------------------------------------------------------

def _prod(xs):
    p = 1
    for x in xs:
        p *= int(x)
    return p


def _mm(a, b):  # a[m,k] @ b[k,n]
    m, k = a.shape
    return 2 * m * k * b.shape[1]


def _bmm(a, b):  # a[B,m,k] @ b[B,k,n]
    bsz, m, k = a.shape
    return 2 * bsz * m * k * b.shape[2]


def _matmul(a, b, out):  # torch.matmul semantics, if it ever reaches dispatch
    k = a.shape[-1]
    return 2 * out.numel() * k


# aten op (overload packet name) -> FLOPs of one call, from its arguments
MATMUL_RULES = {
    "mm": lambda args, out: _mm(args[0], args[1]),
    "addmm": lambda args, out: _mm(args[1], args[2]),
    "_addmm_activation": lambda args, out: _mm(args[1], args[2]),
    "bmm": lambda args, out: _bmm(args[0], args[1]),
    "baddbmm": lambda args, out: _bmm(args[1], args[2]),
    "addbmm": lambda args, out: _bmm(args[1], args[2]),
    "mv": lambda args, out: 2 * args[0].shape[0] * args[0].shape[1],
    "addmv": lambda args, out: 2 * args[1].shape[0] * args[1].shape[1],
    "dot": lambda args, out: 2 * args[0].numel(),
    "vdot": lambda args, out: 2 * args[0].numel(),
    "matmul": lambda args, out: _matmul(args[0], args[1], out),
}

# Ops that look like contractions; seeing one without a rule above is an error
# (its FLOPs would silently go uncounted).
SUSPECT = ("mm", "matmul", "dot", "einsum", "conv", "linear", "bilinear", "tensordot", "attention")


class MatmulCounter(TorchDispatchMode):
    """Counts the FLOPs of every contraction that dispatches, per phase."""

    def __init__(self):
        super().__init__()
        self.phase = "forward"
        self.flops = collections.Counter()                       # phase -> FLOPs
        self.calls = collections.defaultdict(collections.Counter)  # phase -> op -> calls
        self.op_flops = collections.defaultdict(collections.Counter)  # phase -> op -> FLOPs
        self.unhandled = collections.Counter()                   # op -> calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        rule = MATMUL_RULES.get(name)
        if rule is not None:
            f = int(rule(args, out))
            self.flops[self.phase] += f
            self.calls[self.phase][name] += 1
            self.op_flops[self.phase][name] += f
        elif any(s in name for s in SUSPECT):
            self.unhandled[name] += 1
        return out


# ---------------------------------------------------------------------------
# The models, by hand (shapes and ops as in models/*.yaml)
# ---------------------------------------------------------------------------

DEFAULT_DIMS = {
    "linear": {"batch": 1024, "d": 256, "k": 64},
    "cruncher": {"batch": 256, "d": 1024, "layers": 4},
    "mlp": {"batch": 512, "d_in": 784, "hidden": 1024, "classes": 10},
    "gpt": {"batch": 16, "seq": 128, "vocab": 256, "d": 256, "heads": 4, "layers": 4},
    "gpt2-124m": {"batch": 8, "seq": 1024, "vocab": 50257, "d": 768, "heads": 12, "layers": 12},
}

# (name, file, napkin --dims overrides; the same numbers are used in torch)
MODELS = [
    ("linear", "models/linear.yaml", {}),
    ("cruncher", "models/cruncher.yaml", {}),
    ("mlp", "models/mlp.yaml", {}),
    ("gpt", "models/gpt.yaml", {}),
    ("gpt2-124m", "models/gpt2-124m.yaml", {"batch": 1, "seq": 128}),
]


class Model:
    """params: name -> leaf tensor (requires_grad), in the YAML's order;
    inputs: name -> data tensor (no grad); loss(): the forward pass."""

    def __init__(self, device):
        self.device = device
        self.params = {}
        self.inputs = {}
        self.no_decay = []

    def param(self, name, shape, init):
        if init == "ones":
            t = torch.ones(shape, device=self.device)
        elif init == "zeros":
            t = torch.zeros(shape, device=self.device)
        else:  # normal(std) or xavier: the numbers do not change any count
            std = init if isinstance(init, float) else math.sqrt(2.0 / (shape[0] + shape[-1]))
            t = torch.randn(shape, device=self.device) * std
        t.requires_grad_(True)
        self.params[name] = t
        return t

    def data(self, name, shape, high=None):
        if high is None:
            t = torch.randn(shape, device=self.device)
        else:
            t = torch.randint(0, high, shape, device=self.device, dtype=torch.long)
        self.inputs[name] = t  # requires_grad stays False: no gradient for data
        return t

    def optimizer(self):
        return torch.optim.SGD(list(self.params.values()), lr=0.01)

    def decay_groups(self, weight_decay):
        decay, no = [], []
        for n, p in self.params.items():
            leaf = n.rsplit(".", 1)[-1]
            (no if any(fnmatch.fnmatchcase(leaf, pat) for pat in self.no_decay) else decay).append(p)
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no, "weight_decay": 0.0}]


class Linear(Model):
    # pred = x @ w; mse(pred, y); sgd
    def __init__(self, dm, device):
        super().__init__(device)
        B, D, K = dm["batch"], dm["d"], dm["k"]
        self.x = self.data("x", (B, D))
        self.y = self.data("y", (B, K))
        self.w = self.param("w", (D, K), "xavier")

    def loss(self):
        pred = self.x @ self.w
        return F.mse_loss(pred, self.y)


class Cruncher(Model):
    # L x (x @ w), then rearrange(x @ final, "b 1 -> b"); mse; adagrad
    def __init__(self, dm, device):
        super().__init__(device)
        B, D, L = dm["batch"], dm["d"], dm["layers"]
        self.x = self.data("x", (B, D))
        self.y = self.data("y", (B,))
        self.final = self.param("final", (D, 1), "xavier")
        self.ws = [self.param(f"layers.{i}.w", (D, D), "xavier") for i in range(L)]

    def loss(self):
        x = self.x
        for w in self.ws:
            x = x @ w
        pred = (x @ self.final).reshape(-1)
        return F.mse_loss(pred, self.y)

    def optimizer(self):
        return torch.optim.Adagrad(list(self.params.values()), lr=0.01)


class MLP(Model):
    # gelu(images @ w1 + b1), gelu(h1 @ w2 + b2), h2 @ w3 + b3; cross_entropy; adamw
    def __init__(self, dm, device):
        super().__init__(device)
        B, I, H, C = dm["batch"], dm["d_in"], dm["hidden"], dm["classes"]
        self.images = self.data("images", (B, I))
        self.labels = self.data("labels", (B,), high=C)
        self.w1 = self.param("w1", (I, H), "xavier")
        self.b1 = self.param("b1", (H,), "zeros")
        self.w2 = self.param("w2", (H, H), "xavier")
        self.b2 = self.param("b2", (H,), "zeros")
        self.w3 = self.param("w3", (H, C), "xavier")
        self.b3 = self.param("b3", (C,), "zeros")
        self.no_decay = ["b*"]

    def loss(self):
        h1 = F.gelu(self.images @ self.w1 + self.b1, approximate="tanh")  # napkin's default gelu is tanh
        h2 = F.gelu(h1 @ self.w2 + self.b2, approximate="tanh")
        logits = h2 @ self.w3 + self.b3
        return F.cross_entropy(logits, self.labels)

    def optimizer(self):
        return torch.optim.AdamW(self.decay_groups(0.01), lr=1e-3)


class GPT(Model):
    """gpt.yaml (biases=False, blocks named blocks.N) and gpt2-124m.yaml
    (biases=True, blocks named h.N): pre-norm blocks, tied wte."""

    def __init__(self, dm, device, biases, prefix, lr, eps):
        super().__init__(device)
        self.B, self.T, self.V, self.D = dm["batch"], dm["seq"], dm["vocab"], dm["d"]
        self.H, self.L = dm["heads"], dm["layers"]
        self.HD = self.D // self.H  # head_dim: d / heads
        FF = 4 * self.D             # hidden: 4 * d
        self.biases, self.lr, self.eps = biases, lr, eps
        D = self.D
        self.tokens = self.data("tokens", (self.B, self.T), high=self.V)
        self.targets = self.data("targets", (self.B, self.T), high=self.V)
        self.wte = self.param("wte", (self.V, D), 0.02)
        self.wpe = self.param("wpe", (self.T, D), 0.02)
        self.lnf_g = self.param("lnf_g", (D,), "ones")
        self.lnf_b = self.param("lnf_b", (D,), "zeros")
        self.blocks = []
        for i in range(self.L):
            def p(n, shape, init, i=i):
                return self.param(f"{prefix}.{i}.{n}", shape, init)
            blk = {
                "ln1_g": p("ln1_g", (D,), "ones"), "ln1_b": p("ln1_b", (D,), "zeros"),
                "w_qkv": p("w_qkv", (D, 3 * D), 0.02),
                "w_proj": p("w_proj", (D, D), 0.02 / math.sqrt(2 * self.L)),
                "ln2_g": p("ln2_g", (D,), "ones"), "ln2_b": p("ln2_b", (D,), "zeros"),
                "w_fc": p("w_fc", (D, FF), 0.02),
                "w_out": p("w_out", (FF, D), 0.02 / math.sqrt(2 * self.L)),
            }
            if biases:
                blk.update({"b_qkv": p("b_qkv", (3 * D,), "zeros"), "b_proj": p("b_proj", (D,), "zeros"),
                            "b_fc": p("b_fc", (FF,), "zeros"), "b_out": p("b_out", (D,), "zeros")})
            self.blocks.append(blk)
        self.no_decay = ["*_g", "*_b", "wpe", "b_*"]
        # causal_mask: entries j > i get -inf (full T x T scores, nothing skipped)
        self.mask = torch.ones(self.T, self.T, dtype=torch.bool, device=device).triu(1)

    def ln(self, x, g, b):
        return F.layer_norm(x, (self.D,), g, b)

    def block(self, x, p):
        B, T, H, HD, D = self.B, self.T, self.H, self.HD, self.D
        bias = (lambda n: p[n]) if self.biases else (lambda n: 0)
        qkv = torch.einsum("bsd,de->bse", self.ln(x, p["ln1_g"], p["ln1_b"]), p["w_qkv"]) + bias("b_qkv")
        # rearrange(qkv, "b s (three h hd) -> three b h s hd")
        q, k, v = qkv.reshape(B, T, 3, H, HD).permute(2, 0, 3, 1, 4).unbind(0)
        scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(HD)
        att = torch.softmax(scores.masked_fill(self.mask, float("-inf")), dim=-1)
        y = torch.einsum("bhij,bhjd->bhid", att, v)
        y = y.permute(0, 2, 1, 3).reshape(B, T, D)  # "b h s hd -> b s (h hd)"
        x = x + torch.einsum("bse,ed->bsd", y, p["w_proj"]) + bias("b_proj")
        h = F.gelu(torch.einsum("bsd,df->bsf", self.ln(x, p["ln2_g"], p["ln2_b"]), p["w_fc"]) + bias("b_fc"),
                   approximate="tanh")
        return x + torch.einsum("bsf,fd->bsd", h, p["w_out"]) + bias("b_out")

    def loss(self):
        pos = torch.arange(self.T, device=self.device)
        x = F.embedding(self.tokens, self.wte) + F.embedding(pos, self.wpe)
        for p in self.blocks:
            x = self.block(x, p)
        logits = torch.einsum("bsd,vd->bsv", self.ln(x, self.lnf_g, self.lnf_b), self.wte)  # tied
        return F.cross_entropy(logits.reshape(-1, self.V), self.targets.reshape(-1))

    def optimizer(self):
        return torch.optim.AdamW(self.decay_groups(0.1), lr=self.lr, betas=(0.9, 0.95), eps=self.eps)

    def clip(self):
        torch.nn.utils.clip_grad_norm_(list(self.params.values()), 1.0)


BUILDERS = {
    "linear": lambda dm, dev: Linear(dm, dev),
    "cruncher": lambda dm, dev: Cruncher(dm, dev),
    "mlp": lambda dm, dev: MLP(dm, dev),
    "gpt": lambda dm, dev: GPT(dm, dev, biases=False, prefix="blocks", lr=3e-4, eps=1e-8),
    "gpt2-124m": lambda dm, dev: GPT(dm, dev, biases=True, prefix="h", lr=6e-4, eps=1e-8),
}


def torch_step(name, dims, device):
    """One training step under the counter; returns (counter, params, seconds)."""
    torch.manual_seed(0)
    model = BUILDERS[name](dims, device)
    opt = model.optimizer()
    counter = MatmulCounter()
    start = time.perf_counter()
    with counter:
        counter.phase = "forward"
        loss = model.loss()
        counter.phase = "backward"
        loss.backward()
        counter.phase = "optimizer"
        if hasattr(model, "clip"):
            model.clip()
        opt.step()
    seconds = time.perf_counter() - start
    nparams = sum(p.numel() for p in model.params.values())
    missing = [n for n, p in model.params.items() if p.grad is None]
    if missing:
        raise RuntimeError(f"{name}: no gradient for {missing}")
    return counter, nparams, seconds


# ---------------------------------------------------------------------------
# napkin, the comparison, the table
# ---------------------------------------------------------------------------

def napkin_report(napkin, path, dims):
    cmd = [napkin, "report", path, "--json", "--no-ops"]
    if dims:
        cmd += ["--dims", ",".join(f"{k}={v}" for k, v in dims.items())]
    print("$ " + shlex.join([os.path.relpath(cmd[0], ROOT) if os.path.isabs(cmd[0]) else cmd[0]] + cmd[1:]))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out)


def ratio(torch_value, napkin_value):
    if napkin_value == 0:
        return 1.0 if torch_value == 0 else math.inf
    return torch_value / napkin_value


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--napkin", default=os.path.join(ROOT, "build/tools/napkin"))
    ap.add_argument("--device", default="meta", choices=["meta", "cpu"],
                    help="meta: shapes only, no arithmetic (default, ~2 s); cpu: real tensors (~1 min)")
    ap.add_argument("--full", action="store_true",
                    help="no --dims overrides: gpt2-124m at its YAML dims (batch 8, seq 1024); use with meta")
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--verbose", action="store_true", help="per-aten-op breakdown")
    args = ap.parse_args()

    only = set(filter(None, args.only.split(",")))
    unknown = only - {m[0] for m in MODELS}
    if unknown:
        ap.error(f"unknown model(s): {', '.join(sorted(unknown))}")
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"torch {torch.__version__} ({sys.executable}), device {args.device}, "
          f"{torch.get_num_threads()} threads; one step: forward, loss.backward(), optimizer step")

    failures, summary = [], []
    for name, path, overrides in MODELS:
        if only and name not in only:
            continue
        if args.full:
            overrides = {}
        print(f"\n== {name} ({path})")
        report = napkin_report(args.napkin, path, overrides)
        dims = dict(DEFAULT_DIMS[name], **overrides)
        print(f"torch: {name} built by hand in this script with dims "
              + ", ".join(f"{k}={v}" for k, v in dims.items()))
        counter, torch_params, seconds = torch_step(name, dims, args.device)

        fl = report["flops"]
        napkin_mm = {ph: fl["param_matmul"][ph] + fl["activation_matmul"][ph] for ph in ("forward", "backward")}
        rows = []
        print(f"{'':10} {'napkin matmul':>19} {'torch matmul':>19} {'ratio':>8} {'napkin total':>19}")
        for ph in ("forward", "backward"):
            r = ratio(counter.flops[ph], napkin_mm[ph])
            rows.append(r)
            print(f"{ph:10} {int(napkin_mm[ph]):19,} {counter.flops[ph]:19,} {r:8.4f} {int(fl[ph]):19,}")
            if abs(r - 1) > 1e-9:
                failures.append(f"{name}: {ph} matmul FLOPs differ: napkin {int(napkin_mm[ph]):,}, "
                                f"torch {counter.flops[ph]:,} (ratio {r:.6f})")
        print(f"{'optimizer':10} {'-':>19} {counter.flops['optimizer']:19,} {'':>8} {int(fl['optimizer']):19,}")
        if counter.flops["optimizer"] != 0:
            failures.append(f"{name}: the torch optimizer step dispatched matmuls "
                            f"({counter.flops['optimizer']:,} FLOPs)")
        print(f"{'params':10} {report['params']:19,} {torch_params:19,}")
        if report["params"] != torch_params:
            failures.append(f"{name}: parameter counts differ: napkin {report['params']:,}, torch {torch_params:,}")
        for ph in ("forward", "backward", "optimizer"):
            calls = counter.calls[ph]
            desc = ", ".join(f"{op} x{n}" for op, n in sorted(calls.items())) or "none"
            print(f"  torch dispatched ({ph}): {desc}")
            if args.verbose:
                for op, f in sorted(counter.op_flops[ph].items()):
                    print(f"    {op:10} {f:19,} FLOPs")
        if counter.unhandled:
            failures.append(f"{name}: contraction-like ops without a FLOP rule here: {dict(counter.unhandled)}")
        print(f"  torch step: {seconds:.2f} s")
        summary.append((name, napkin_mm["forward"], counter.flops["forward"], rows[0],
                        napkin_mm["backward"], counter.flops["backward"], rows[1]))

    print("\nsummary: matmul FLOPs, napkin vs torch (ratio = torch / napkin)")
    print(f"{'model':10} {'napkin fwd':>19} {'torch fwd':>19} {'ratio':>7} "
          f"{'napkin bwd':>19} {'torch bwd':>19} {'ratio':>7}")
    for name, nf, tf, rf, nb, tb, rb in summary:
        print(f"{name:10} {int(nf):19,} {tf:19,} {rf:7.4f} {int(nb):19,} {tb:19,} {rb:7.4f}")
    if failures:
        print("\nMISMATCH:", file=sys.stderr)
        for f in failures:
            print("  " + f, file=sys.stderr)
        return 1
    print("all matmul FLOPs agree (|ratio - 1| <= 1e-9), parameter counts agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
