#!/usr/bin/env python3
"""tinygrad versions of napkin's three benchmark training steps (cruncher, mlp, gpt), for the benches that time
napkin against peers. Run with the peers' venv (bench/peers/setup.sh): ~/.cache/napkin/bench-venv/bin/python.

The math is bench/train_vs_jax.py's, op for op: the same forward passes (tanh gelu, layernorm eps 1e-5 written
out, causal attention through the full T x T scores, tied logits, cross entropy as logsumexp minus the label's
logit), started from napkin's initial weights, and the optimizers written out with torch.optim's formulas:
Adagrad for cruncher, AdamW with no_decay groups for mlp and gpt, global-norm gradient clipping for gpt. All fp32.

The whole step (forward, backward, optimizer update) is one function under TinyJit, as tinygrad users train: the
parameters and the optimizer state are Tensors the step assigns to and realizes every step. TinyJit runs the
function plainly on its first call (every kernel is compiled then: time_tinygrad's "first step" seconds), captures
it on the second and replays the captured kernels from the third on, so time with warmup >= 2.

Two things a tinygrad user does for speed, which change where values are computed but not the values:
  - linear weights stored as [out, in] (nn.Linear's layout), used as `x @ w.T`: tinygrad's generated matmul reads
    a [K, N] right operand badly (1024^3 at BEAM=0: 4-5 GFLOP/s as `a @ b`, 23-30 as `a @ b.T`); steps 10-15%
    faster. napkin's [in, out] weights are transposed once when loaded. NAPKIN_TINYGRAD_LAYOUT=in_out keeps them.
  - .contiguous() / .contiguous_backward() on activations (see act() and pre()): without them the scheduler fuses
    gelu, layernorm and softmax (and their derivatives) into the loads of the matmul that consumes them and
    recomputes them for every multiply-add: mlp's step took 2.2x longer, gpt's 1.9x. NAPKIN_TINYGRAD_MATERIALIZE=0
    (neither), 1 (forward only), 2 (default: both).

Configuration (tinygrad reads it when first imported: set it in the environment before that; a value already in
the environment is kept, these defaults only fill in what is missing). Measured on this 2-core VM, 2026-11-27:

  DEV=CPU:LLVM  the CPU device with the LLVM renderer (default). CPU:CLANG (tinygrad's own default: C through
                clang -O2) is 0-15% slower on matmuls and steps; CPU:X86 (tinygrad's own assembler) much slower
                (7.8 GFLOP/s against 30 on 1024^3 `a @ b.T`); CPU:LVP needs mesa (pip tinymesa), absent. The old
                spellings (CPU=1, LLVM=1, CPU_LLVM=1) are refused by tinygrad 0.14: it asserts "use DEV=...".
  BEAM=1        kernel search by timing candidates (default): steps about 3x (cruncher), 2.5x (mlp), 4x (gpt)
                faster than BEAM=0, but the first step searches every kernel: 2, 3 and 16 minutes on one core
                (PARALLEL=1). The results are kept in tinygrad's disk cache (CACHEDB, default
                ~/.cache/tinygrad/cache.db) and reused: a later run's first step takes 2-14 s. Point CACHEDB at a
                fresh file to time a cold search. The search runs PARALLEL processes (default: the cores this
                process may use). BEAM=0: tinygrad's heuristics only, first steps of 1-13 s. BEAM=2 searched the
                1024^3 matmul longer than BEAM=1 and found slower kernels (15-18 against 21-23 GFLOP/s).
  THREADS       tinygrad 0.14's CPU renderers split a kernel's outer loop into NUM_CPU_THREADS pieces (the cores
                this process may use), but its CPU runtime runs every piece on one worker thread: a step uses one
                core whatever THREADS says (process CPU time = wall time over jitted steps, THREADS=0 and 1 alike).
                Sharding over devices CPU:0 and CPU:1 does not help either (one worker thread for both).

precision "bf16-mixed" raises NotImplementedError: tinygrad 0.14 has no bf16 dot products on this CPU (it uses
neither AVX512-BF16 nor AMX): a bf16-input, fp32-accumulate 512^3 matmul ran at 1.7 (CLANG) and 3.7-4.9 (LLVM)
GFLOP/s against 20-25 in fp32, and a kernel that reads a bf16 buffer does not compile under CPU:CLANG with clang 14
("__bf16 is not supported on this target").

Interface: describe() -> str; time_tinygrad(name, dims, weights, batches, steps, warmup, precision="fp32") ->
(median step ms, losses, first step s).
  python bench/peers/tinygrad_step.py --selfcheck          losses vs bench/train_vs_jax.py on small dims (<= 1e-4),
                                                           BEAM=0 unless BEAM is set in the environment (20 s)
  python bench/peers/tinygrad_step.py --time cruncher,mlp  a few steps at the YAMLs' sizes (train_vs_torch.DIMS)
"""
import math
import os
import statistics
import sys
import tempfile
import time

