#!/usr/bin/env python3
"""Data parallel on this machine: the report's predicted all-reduce against
what `mpirun -np N` measures (docs/distributed.md, "What it costs").

1. bench/allreduce_mpi.cpp (built with mpicxx) times MPI_Allreduce alone on N
   ranks: the figure the `shm` interconnect row of the report was set from.
2. models/gpt.yaml's trainer runs on N ranks (--threads 1 each, so the ranks
   do not share cores) and prints the mean seconds its gradient all-reduce
   took (the metrics' "all_reduce" record).
3. `napkin report models/gpt.yaml --device cpu --ranks N --interconnect shm`
   predicts that all-reduce (plain data parallel's comm time) and the step.
4. The same job with --zero 1: each rank's peak resident memory with and
   without it, against the report's per-rank ZeRO-1 saving.

--memory instead: memory per rank (docs/distributed.md, "Memory per rank").
A model whose states dominate (gpt.yaml at d=1024, layers 8, batch 4: 101M
parameters, 1.5 GiB of f32 states; --memory-dims sets another), built with
--zero 3, runs every stage 0-3 on 2 and 4 ranks (--threads 1, 2 steps);
each rank's measured peak resident memory (VmHWM) beside the trainer's own
prediction (runtime/rank_memory.h) and `napkin report --zero 3 --ranks N`'s
per-rank peak, with their ratios.

--times instead: the step under each ZeRO stage (plain data parallel,
--zero 1, 2 and 3, and 3 with --keep-gathered) against one process alone
plus the report's communication for the stage.

Prints both and their ratio. Needs Open MPI's mpirun (and mpicxx, from
libopenmpi-dev, for step 1; without it step 1 is skipped).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpirun(ranks):
    # A thread waiting in MPI yields its core: ZeRO-3's collectives thread shares the cores with the kernels.
    cmd = ["mpirun", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np", str(ranks)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    return cmd


def run(cmd, **kw):
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stdout}{r.stderr}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--napkin", default=os.path.join(ROOT, "build/tools/napkin"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--memory", action="store_true", help="only the memory per rank table")
    ap.add_argument("--memory-dims", default="d=1024,layers=8,batch=4")
    ap.add_argument("--times", action="store_true", help="only the step time per ZeRO stage")
    args = ap.parse_args()
    if shutil.which("mpirun") is None:
        sys.exit("mpirun not found: apt-get install openmpi-bin")
    tmp = tempfile.mkdtemp(prefix="napkin-dp-bench-")
    if args.memory:
        memory_per_rank(args, tmp)
        shutil.rmtree(tmp)
        return
    if args.times:
        report = json.loads(run([args.napkin, "report", "models/gpt.yaml", "--device", "cpu", "--ranks",
                                 str(args.ranks), "--interconnect", "shm", "--json", "--no-ops"]))
        stage_times(args, tmp, report["distributed"])
        shutil.rmtree(tmp)
        return

    if shutil.which("mpicxx"):
        exe = os.path.join(tmp, "allreduce_mpi")
        run(["mpicxx", "-O2", "-o", exe, os.path.join(ROOT, "bench/allreduce_mpi.cpp")])
        print(f"MPI_Allreduce alone, {args.ranks} ranks (bench/allreduce_mpi.cpp):")
        print(run(mpirun(args.ranks) + [exe]), end="")
    else:
        print("mpicxx not found (libopenmpi-dev): skipping the MPI_Allreduce microbenchmark")

    trainer = os.path.join(tmp, "gpt-trainer")
    run([args.napkin, "build", "models/gpt.yaml", "-o", trainer, "--quiet"])
    metrics = os.path.join(tmp, "metrics.jsonl")
    out = run(mpirun(args.ranks) + [trainer, "--threads", "1", "--steps", str(args.steps), "--checkpoint-every", "0",
                                    "--log-every", str(args.steps), "--metrics", metrics])
    records = [json.loads(line) for line in open(metrics)]
    measured = next(r for r in records if r.get("all_reduce"))
    summary = next(r for r in records if r.get("summary"))
    print(out.strip().splitlines()[-1])

    report = json.loads(run([args.napkin, "report", "models/gpt.yaml", "--device", "cpu", "--ranks", str(args.ranks),
                             "--interconnect", "shm", "--json", "--no-ops"]))
    d = report["distributed"]
    predicted_ms = d["stages"][0]["comm_s"] * 1e3
    print()
    print(f"gpt.yaml, {args.ranks} ranks on shm, {measured['bytes'] / 2**20:.1f} MiB of f32 gradients a step:")
    print(f"  all-reduce  predicted {predicted_ms:8.3f} ms   measured {measured['mean_ms']:8.3f} ms "
          f"(mean of {args.steps})   measured/predicted {measured['mean_ms'] / predicted_ms:.2f}")
    print(f"  step        predicted {d['stages'][0]['step_s'] * 1e3:8.1f} ms   measured {summary['measured_step_ms']:8.1f} ms "
          f"(median)   measured/predicted {summary['measured_step_ms'] / (d['stages'][0]['step_s'] * 1e3):.2f}")
    print("  (the trainer all-reduces after the whole backward; the report's step hides what it can behind it)")

    # ZeRO-1: each rank's peak resident memory with and without it, against the report's per-rank figures.
    peaks = {}
    for zero in (0, 1):
        m = os.path.join(tmp, f"zero{zero}.jsonl")
        run(mpirun(args.ranks) + [trainer, "--threads", "1", "--steps", "4", "--checkpoint-every", "0", "--quiet",
                                  "--zero", str(zero), "--metrics", m])
        peaks[zero] = next(json.loads(line) for line in open(m) if "peak_resident_bytes" in line)["peak_resident_bytes"]
    stages = d["stages"]
    predicted = (stages[0]["peak_bytes"] - stages[1]["peak_bytes"]) / 2**20
    print()
    print(f"ZeRO-1 on {args.ranks} ranks: peak resident memory per rank (MiB)")
    print("  plain   " + "  ".join(f"{b / 2**20:7.1f}" for b in peaks[0]))
    print("  zero 1  " + "  ".join(f"{b / 2**20:7.1f}" for b in peaks[1]))
    print("  saved   " + "  ".join(f"{(a - b) / 2**20:7.1f}" for a, b in zip(peaks[0], peaks[1])) +
          f"   (the report: {predicted:.1f} MiB a rank, the optimizer state's (N-1)/N)")
    shutil.rmtree(tmp)


def stage_times(args, tmp, d):
    """5. The step under each ZeRO stage on the same ranks: plain data parallel,
    --zero 1 and 2 (the plain trainer) and --zero 3 (a trainer built with
    --zero 3: its gathers issued ahead of their use, or each right before it
    with --no-prefetch, or its backward reading the forward's copies with
    --keep-gathered), each rank on one thread. The prediction is the
    measured single-process step (--threads 1) plus what the collectives add
    to it: for stages 0-2 the report's comm column (the CPU trainer overlaps
    none of them), for ZeRO-3 the report's zero-3 section's exposed time
    (its time model of the prefetch), printed beside the report's own step
    (which hides what it can, as a GPU trainer would)."""
    builds = {"plain": [], "zero3": ["--zero", "3"], "late": ["--zero", "3", "--no-prefetch"],
              "keep": ["--zero", "3", "--keep-gathered"]}
    trainers, exposed = {}, {}
    for name, flags in builds.items():
        trainers[name] = os.path.join(tmp, f"gpt-{name}")
        run([args.napkin, "build", "models/gpt.yaml", "-o", trainers[name], "--quiet"] + flags)
        if name != "plain":
            report = json.loads(run([args.napkin, "report", "models/gpt.yaml", "--device", "cpu", "--ranks",
                                     str(args.ranks), "--interconnect", "shm", "--json", "--no-ops"] + flags))
            exposed[name] = report["zero3"]["exposed_seconds"] * 1e3
    steps = ["--threads", "1", "--steps", str(args.steps), "--checkpoint-every", "0", "--quiet"]

    def measure(launcher, trainer, flags, name):
        m = os.path.join(tmp, f"{name}.jsonl")
        run(launcher + [trainer] + steps + flags + ["--metrics", m])
        records = [json.loads(line) for line in open(m)]
        step_ms = next(r for r in records if r.get("summary"))["measured_step_ms"]
        comm = next((r for r in records if r.get("zero3_collectives")), None)
        reduce = next((r for r in records if r.get("all_reduce")), None)
        comm_ms = (comm["gather_ms_per_step"] + comm["reduce_ms_per_step"]) if comm else (reduce["mean_ms"] if reduce else 0)
        waited_ms = comm["wait_ms_per_step"] if comm else comm_ms
        return step_ms, comm_ms, waited_ms

    alone, _, _ = measure([], trainers["plain"], [], "alone")
    print()
    print(f"The step per ZeRO stage, gpt.yaml on {args.ranks} ranks over shm, --threads 1 each "
          f"(one process alone: {alone:.1f} ms a step, median of {args.steps}):")
    print(f"  {'stage':<24} {'step ms':>8} {'collectives ms':>15} {'waited ms':>10} {'pred. waited':>12} "
          f"{'predicted ms':>13} {'meas/pred':>9} {'report step ms':>15}")
    rows = [("data parallel", "plain", ["--zero", "0"], 0), ("ZeRO-1", "plain", ["--zero", "1"], 1),
            ("ZeRO-2", "plain", ["--zero", "2"], 2), ("ZeRO-3", "zero3", [], 3),
            ("ZeRO-3 --no-prefetch", "late", [], 3), ("ZeRO-3 --keep-gathered", "keep", [], 3)]
    for label, build, flags, stage in rows:
        step_ms, comm_ms, waited_ms = measure(mpirun(args.ranks), trainers[build], flags, f"{build}{stage}")
        s = d["stages"][stage]
        added = exposed.get(build, s["comm_s"] * 1e3)
        predicted = alone + added
        print(f"  {label:<24} {step_ms:8.1f} {comm_ms:15.2f} {waited_ms:10.2f} {added:12.2f} {predicted:13.1f} "
              f"{step_ms / predicted:9.2f} {s['step_s'] * 1e3:15.1f}", flush=True)
    print("  (collectives: what the trainer timed in MPI, the wait for the slower rank included: the all-reduce or "
          "ZeRO-2's reduce-scatters, ZeRO-3's gathers and reduces (on its collectives thread); ZeRO-1/2's parameter "
          "broadcast after the update is not timed apart. waited: what the rank's kernels waited for them (ZeRO-3; "
          "the others block the rank). pred. waited: the report's comm (stages 0-2, ring collectives at shm's "
          "bandwidth, none hidden) or its zero-3 section's exposed time (its time model of the prefetch))")


def memory_per_rank(args, tmp):
    trainer = os.path.join(tmp, "gpt-zero3")
    run([args.napkin, "build", "models/gpt.yaml", "--dims", args.memory_dims, "--zero", "3", "-o", trainer, "--quiet"])
    print(f"gpt.yaml at {args.memory_dims}, built with --zero 3: peak resident memory per rank (MiB; the largest "
          "rank's, and the range over ranks)")
    print(f"{'stage':>6} {'ranks':>5} {'measured':>18} {'trainer':>8} {'ratio':>6} {'arena':>8} {'report':>8} "
          f"{'ratio':>6}")
    for ranks in (2, 4):
        report = json.loads(run([args.napkin, "report", "models/gpt.yaml", "--dims", args.memory_dims, "--zero", "3",
                                 "--device", "cpu", "--ranks", str(ranks), "--interconnect", "shm", "--json",
                                 "--no-ops"]))
        for zero in range(4):
            m = os.path.join(tmp, f"memory-{ranks}-{zero}.jsonl")
            run(mpirun(ranks) + [trainer, "--threads", "1", "--steps", "2", "--checkpoint-every", "0", "--quiet",
                                 "--zero", str(zero), "--metrics", m])
            r = next(json.loads(line) for line in open(m) if "predicted_resident_bytes" in line)
            measured, predicted, arena = r["peak_resident_bytes"], r["predicted_resident_bytes"], r["predicted_arena_bytes"]
            worst = max(range(ranks), key=lambda i: measured[i])
            statically = report["distributed"]["stages"][zero]["peak_bytes"]
            mib = 2**20
            print(f"{zero:>6} {ranks:>5} {measured[worst] / mib:8.1f} ({min(measured) / mib:.0f}-{max(measured) / mib:.0f})"
                  f" {predicted[worst] / mib:8.1f} {measured[worst] / predicted[worst]:6.3f} {arena[worst] / mib:8.1f}"
                  f" {statically / mib:8.1f} {arena[worst] / statically:6.3f}", flush=True)
    print("trainer: its prediction (ratio: measured / it); arena: the part of it that is the arena's pages, which "
          "the report's per-rank peak predicts (ratio: arena / report). The report counts the step's buffers only, not "
          "the trainer's f32 gradient sums, MPI's temporaries, the matmuls' scratch nor the process "
          "(docs/distributed.md, \"Memory per rank\")")


if __name__ == "__main__":
    main()
