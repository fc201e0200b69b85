#!/usr/bin/env python3
"""Ctrl-C and SIGTERM at random moments: the trainer's stop promise, 300 times.

A trainer promises (docs/runtime.md, "Checkpoints"): SIGINT or SIGTERM
finishes the current step, saves a checkpoint and exits 130. This script
builds gpt.yaml with one layer (its GEMMs are big enough for oneDNN's JIT
kernels, where the old signal handler crashed the trainer) and for each
trial starts a fresh run on 2 threads (as the crashes of issue 36 were
seen) that logs every step, evaluates every 2nd and saves every 3rd, waits
for its first progress line, sleeps a random 0-400 ms (a step takes about
0.2 s: the signal lands in a step, an eval, a save or a log line),
sends SIGINT or SIGTERM (alternating), and checks that the run exited 130,
said "interrupted after step N; saved", and that step N's checkpoint loads:
a resumed run (--resume DIR --steps N+1) trains one more step from it.

Usage (from the repository root, napkin built in build/):
  python3 bench/signal_stress.py [--trials 300] [--threads 2] [--dims D] [--seed S] [--napkin PATH]
It prints one line per failed trial and a summary: exit statuses by count,
crashes (a death by a signal), runs whose checkpoint was missing or did not
load. tests/e2e/trainer_signals_test.cpp is the bounded form CI runs.
"""
import argparse
import collections
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAPKIN = os.path.join(ROOT, "build", "tools", "napkin")
DATA = os.path.join(ROOT, "tests", "e2e", "data", "gpt", "tokens.u16")
DIMS = "layers=1"


def wait_for_progress(proc, log, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log, errors="replace") as f:
            if "  loss " in f.read():
                return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    return False


def trial(trainer, tmp, index, sig, delay, threads):
    ckpt = os.path.join(tmp, f"ckpt{index}")
    log = os.path.join(tmp, f"out{index}.txt")
    cmd = [trainer, "--data", DATA, "--threads", str(threads), "--steps", "1000000", "--log-every", "1",
           "--eval-every", "2", "--eval-batches", "1", "--checkpoint-every", "3", "--keep", "1", "--checkpoint-dir", ckpt]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        if not wait_for_progress(proc, log, 60):
            return "no progress line", None
        time.sleep(delay)
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        return "hung after the signal", None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if rc != 130:
        tail = open(log, errors="replace").read().strip().splitlines()[-2:]
        return ("crash" if rc < 0 else "exit") + ": " + " / ".join(tail), rc
    text = open(log, errors="replace").read()
    m = re.search(r"interrupted after step (\d+); saved", text)
    if not m:
        return "no 'saved' line", rc
    step = int(m.group(1))
    if not os.path.exists(os.path.join(ckpt, f"step-{step:06d}.safetensors")):
        return f"no checkpoint of step {step}", rc
    resumed = subprocess.run([trainer, "--data", DATA, "--threads", str(threads), "--quiet", "--resume", ckpt,
                              "--steps", str(step + 1)], cwd=ROOT, capture_output=True, text=True)
    if resumed.returncode != 0:
        return f"step {step}'s checkpoint does not resume: {resumed.stdout}{resumed.stderr}", rc
    return None, rc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=None, help="seed of the delays (default: random, printed)")
    ap.add_argument("--dims", default=DIMS, help=f"the model's --dims (default {DIMS}; '' for gpt.yaml's own)")
    ap.add_argument("--napkin", default=NAPKIN, help="the napkin that builds the trainer (another build to compare)")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    print(f"{args.trials} trials, gpt.yaml --dims '{args.dims}', {args.threads} threads, delays 0-400 ms after the first progress line, seed {seed}")
    with tempfile.TemporaryDirectory(prefix="napkin-signal-stress-") as tmp:
        trainer = os.path.join(tmp, "trainer")
        dims = ["--dims", args.dims] if args.dims else []
        subprocess.run([args.napkin, "build", os.path.join(ROOT, "models", "gpt.yaml"), *dims, "-o", trainer,
                        "--quiet"], check=True)
        statuses = collections.Counter()
        failures = collections.Counter()
        start = time.monotonic()
        for i in range(args.trials):
            sig = signal.SIGINT if i % 2 == 0 else signal.SIGTERM
            delay = rng.uniform(0, 0.400)
            problem, rc = trial(trainer, tmp, i, sig, delay, args.threads)
            statuses[rc] += 1
            if problem:
                failures[problem.split(":")[0]] += 1
                print(f"trial {i} ({sig.name}, {delay * 1e3:.1f} ms): {problem} (status {rc})", flush=True)
        elapsed = time.monotonic() - start
    print(f"exit statuses: {dict(sorted(statuses.items(), key=lambda kv: str(kv[0])))} "
          f"(negative: killed by that signal)")
    crashes = sum(n for rc, n in statuses.items() if rc is not None and rc < 0)
    print(f"crashes: {crashes}; runs without a loadable final checkpoint: {sum(failures.values())} "
          f"of {args.trials}; {elapsed:.0f} s")
    for what, n in failures.items():
        print(f"  {n} x {what}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