BEAM_FROM_USER = "BEAM" in os.environ
os.environ.setdefault("DEV", "CPU:LLVM")
os.environ.setdefault("BEAM", "1")

import numpy as np  # noqa: E402
from tinygrad import Context, Device, Tensor, TinyJit, dtypes  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import train_vs_torch as tvt  # noqa: E402  (glob_match, DIMS, make_data; imports torch, which the batches are)

LINEAR_LAYOUT = os.environ.get("NAPKIN_TINYGRAD_LAYOUT", "out_in")   # "out_in" (nn.Linear's) or "in_out" (napkin's)
MATERIALIZE = int(os.environ.get("NAPKIN_TINYGRAD_MATERIALIZE", "2"))  # 0, 1 (forward), 2 (forward and backward)


def describe():
    """What the steps actually run on: tinygrad's version, device, renderer, BEAM, threads, the two choices above."""
    import tinygrad
    from tinygrad.helpers import BEAM, DEV, NUM_CPU_THREADS
    version = getattr(tinygrad, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version
        version = dist_version("tinygrad")
    renderer = type(Device[Device.DEFAULT].renderer).__name__.removesuffix("Renderer")
    # measured with 0.14.0 (see the docstring's THREADS); not verified for other versions
    threads = (f"one core (kernels split for {NUM_CPU_THREADS.value} threads, run by one worker thread)"
               if version == "0.14.0" else f"NUM_CPU_THREADS={NUM_CPU_THREADS.value}")
    return (f"tinygrad {version}, device {Device.DEFAULT}, renderer {renderer} (DEV={DEV!r}), BEAM={BEAM.value}, "
            f"{threads}, TinyJit over the whole step, fp32, linear weights {LINEAR_LAYOUT}, "
            f"materialize {MATERIALIZE}")


# ---------------------------------------------------------------- the models (train_vs_jax.py's, in tinygrad)

def act(x):
    """An elementwise result (gelu, layernorm, softmax) that feeds a matmul: materialized, and so is its gradient."""
    if MATERIALIZE >= 1:
        x = x.contiguous()
    return x.contiguous_backward() if MATERIALIZE >= 2 else x


def pre(x):
    """A matmul result that feeds elementwise ops: its gradient (gelu', softmax', cross entropy's) is materialized
    before the backward's matmuls read it."""
    return x.contiguous_backward() if MATERIALIZE >= 2 else x


def gelu(x):  # the tanh approximation, as napkin's and torch's approximate="tanh"
    return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)).tanh())


def layer_norm(x, g, b):  # biased variance, eps 1e-5 inside the square root
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / (var + 1e-5).sqrt() * g + b


def cross_entropy(logits, labels):  # mean over rows of logsumexp(logits) - logits[label]
    lse = logits.logsumexp(-1)
    return (lse - logits.gather(-1, labels.reshape(-1, 1)).reshape(-1)).mean()


def cruncher_loss(p, dims, x, y):
    for i in range(dims["layers"]):
        x = x @ p[f"layers.{i}.w"]
    return (((x @ p["final"]).reshape(-1) - y) ** 2).mean()


def mlp_loss(p, dims, images, labels):
    h1 = act(gelu(pre(images @ p["w1"] + p["b1"])))
    h2 = act(gelu(pre(h1 @ p["w2"] + p["b2"])))
    return cross_entropy(pre(h2 @ p["w3"] + p["b3"]), labels)


def gpt_loss(p, dims, tokens, targets):
    B, T, D, H, L = dims["batch"], dims["seq"], dims["d"], dims["heads"], dims["layers"]
    HD = D // H
    # wte[tokens]: tinygrad's tensor indexing (a one-hot compare and reduce); wpe[:T] is wpe[arange(T)]
    x = (p["wte"][tokens] + p["wpe"][:T]).reshape(B * T, D)
    mask = Tensor.ones(T, T, dtype=dtypes.bool).triu(1)  # True above the diagonal: the future, masked out
    for i in range(L):
        def b(n):
            return p[f"blocks.{i}.{n}"]
        # no pre() on qkv: its gradient is assembled from dq, dk, dv, and materializing it made the step slower
        qkv = act(layer_norm(x, b("ln1_g"), b("ln1_b"))) @ b("w_qkv")       # [B*T, 3D]: q, k, v, heads inside
        qkv = qkv.reshape(B, T, 3, H, HD).permute(2, 0, 3, 1, 4)           # [3, B, H, T, HD]
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = mask.where(float("-inf"), pre(q @ k.transpose(-1, -2)) / math.sqrt(HD))
        y = (act(att.softmax(-1)) @ v).permute(0, 2, 1, 3).reshape(B * T, D)
        x = x + y @ b("w_proj")
        h = act(gelu(pre(act(layer_norm(x, b("ln2_g"), b("ln2_b"))) @ b("w_fc"))))
        x = x + h @ b("w_out")
    logits = pre(act(layer_norm(x, p["lnf_g"], p["lnf_b"])) @ p["wte"].T)  # tied: [B*T, V]
    return cross_entropy(logits, targets.reshape(-1))


