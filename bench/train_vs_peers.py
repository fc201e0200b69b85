#!/usr/bin/env python3
"""Training step time: napkin's trainers against the compilers a user would pick instead, side by side.

Run with the peers' venv (bash bench/peers/setup.sh makes it):
    ~/.cache/napkin/bench-venv/bin/python bench/train_vs_peers.py [--only gpt,gpt-d512] [--precision bf16-mixed]

The peers, each as its users run it on a CPU:
  torch.compile  PyTorch 2, inductor on the loss (forward and, through AOTAutograd, backward) and on the
                 update (bench/train_vs_torch.py's models; bf16-mixed is torch.autocast);
  jax            the whole step under one jax.jit, XLA's CPU backend (bench/train_vs_jax.py's models;
                 bf16-mixed: bf16 matmul operands and products, f32 elsewhere);
  tinygrad       the whole step under TinyJit (bench/peers/tinygrad_step.py: its LLVM CPU backend with BEAM=1
                 kernel search, whose results tinygrad caches on disk, so only the first run pays the search;
                 fp32 only: it has no bf16 dot product on this CPU; one core: 0.14 runs every kernel on one
                 worker thread).

For each model (cruncher, mlp, gpt, llama and moe at their YAML sizes; gpt-d512: gpt.yaml at d=512, T=256,
8 heads, batch 8; moe: models/moe.yaml, 8 experts top-2 at capacity factor 1.25, whose torch side routes with the
same capacity and drops, bench/train_vs_torch.py moe_layer) and precision the script
  1. checks each peer's configuration first (bench/peers/check.py: BLAS, threads, matmul speed); a peer
     on a reference BLAS or the wrong thread count is refused, not timed;
  2. builds napkin's trainer (timed: napkin's compile time) and writes the data: the same batches, in
     order, for every side;
  3. has the trainer save its initial weights (--steps 0) and loads them into every peer; each peer's
     first two losses (before and after one update) must agree with napkin's (relative 1e-4 and 1e-3 in
     fp32, see TOLERANCE; 2e-2 in bf16-mixed) or it is not timed: nobody is timed on another computation;
  4. times WARMUP + STEPS steps of napkin and of each peer in alternating rounds (so that all see the
     same background load); each side's time is its best median over the rounds;
  5. prints one table: step ms, achieved GFLOP/s from napkin's static FLOP count (the same numerator
     for every side), % of the GEMM peak napkin's trainer was built with (measured on this machine by
     `napkin devices --measure`: bf16 for bf16-mixed, fp32 otherwise), the ratio peer/napkin (> 1:
     napkin is faster), and each side's compile time (napkin's build; a peer's first step).

The targets of issue 20 are printed under the table: napkin at least 1.0x the best peer on every model
in fp32, at least 1.5x on gpt in bf16-mixed; issue 41's: at least 1.2x on moe, with the share of napkin's
step in the experts' batched GEMMs (one --profile run).

Exit status: 0 when everything ran and agreed, 1 when a side failed or disagreed, 2 when no peer was usable.
"""
import argparse
import json
import math
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))

import check as peer_check  # noqa: E402
import train_vs_torch as tvt  # noqa: E402

MODELS = ["cruncher", "mlp", "gpt", "gpt-d512", "llama", "moe"]
PEERS = ["torch.compile", "jax", "tinygrad"]
# Relative, on (the first loss, the loss after one update). The first is a forward pass. The second also
# carries the first update, which Adagrad (cruncher) makes nearly a sign function of each gradient
# element (lr g / sqrt(g^2)): elements near zero move by +-lr on either side's rounding, so fp32 sides
# differ there by up to ~1e-4 (tinygrad's matmul sums in another order: 1.5e-4 on cruncher).
TOLERANCE = {"fp32": (1e-4, 1e-3), "bf16-mixed": (2e-2, 2e-2)}


