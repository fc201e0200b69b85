#!/usr/bin/env python3
"""Training step time: napkin's generated trainer vs JAX (the whole step under jax.jit, XLA's CPU backend).

Run with the peers' venv (bench/peers/setup.sh): ~/.cache/napkin/bench-venv/bin/python bench/train_vs_jax.py

For each model (cruncher, mlp, gpt at their YAML sizes, fp32) the script
  1. builds napkin's trainer and writes the data (bench/train_vs_torch.py's
     make_data: the same npy or token files, and the same batches in order);
  2. has the trainer save its initial weights (--steps 0) and loads them into
     JAX, so both start from the same numbers;
  3. checks that JAX's first two losses (before any update, and after one)
     agree with napkin's on the same batches within --tolerance (relative):
     nobody is timed on a different computation;
  4. times WARMUP + STEPS steps of each, alternating (--rounds), and prints
     the median step, GFLOP/s from napkin's static FLOPs, the ratio
     jax/napkin (> 1: napkin is faster), and JAX's first call (compilation
     included) beside napkin's build time.

JAX's step is one jitted function (params, optimizer state, batch) ->
(params, optimizer state, loss) with the parameters and state donated, the
optimizers written out with torch.optim's formulas (as napkin's are:
passes/optimizer.h): Adagrad for cruncher, AdamW with no_decay groups for
mlp and gpt, global-norm clipping for gpt. XLA takes the cores the process
may use: bench/peers/check.py refuses JAX when that is not --threads.

Exit status 0 when every model's losses agreed and was timed, 1 otherwise.
"""
import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import check as peer_check  # noqa: E402
import train_vs_torch as tvt  # noqa: E402  (the data, the napkin side, the models' dims)

jax.config.update("jax_default_matmul_precision", "highest")  # f32 matmuls in f32, as napkin's


# ---------------------------------------------------------------- the models

def gelu(x):
    return 0.5 * x * (1 + jnp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-5) * g + b


def cross_entropy(logits, labels):
    lse = jax.nn.logsumexp(logits, axis=-1)
    return (lse - jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]).mean()


# The matmuls' precision. fp32: f32 operands, f32 products (matmul precision
# "highest", set above). bf16-mixed, as torch.autocast and napkin's policy:
# operands rounded to bf16, the product a bf16 activation; layernorm, softmax
# and the loss in f32; parameters, gradients and optimizer state f32.
def mm_fp32(a, b):
    return a @ b


def mm_bf16(a, b):
    return jnp.matmul(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16))


def cruncher_loss(p, x, y, dm, mm):
    for i in range(dm["layers"]):
        x = mm(x, p[f"layers.{i}.w"])
    return (((mm(x, p["final"]).astype(jnp.float32)).reshape(-1) - y) ** 2).mean()


def mlp_loss(p, images, labels, dm, mm):
    h1 = gelu(mm(images, p["w1"]) + p["b1"])
    h2 = gelu(mm(h1, p["w2"]) + p["b2"])
    return cross_entropy((mm(h2, p["w3"]) + p["b3"]).astype(jnp.float32), labels)


def gpt_loss(p, tokens, targets, dm, mm):
    B, T, D, H, L = dm["batch"], dm["seq"], dm["d"], dm["heads"], dm["layers"]
    HD = D // H
    x = (p["wte"][tokens] + p["wpe"][jnp.arange(T)]).reshape(B * T, D)
    mask = jnp.triu(jnp.ones((T, T), bool), k=1)
    for i in range(L):
        b = lambda n: p[f"blocks.{i}.{n}"]
        qkv = mm(layer_norm(x, b("ln1_g"), b("ln1_b")), b("w_qkv"))
        q, k, v = qkv.reshape(B, T, 3, H, HD).transpose(2, 0, 3, 1, 4)
        att = jnp.where(mask, -jnp.inf, mm(q, k.swapaxes(-1, -2)).astype(jnp.float32) / math.sqrt(HD))
        y = mm(jax.nn.softmax(att, axis=-1), v).transpose(0, 2, 1, 3).reshape(B * T, D)
        x = x + mm(y, b("w_proj"))
        x = x + mm(gelu(mm(layer_norm(x, b("ln2_g"), b("ln2_b")), b("w_fc"))), b("w_out"))
    logits = mm(layer_norm(x, p["lnf_g"], p["lnf_b"]), p["wte"].T).astype(jnp.float32)
    return cross_entropy(logits, targets.reshape(-1))