def param_names(name, dims):
    """The trainable parameters, napkin's names (a checkpoint's other keys are optimizer state)."""
    if name == "cruncher":
        return [f"layers.{i}.w" for i in range(dims["layers"])] + ["final"]
    if name == "mlp":
        return ["w1", "b1", "w2", "b2", "w3", "b3"]
    return ["wte", "wpe", "lnf_g", "lnf_b"] + [
        f"blocks.{i}.{n}" for i in range(dims["layers"])
        for n in ("ln1_g", "ln1_b", "w_qkv", "w_proj", "ln2_g", "ln2_b", "w_fc", "w_out")]


EMBEDDINGS = ("wte", "wpe")  # the 2-D parameters that are not a matmul's right operand [in, out]


# ------------------------------------------------------------ the optimizers (torch.optim's formulas)
# Each is (init(params) -> state dict of Tensors, update(params, state, grads) -> (new params, new state)) on
# dicts name -> Tensor, like train_vs_jax.py's; the step assigns the results to the persistent Tensors.

def adagrad(lr, eps):
    def init(p):
        return {f"sum.{k}": Tensor.zeros(*v.shape).contiguous() for k, v in p.items()}

    def update(p, s, g):  # torch's Adagrad with lr_decay 0, initial_accumulator_value 0: eps outside the sqrt
        new_s = {f"sum.{k}": s[f"sum.{k}"] + g[k] * g[k] for k in p}
        return {k: p[k] - lr * g[k] / (new_s[f"sum.{k}"].sqrt() + eps) for k in p}, new_s
    return init, update


def adamw(lr, b1, b2, wd, no_decay, clip=0.0, eps=1e-8):
    def init(p):
        s = {"t": Tensor.zeros(1).contiguous()}  # the step count, a Tensor: a Python number would be baked into the JIT
        for k, v in p.items():
            s[f"m.{k}"] = Tensor.zeros(*v.shape).contiguous()
            s[f"v.{k}"] = Tensor.zeros(*v.shape).contiguous()
        return s

    def update(p, s, g):
        if clip > 0:  # clip_grad_norm_: the global L2 norm over all gradients, coef capped at 1
            norm = sum((x * x).sum() for x in g.values()).sqrt()
            coef = (clip / (norm + 1e-6)).minimum(1.0)
            g = {k: x * coef for k, x in g.items()}
        t = s["t"] + 1
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        new_s, out = {"t": t}, {}
        for k in p:
            m = b1 * s[f"m.{k}"] + (1 - b1) * g[k]
            v = b2 * s[f"v.{k}"] + (1 - b2) * g[k] * g[k]
            decay = 0.0 if any(tvt.glob_match(pat, k) for pat in no_decay) else wd
            q = p[k] * (1 - lr * decay)  # decoupled weight decay first, then the Adam step (torch's order)
            out[k] = q - (lr / bc1) * m / (v.sqrt() / bc2.sqrt() + eps)
            new_s[f"m.{k}"], new_s[f"v.{k}"] = m, v
        return out, new_s
    return init, update


MODELS = {
    "cruncher": (cruncher_loss, adagrad(0.01, 1e-10)),
    "mlp": (mlp_loss, adamw(1e-3, 0.9, 0.999, 0.01, ["b*"])),
    "gpt": (gpt_loss, adamw(3e-4, 0.9, 0.95, 0.1, ["*_g", "*_b", "wpe"], clip=1.0)),
}


# ---------------------------------------------------------------- the timed step

def to_tinygrad(batch):
    """A make_data batch (torch tensors, or numpy arrays) as realized Tensors: floats as fp32, integers as int32."""
    out = []
    for t in batch:
        a = t if isinstance(t, np.ndarray) else t.numpy()
        a = a.astype(np.float32) if a.dtype.kind == "f" else a.astype(np.int32)
        out.append(Tensor(np.ascontiguousarray(a)).realize())
    return tuple(out)