def percent_of_peak(gflops, peak):
    """The %peak cell: never above 100%. A rate above the peak means the device file's peak is not this
    machine's (as the trainer says with its "> peak"): rerun `napkin devices --measure` here."""
    if peak <= 0:
        return f"{'-':>6}"
    pct = 100 * gflops * 1e9 / peak
    return f"{pct:6.1f}" if pct <= 100 else f"{'>peak':>6}"


def yaml_of(name):
    if name in tvt.GPT_VARIANTS:
        return tvt.GPT_VARIANTS[name][0]
    return tvt.LLAMA[name][0] if name in tvt.LLAMA else tvt.MODELS[name][0]


class Peer:
    """One peer: its name, the check's verdict, and step(): a measurement in a process of its own.

    Each measurement runs in a fresh Python process (this script with --worker): PyTorch's OpenMP
    threads and XLA's thread pool spin-wait after their work, so peers sharing a process steal each
    other's cores (torch.compile's mlp step measured 10x slower next to JAX). A fresh process also
    makes each peer's first step a cold compile in the first round (TORCHINDUCTOR_CACHE_DIR points
    into the run's temp dir)."""

    def __init__(self, name, threads):
        self.name, self.threads, self.refused, self.describe = name, threads, None, ""
        try:
            if name == "torch.compile":
                what, backend, n, gflops, problems = peer_check.check_torch(threads, 20.0)
            elif name == "jax":
                what, backend, n, gflops, problems = peer_check.check_jax(threads, 0)
            elif name == "tinygrad":
                what, backend, n, gflops, problems = peer_check.check_tinygrad(threads, 0)
            else:
                raise ValueError(name)
        except ImportError as e:
            self.refused = f"not importable here ({e}); bash bench/peers/setup.sh installs it"
            return
        self.describe = f"{what}, {backend}, {n} threads, 1024^3 f32 matmul {gflops:.1f} GFLOP/s"
        if problems:
            self.refused = "; ".join(problems)

    def step(self, name, work, steps, warmup, precision):
        """(median ms, losses, first step seconds) of steps + warmup steps from napkin's initial weights
        on the batches in `work`; NotImplementedError where the peer lacks the precision."""
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", self.name, "--only", name, "--precision",
               precision, "--steps", str(steps), "--warmup", str(warmup), "--threads", str(self.threads),
               "--work", work]
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(os.path.dirname(work), "inductor-cache"))
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        if r.returncode != 0 or not last.startswith("{"):
            tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-12:])
            raise tvt.NapkinError(f"{self.name} worker failed (exit status {r.returncode}):\n{tail}")
        out = json.loads(last)
        if "not_implemented" in out:
            raise NotImplementedError(out["not_implemented"])
        return out["ms"], out["losses"], out["first"]


def worker(args):
    """--worker PEER: one measurement, printed as JSON on the last line of stdout (and what the peer ran
    on, on stderr)."""
    name, precision = args.only, args.precision
    weights = tvt.read_safetensors(os.path.join(args.work, "init", "step-000000.safetensors"))
    with open(os.path.join(args.work, "batches.pkl"), "rb") as f:
        import torch
        batches = [tuple(torch.from_numpy(a) for a in b) for b in pickle.load(f)]
    try:
        if args.worker == "torch.compile":
            torch.set_num_threads(args.threads)
            ms, losses, first = tvt.time_torch(name, batches, args.steps, args.warmup, True, precision, True, weights)
        elif args.worker == "jax":
            import train_vs_jax as tvj
            ms, losses, first = tvj.time_jax(name, weights, tvj.jax_batches(batches), args.steps, args.warmup,
                                             precision)
        else:
            import tinygrad_step
            print(f"tinygrad: {tinygrad_step.describe()}", file=sys.stderr)
            ms, losses, first = tinygrad_step.time_tinygrad(tvt.kind(name), tvt.DIMS[name], weights, batches,
                                                            args.steps, args.warmup, precision)
    except NotImplementedError as e:
        print(json.dumps({"not_implemented": str(e)}))
        return 0
    print(json.dumps({"ms": ms, "losses": [float(v) for v in losses], "first": first}))
    return 0


