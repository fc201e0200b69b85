#!/usr/bin/env python3
"""Per-launch GPU times of one training step, from Nsight Compute's CSV.

bench/gpu/run.sh (with NAPKIN_GPU_NCU=1) runs one step of the GPT-2 trainer
under `ncu --metrics gpu__time_duration.sum --csv --clock-control none` with
CUDA graphs off, so every launch is profiled once, cuBLASLt's GEMMs included.
`--profile` times napkin's plan kernels; this splits a kernel of several
launches (the fused classifier's chunk GEMMs and row kernels, attention's
delta, dK/dV and dQ launches) and names the GEMM kernels cuBLASLt chose.

Prints the launches grouped by function name (napkin's `k<N>_<op>` with the
plan index dropped, so the 12 layers' launches of one function sum into one
row; library kernels by their own name): total time, count, mean, share of
the step. Usage: ncu_summary.py NCU.csv [--top 40]
"""
import argparse
import collections
import csv
import re
import sys

UNIT = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0, "ns": 1e-9, "us": 1e-6, "ms": 1e-3}


def rows(path):
    """(kernel name, seconds) per profiled launch."""
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own log lines before the CSV
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))
        yield r["Kernel Name"], value * UNIT[r["Metric Unit"]]


def group(name):
    """napkin's k<N>_<op>[_<launch>] without N (layers sum); a library kernel's name without its arguments."""
    name = name.split("(")[0].strip()
    m = re.match(r"^k\d+_(.*)$", name)
    if not m:
        return name
    # The fused classifier has a function per vocabulary chunk (NAME_f<c>, NAME_b<c>): one row for all.
    return "napkin " + re.sub(r"_([fb])\d+$", r"_\1*", m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    total = collections.Counter()
    count = collections.Counter()
    for name, seconds in rows(a.csv):
        total[group(name)] += seconds
        count[group(name)] += 1
    if not total:
        sys.exit(f"{a.csv}: no gpu__time_duration.sum rows")
    step = sum(total.values())
    print(f"{sum(count.values())} launches, {step * 1e3:.2f} ms of GPU time (one step, graphs off, launch gaps excluded)")
    print(f"{'ms':>8} {'share':>6} {'count':>6} {'mean us':>9}  function")
    for name, seconds in total.most_common(a.top):
        print(f"{seconds * 1e3:8.3f} {100 * seconds / step:5.1f}% {count[name]:6d} {seconds / count[name] * 1e6:9.1f}  {name}")
    rest = total.most_common()[a.top:]
    if rest:
        print(f"{sum(s for _, s in rest) * 1e3:8.3f} {100 * sum(s for _, s in rest) / step:5.1f}%  {len(rest)} more functions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