# ------------------------------------------------------------ the optimizers

def adagrad(lr, eps):
    def init(p):
        return {"sum": {k: jnp.zeros_like(v) for k, v in p.items()}}

    def update(p, s, g):
        new_sum = {k: s["sum"][k] + g[k] * g[k] for k in p}
        return {k: p[k] - lr * g[k] / (jnp.sqrt(new_sum[k]) + eps) for k in p}, {"sum": new_sum}
    return init, update


def adamw(lr, b1, b2, wd, no_decay, clip=0.0, eps=1e-8):
    def init(p):
        zeros = lambda: {k: jnp.zeros_like(v) for k, v in p.items()}  # separate buffers: both are donated
        return {"m": zeros(), "v": zeros(), "t": jnp.zeros((), jnp.float32)}

    def update(p, s, g):
        if clip > 0:
            norm = jnp.sqrt(sum(jnp.sum(x * x) for x in g.values()))
            coef = jnp.minimum(clip / (norm + 1e-6), 1.0)
            g = {k: x * coef for k, x in g.items()}
        t = s["t"] + 1
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        m = {k: b1 * s["m"][k] + (1 - b1) * g[k] for k in p}
        v = {k: b2 * s["v"][k] + (1 - b2) * g[k] * g[k] for k in p}
        out = {}
        for k in p:
            decay = 0.0 if any(tvt.glob_match(pat, k) for pat in no_decay) else wd
            q = p[k] * (1 - lr * decay)
            out[k] = q - (lr / bc1) * m[k] / (jnp.sqrt(v[k]) / jnp.sqrt(bc2) + eps)
        return out, {"m": m, "v": v, "t": t}
    return init, update


MODELS = {
    "cruncher": (cruncher_loss, adagrad(0.01, 1e-10)),
    "mlp": (mlp_loss, adamw(1e-3, 0.9, 0.999, 0.01, ["b*"])),
    "gpt": (gpt_loss, adamw(3e-4, 0.9, 0.95, 0.1, ["*_g", "*_b", "wpe"], clip=1.0)),
}


def jax_batches(batches):
    return [tuple(jnp.asarray(t.numpy().astype(np.int32) if t.dtype.is_floating_point is False else t.numpy())
                  for t in b) for b in batches]


def time_jax(name, weights, batches, steps, warmup, precision="fp32"):
    """The median step in ms, every loss, and the first call's seconds (jit compilation in it).
    name: a train_vs_torch.DIMS entry (gpt-d512 is a gpt at its dims)."""
    if tvt.kind(name) not in MODELS:
        raise NotImplementedError(f"no JAX formulation of {name} here")
    loss_fn, (opt_init, opt_update) = MODELS[tvt.kind(name)]
    dm, mm = tvt.DIMS[name], (mm_bf16 if precision == "bf16-mixed" else mm_fp32)

    def step(p, s, inputs):
        loss, g = jax.value_and_grad(loss_fn)(p, *inputs, dm, mm)
        p, s = opt_update(p, s, g)
        return p, s, loss

    jstep = jax.jit(step, donate_argnums=(0, 1))
    names = set(MODELS_PARAMS(name, weights))  # napkin's checkpoint also holds its optimizer state
    p = {k: jnp.asarray(v) for k, v in weights.items() if k in names}
    s = opt_init(p)
    times, losses, first = [], [], 0.0
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        p, s, loss = jstep(p, s, batches[i % len(batches)])
        loss = float(loss)  # waits for the step
        t1 = time.perf_counter()
        losses.append(loss)
        if i == 0:
            first = t1 - t0
        if i >= warmup:
            times.append((t1 - t0) * 1e3)
    return statistics.median(times), losses, first