def trainer_peak(trainer):
    program = json.loads(tvt.run([trainer, "--print-program"], "trainer --print-program"))
    return float(program["peak_flops"]), program.get("peak_source", "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--napkin", default=os.path.join(ROOT, "build/tools/napkin"))
    ap.add_argument("--only", default=",".join(MODELS), help=f"models, comma-separated (default {','.join(MODELS)})")
    ap.add_argument("--precision", default="fp32,bf16-mixed", help="comma-separated: fp32, bf16-mixed")
    ap.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated (default {','.join(PEERS)})")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per round (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds; each side's best median (default 2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tinygrad-models", default="cruncher,mlp,gpt",
                    help="the models tinygrad is timed on (default cruncher,mlp,gpt: its kernel search (BEAM=1) "
                         "takes about 16 minutes for gpt's step the first time, longer for gpt-d512)")
    ap.add_argument("--slow-peer-steps", type=int, default=3,
                    help="timed steps for a peer whose first timed round took over a minute (default 3)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one peer's measurement (Peer.step)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    models = [m for m in args.only.split(",") if m]
    precisions = [p for p in args.precision.split(",") if p]
    bad = [m for m in models if m not in MODELS] + [p for p in precisions if p not in TOLERANCE]
    if bad:
        ap.error(f"unknown: {', '.join(bad)} (models: {', '.join(MODELS)}; precisions: {', '.join(TOLERANCE)})")
    sys.stdout.reconfigure(line_buffering=True)

    peers = []
    for name in [p for p in args.peers.split(",") if p]:
        peer = Peer(name, args.threads)
        print(f"peer {name}: {peer.describe or ''}" + (f"  REFUSED: {peer.refused}" if peer.refused else "  ok"))
        if not peer.refused:
            peers.append(peer)
    if not peers:
        print("no usable peer", file=sys.stderr)
        return 2
    load = os.getloadavg()[0]
    print(f"{args.threads} threads; {args.warmup} warmup + {args.steps} timed steps, median, best of {args.rounds} "
          f"alternating rounds; load average {load:.2f} at the start"
          + (" (other processes share the CPU: times are noisy, all sides alike)" if load > 0.5 else ""))

    rng = np.random.default_rng(0)
    tmp = tempfile.mkdtemp(prefix="napkin-peers-bench-")
    rows, failed = [], False
    try:
        for name in models:
            for precision in precisions:
                print(f"\n== {name} {precision} ({yaml_of(name)}: "
                      + ", ".join(f"{k}={v}" for k, v in tvt.DIMS[name].items()) + ")")
                mdir = os.path.join(tmp, f"{name}-{precision}")
                os.makedirs(mdir)
                try:
                    row = run_model(args, name, precision, mdir, rng, peers)
                except tvt.NapkinError as e:
                    print(f"error: {e}", file=sys.stderr)
                    failed = True
                    continue
                failed |= row["failed"]
                rows.append(row)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(args, rows, peers)
    return 1 if failed else 0


def run_model(args, name, precision, mdir, rng, peers):
    yaml = tvt.precision_yaml(yaml_of(name), precision, mdir)
    dims = tvt.napkin_dims(name)
    data_flags, batches = tvt.make_data(name, mdir, rng)
    with open(os.path.join(mdir, "batches.pkl"), "wb") as f:  # for the peers' worker processes
        pickle.dump([tuple(t.numpy() for t in b) for b in batches], f)
    flops = tvt.napkin_flops(args.napkin, yaml, dims)
    t0 = time.perf_counter()
    trainer = tvt.build_trainer(args.napkin, name, yaml, mdir, dims)
    build_s = time.perf_counter() - t0
    if precision != "fp32":
        tvt.check_low_precision_matmuls(trainer, precision)
    peak, peak_source = trainer_peak(trainer)
    _, napkin_losses = tvt.napkin_start(trainer, name, mdir, data_flags)  # writes mdir/init: the peers' weights
    row = {"name": name, "precision": precision, "flops": flops, "peak": peak, "peak_source": peak_source,
           "napkin": {"ms": math.inf, "compile": build_s}, "peers": {}, "failed": False}

    timed = []
    for peer in peers:
        result = row["peers"][peer.name] = {"ms": math.inf, "compile": None, "note": ""}
        if peer.name == "tinygrad" and name not in args.tinygrad_models.split(","):
            result["note"] = "not run (--tinygrad-models)"
            continue
        try:
            _, losses, first = peer.step(name, mdir, 2, 0, precision)
        except NotImplementedError as e:
            result["note"] = f"n/a: {e}"
            print(f"{peer.name}: {result['note']}")
            continue
        diffs = [abs(a - b) / abs(a) for a, b in zip(napkin_losses, losses[:2])]
        worst = max(diffs)
        agree = len(diffs) == 2 and all(d <= t for d, t in zip(diffs, TOLERANCE[precision]))
        print(f"{peer.name}: first losses {[round(v, 6) for v in losses[:2]]} vs napkin's "
              f"{[round(v, 6) for v in napkin_losses]}: relative differences {diffs[0]:.1e}, {diffs[1]:.1e} "
              f"({'agree' if agree else 'DIFFER, not timed'}; tolerances {TOLERANCE[precision][0]:g}, "
              f"{TOLERANCE[precision][1]:g})")
        if not agree:
            result["note"] = f"losses differ by {worst:.1e}"
            row["failed"] = True
            continue
        result["loss_diff"] = worst
        result["compile"] = first  # the first step of the peer's first process: a cold compile
        timed.append(peer)

    steps = {peer.name: args.steps for peer in timed}
    for r in range(args.rounds):
        ms = tvt.time_napkin(trainer, name, mdir, data_flags, args.steps, args.warmup, args.threads, r)
        row["napkin"]["ms"] = min(row["napkin"]["ms"], ms)
        line = [f"round {r + 1}: napkin {ms:.2f} ms"]
        for peer in timed:
            t0 = time.perf_counter()
            pms, losses, _ = peer.step(name, mdir, steps[peer.name], args.warmup, precision)
            result = row["peers"][peer.name]
            result["ms"] = min(result["ms"], pms)
            if time.perf_counter() - t0 > 60 and steps[peer.name] > args.slow_peer_steps:
                steps[peer.name] = args.slow_peer_steps
                result["note"] = f"{args.slow_peer_steps} timed steps after round 1 (slow)"
            line.append(f"{peer.name} {pms:.2f} ms (loss {losses[0]:.4f} -> {losses[-1]:.4f})")
        print(", ".join(line))
    if "experts" in tvt.DIMS[name]:
        row["expert_gemm_share"] = expert_gemm_share(trainer, name, mdir, data_flags, args)
    return row


def expert_gemm_share(trainer, name, mdir, data_flags, args):
    """The share of napkin's kernel time per step in the experts' batched GEMMs (matmul kernels batched over the
    experts axis, forward and backward), from one --profile run of the trainer."""
    metrics = os.path.join(mdir, f"{name}.profile.jsonl")
    tvt.run([trainer, "--steps", str(args.warmup + args.steps), "--seed", "0", *data_flags, "--order", "sequential",
             "--threads", str(args.threads), "--quiet", "--checkpoint-every", "0", "--eval-every", "0", "--profile",
             "--metrics", metrics], f"napkin --profile for {name}", timeout=900)
    kernel_ms = [json.loads(line)["kernel_ms"] for line in open(metrics) if '"profile"' in line][-1]
    program = json.loads(tvt.run([trainer, "--print-program"], "trainer --print-program"))
    experts = tvt.DIMS[name]["experts"]
    grouped = [i for i, k in enumerate(program["kernels"])
               if k["kind"] == "matmul" and k["matmul"].get("batch") == [experts]]
    return {"kernels": len(grouped), "ms": sum(kernel_ms[i] for i in grouped), "total_ms": sum(kernel_ms)}


def print_table(args, rows, peers):
    print(f"\nmedian step (best of {args.rounds} rounds), {args.threads} threads. GFLOP/s: napkin's static FLOPs "
          "per step / step time, for every side. %peak: of the GEMM peak napkin's trainer was built with "
          "(napkin devices --measure). ratio: side / napkin (> 1: napkin is faster). compile: napkin's build, "
          "a peer's first step.")
    header = (f"{'model':9} {'precision':10} {'GFLOP':>7}  {'side':13} {'step ms':>9} {'GFLOP/s':>8} {'%peak':>6} "
              f"{'ratio':>7} {'compile':>8}  note")
    print(header)
    print("-" * len(header))
    verdicts = []
    for row in rows:
        n = row["napkin"]
        sides = [("napkin", n["ms"], n["compile"], "")]
        sides += [(p.name, row["peers"][p.name]["ms"], row["peers"][p.name]["compile"], row["peers"][p.name]["note"])
                  for p in peers if p.name in row["peers"]]
        for i, (side, ms, compile_s, note) in enumerate(sides):
            timed = math.isfinite(ms)
            gfs = row["flops"] / (ms * 1e-3) / 1e9 if timed else None
            first = i == 0  # the model's cells on its first line only
            cells = [f"{row['name'] if first else '':9}", f"{row['precision'] if first else '':10}",
                     f"{row['flops'] / 1e9:7.2f}" if first else f"{'':7}", f"{side:13}",
                     f"{ms:9.2f}" if timed else f"{'-':>9}", f"{gfs:8.1f}" if timed else f"{'-':>8}",
                     percent_of_peak(gfs, row["peak"]) if timed else f"{'-':>6}",
                     f"{ms / n['ms']:6.2f}x" if timed and math.isfinite(n["ms"]) else f"{'-':>7}",
                     f"{compile_s:7.1f}s" if compile_s is not None else f"{'-':>8}"]
            print(" ".join(cells[:3]) + "  " + " ".join(cells[3:]) + (f"  {note}" if note else ""))
        best = min((row["peers"][p]["ms"], p) for p in row["peers"]) if row["peers"] else (math.inf, None)
        if math.isfinite(best[0]) and math.isfinite(n["ms"]):
            target, issue = 1.0, 20
            if row["name"] == "gpt" and row["precision"] == "bf16-mixed":
                target = 1.5
            if row["name"] == "moe":  # issue 41: at least 1.2x torch.compile of the same mixture of experts
                target, issue = 1.2, 41
            ratio = best[0] / n["ms"]
            verdicts.append(f"{row['name']} {row['precision']}: napkin {ratio:.2f}x the best peer ({best[1]}); "
                            f"issue {issue}'s target {target:.1f}x: {'MET' if ratio >= target else 'NOT MET'}")
    peaks = {row["precision"]: (row["peak"], row["peak_source"]) for row in rows}
    for precision, (peak, source) in peaks.items():
        print(f"\n%peak in {precision}: of {peak / 1e9:.1f} GFLOP/s, {source}")
    for row in rows:
        share = row.get("expert_gemm_share")
        if share:
            print(f"\n{row['name']} {row['precision']}: the experts' batched GEMMs ({share['kernels']} kernels, forward "
                  f"and backward) take {share['ms']:.2f} of napkin's {share['total_ms']:.2f} ms of kernels per step "
                  f"({100 * share['ms'] / share['total_ms']:.1f}%; --profile)")
    if verdicts:
        print("\n" + "\n".join(verdicts))


if __name__ == "__main__":
    sys.exit(main())