def time_tinygrad(name, dims, weights, batches, steps, warmup, precision="fp32"):
    """Runs warmup + steps training steps of model name (cruncher, mlp, gpt or a gpt variant such as gpt-d512) at
    dims (a train_vs_torch.DIMS entry), from weights (napkin's names; other keys, its optimizer state, are
    ignored), step i on batches[i % len(batches)] (make_data's tuples of torch tensors).
    Returns (median step ms over the timed steps, all losses as floats, seconds of the first step incl. compile).
    The clock covers the jitted step and a device synchronize (tinygrad's CPU device runs the kernels on a worker
    thread, asynchronously); each loss is read back after its clock stops, before the next step."""
    if precision != "fp32":
        raise NotImplementedError(
            f"tinygrad {precision}: not timed. tinygrad 0.14 has no bf16 dot products on this CPU: a bf16-input, "
            "fp32-accumulate matmul runs 5-12x slower than fp32 (CPU:LLVM), and a bf16 buffer does not compile "
            "under CPU:CLANG with clang 14 (see bench/peers/tinygrad_step.py's docstring)")
    family = "gpt" if name.startswith("gpt") else name  # a GPT variant ("gpt-d512") is a gpt at its own dims
    loss_fn, (opt_init, opt_update) = MODELS[family]
    names = param_names(family, dims)
    # Linear weights (napkin's [in, out]) are stored as [out, in], nn.Linear's layout, under LINEAR_LAYOUT
    # "out_in"; the loss sees the transposed view (no copy), so its `x @ w` is the same math. The optimizers are
    # elementwise and the clipping norm a sum: they do not care about the layout.
    w = {k: np.asarray(weights[k], dtype=np.float32) for k in names}
    transposed = {k for k in names if w[k].ndim == 2 and k not in EMBEDDINGS} if LINEAR_LAYOUT == "out_in" else set()
    params = {k: Tensor(np.ascontiguousarray(w[k].T if k in transposed else w[k])).realize() for k in names}
    state = opt_init(params)
    Tensor.realize(*state.values())

    @TinyJit
    def step(*inputs):
        loss = loss_fn({k: v.T if k in transposed else v for k, v in params.items()}, dims, *inputs)
        grads = dict(zip(names, loss.gradient(*[params[k] for k in names])))
        new_p, new_s = opt_update(params, state, grads)
        for k, v in new_p.items():
            params[k].assign(v.detach())
        for k, v in new_s.items():
            state[k].assign(v.detach())
        Tensor.realize(loss, *params.values(), *state.values())
        return loss

    tg_batches = [to_tinygrad(b) for b in batches]
    dev = Device[Device.DEFAULT]
    dev.synchronize()
    times, losses, first = [], [], 0.0
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss = step(*tg_batches[i % len(tg_batches)])
        dev.synchronize()
        t1 = time.perf_counter()
        losses.append(float(loss.item()))  # the JIT's output buffer: read before the next step overwrites it
        if i == 0:
            first = t1 - t0
        if i >= warmup:
            times.append((t1 - t0) * 1e3)
    if not all(math.isfinite(v) for v in losses):
        raise RuntimeError(f"tinygrad {name}: non-finite loss {losses}")
    return (statistics.median(times) if times else math.nan), losses, first


# ---------------------------------------------------------------- self-check and full-size timing

SMALL = {
    "cruncher": {"batch": 8, "d": 32, "layers": 2},
    "mlp": {"batch": 8, "d_in": 20, "hidden": 16, "classes": 10},
    "gpt": {"batch": 2, "seq": 16, "vocab": 64, "d": 32, "heads": 2, "layers": 2},
}