def napkin_first_losses(trainer, name, tmp, data_flags, n):
    metrics = os.path.join(tmp, f"{name}.first.jsonl")
    tvt.run([trainer, "--steps", str(n), "--seed", "0", *data_flags, "--order", "sequential", "--log-every", "1",
             "--metrics", metrics, "--threads", "2", "--quiet", "--checkpoint-every", "0"], "napkin trainer")
    return [json.loads(line)["loss"] for line in open(metrics) if '"loss"' in line]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--napkin", default=os.path.join(ROOT, "build/tools/napkin"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default="")
    ap.add_argument("--tolerance", type=float, default=1e-4, help="relative, on the first two losses")
    args = ap.parse_args()
    only = [s for s in args.only.split(",") if s] or list(MODELS)
    sys.stdout.reconfigure(line_buffering=True)
    what, backend, threads, gflops, problems = peer_check.check_jax(args.threads, 0)
    print(f"peer: {what}, {backend}, {threads} threads, 1024^3 matmul {gflops:.1f} GFLOP/s")
    if problems:
        print("refused: " + "; ".join(problems), file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    tmp = tempfile.mkdtemp(prefix="napkin-jax-bench-")
    results, failed = [], False
    for name in only:
        yaml = tvt.MODELS[name][0]
        print(f"\n== {name} ({yaml})")
        mdir = os.path.join(tmp, name)
        os.makedirs(mdir)
        data_flags, batches = tvt.make_data(name, mdir, rng)
        batches = jax_batches(batches)
        flops = tvt.napkin_flops(args.napkin, yaml)
        t0 = time.perf_counter()
        trainer = tvt.build_trainer(args.napkin, name, yaml, mdir)
        build_s = time.perf_counter() - t0
        init_dir = os.path.join(mdir, "init")
        tvt.run([trainer, "--steps", "0", "--seed", "0", "--checkpoint-dir", init_dir, *data_flags, "--quiet"],
                "napkin --steps 0")
        weights = tvt.read_safetensors(os.path.join(init_dir, "step-000000.safetensors"))
        napkin_losses = napkin_first_losses(trainer, name, mdir, data_flags, 2)
        _, jax_losses, _ = time_jax(name, weights, batches, 2, 0)
        worst = max(abs(a - b) / abs(a) for a, b in zip(napkin_losses, jax_losses[:2]))
        agree = worst <= args.tolerance
        print(f"first losses: napkin {napkin_losses}, jax {jax_losses[:2]}: relative difference {worst:.2e} "
              f"({'agree' if agree else 'DIFFER'}, tolerance {args.tolerance:g})")
        if not agree:
            failed = True
            continue
        napkin_ms, jax_ms, first = math.inf, math.inf, 0.0
        for r in range(args.rounds):
            ms = tvt.time_napkin(trainer, name, mdir, data_flags, args.steps, args.warmup, args.threads, r)
            napkin_ms = min(napkin_ms, ms)
            jms, losses, f = time_jax(name, weights, batches, args.steps, args.warmup)
            first = first or f
            jax_ms = min(jax_ms, jms)
            print(f"round {r + 1}: napkin {ms:.2f} ms, jax {jms:.2f} ms (loss {losses[0]:.4f} -> {losses[-1]:.4f})")
        results.append((name, flops, napkin_ms, jax_ms, build_s, first))

    print(f"\nmedian step (best of {args.rounds} rounds), fp32, {args.threads} threads")
    print(f"{'model':9} {'GFLOP/step':>10} {'napkin ms':>10} {'jax ms':>9} {'jax/napkin':>10} {'napkin GF/s':>11} "
          f"{'jax GF/s':>9} {'napkin build':>12} {'jax first call':>14}")
    for name, flops, n, j, b, f in results:
        print(f"{name:9} {flops / 1e9:10.3f} {n:10.2f} {j:9.2f} {j / n:9.2f}x {flops / n / 1e6:11.1f} "
              f"{flops / j / 1e6:9.1f} {b:11.2f}s {f:13.2f}s")
    return 1 if failed or len(results) < len(only) else 0


def MODELS_PARAMS(name, weights):
    """The trainable parameters in a checkpoint (optimizer state is for napkin only)."""
    state = ("adam.", "adagrad.", "optimizer.", "momentum.", "rmsprop.")
    return [k for k in weights if not k.startswith(state)]


if __name__ == "__main__":
    sys.exit(main())