def random_weights(name, dims, rng):
    """Weights in napkin's naming, at napkin's init scales; layernorm gains and all biases drawn away from 1 and 0
    so that a misplaced one shows in the loss."""
    def xavier(*shape):
        return (rng.standard_normal(shape) / math.sqrt(math.prod(shape[:-1]))).astype(np.float32)

    def normal(*shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)
    if name == "cruncher":
        w = {f"layers.{i}.w": xavier(dims["d"], dims["d"]) for i in range(dims["layers"])}
        w["final"] = xavier(dims["d"], 1)
        return w
    if name == "mlp":
        I, H, C = dims["d_in"], dims["hidden"], dims["classes"]
        return {"w1": xavier(I, H), "b1": normal(H, std=0.1), "w2": xavier(H, H), "b2": normal(H, std=0.1),
                "w3": xavier(H, C), "b3": normal(C, std=0.1)}
    D, T, V, L = dims["d"], dims["seq"], dims["vocab"], dims["layers"]
    small = 0.02 / math.sqrt(2 * L)
    w = {"wte": normal(V, D, std=0.02), "wpe": normal(T, D, std=0.02),
         "lnf_g": 1 + normal(D, std=0.1), "lnf_b": normal(D, std=0.1)}
    for i in range(L):
        w.update({f"blocks.{i}.ln1_g": 1 + normal(D, std=0.1), f"blocks.{i}.ln1_b": normal(D, std=0.1),
                  f"blocks.{i}.w_qkv": normal(D, 3 * D, std=0.02), f"blocks.{i}.w_proj": normal(D, D, std=small),
                  f"blocks.{i}.ln2_g": 1 + normal(D, std=0.1), f"blocks.{i}.ln2_b": normal(D, std=0.1),
                  f"blocks.{i}.w_fc": normal(D, 4 * D, std=0.02), f"blocks.{i}.w_out": normal(4 * D, D, std=small)})
    return w


def model_inputs(name, dims):
    """make_data's batches and random weights for these dims (a fresh generator per model: the same numbers
    whichever models run before it)."""
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="napkin-tinygrad-") as tmp:
        _, batches = tvt.make_data(name, tmp, rng)
    return batches, random_weights(name, dims, rng)


def selfcheck(only, tolerance=1e-4):
    """Losses against bench/train_vs_jax.py on small dims: the first two (before and after one update, what the
    benches compare with napkin's), and two more, because TinyJit runs step 0 plainly and captures step 1: steps
    2 and 3 are its replay, the code that is timed."""
    import train_vs_jax as tvj  # imports jax
    ok = True
    saved = dict(tvt.DIMS)
    # the math does not depend on BEAM (it picks kernel schedules); searching the small dims' kernels would take
    # minutes, so BEAM=0 unless the environment asked for a BEAM
    beam = Context(BEAM=0) if not BEAM_FROM_USER else Context()
    if not BEAM_FROM_USER:
        print("self-check with BEAM=0 (set BEAM in the environment to check with a search)")
    try:
        for name in only:
            dims = SMALL[name]
            tvt.DIMS[name] = dims  # make_data and the JAX losses read their dims from here
            batches, weights = model_inputs(name, dims)
            _, jax_losses, _ = tvj.time_jax(name, weights, tvj.jax_batches(batches), 4, 0)
            with beam:
                _, tg_losses, _ = time_tinygrad(name, dims, weights, batches, 4, 0)
            rel = [abs(a - b) / abs(a) for a, b in zip(jax_losses, tg_losses)]
            good = max(rel) <= tolerance
            ok = ok and good
            print(f"{name:8} {dims}:\n  jax      {jax_losses}\n  tinygrad {tg_losses}\n"
                  f"  relative difference: first two {max(rel[:2]):.2e}, replayed steps 3-4 {max(rel[2:]):.2e} "
                  f"({'agree' if good else 'DIFFER'}, tolerance {tolerance:g})", flush=True)
    finally:
        tvt.DIMS.clear()
        tvt.DIMS.update(saved)
    return ok


def time_full(only, warmup, steps):
    """A few steps of each model at its YAML size (train_vs_torch.DIMS), from random weights in napkin's naming."""
    for name in only:
        dims = tvt.DIMS[name]
        batches, weights = model_inputs(name, dims)
        t0 = time.perf_counter()
        ms, losses, first = time_tinygrad(name, dims, weights, batches, steps, warmup)
        total = time.perf_counter() - t0
        print(f"{name:8} {dims}: median step {ms:.1f} ms over {steps} replayed step(s), first step (compile) "
              f"{first:.1f} s, all {warmup + steps} steps {total:.1f} s, losses {[round(v, 4) for v in losses]}",
              flush=True)


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--selfcheck", action="store_true", help="losses vs train_vs_jax.py on small dims")
    ap.add_argument("--only", default="cruncher,mlp,gpt", help="models for --selfcheck")
    ap.add_argument("--time", default="", help="comma-separated models to time at full size, e.g. cruncher,mlp")
    ap.add_argument("--warmup", type=int, default=2, help="--time: untimed steps (TinyJit: compile, capture)")
    ap.add_argument("--steps", type=int, default=3, help="--time: timed (replayed) steps")
    args = ap.parse_args()
    print(describe(), flush=True)
    ok = True
    if args.selfcheck:
        ok = selfcheck([s for s in args.only.split(",") if s])
    if args.time:
        time_full([s for s in args.time.split(",") if s], args.warmup, args.steps)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
