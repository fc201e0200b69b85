#!/usr/bin/env python3
"""Checks the benchmark peers this Python has before anyone times them.

For each peer importable here (PyTorch, JAX, tinygrad) it prints the
version, what runs its matmuls (the BLAS library actually mapped into the
process, XLA's CPU backend, tinygrad's device), the threads it will use, and
the GFLOP/s of one 1024^3 f32 matmul (the best of 5 after a warm-up), and
refuses a peer that would be timed on something else than a user gets:

  - PyTorch on the reference BLAS (Debian's libblas.so.3 from libblas3,
    30x slower than OpenBLAS or MKL), whose thread count is not --threads,
    or whose matmul is under --min-gflops (default 20: the reference BLAS
    reaches about 3 on this machine's 2 cores, OpenBLAS and MKL over 150);
  - JAX not on the CPU, or on another number of cores than --threads;
  - tinygrad not on a CPU device. Its CPU device generates its own matmul
    (no BLAS): its speed is reported, not held against it, and it is what
    tinygrad gives (BEAM=2 in the environment searches kernel schedules:
    about 13 GFLOP/s here against 3.4 without).

Exit status 0 when every peer checked is usable, 1 otherwise.
Usage: check.py [--threads 2] [--min-gflops 20] [--only torch,jax,tinygrad]
"""
import argparse
import importlib
import os
import sys
import time


def best_gflops(fn, n=1024, repeat=5):
    fn()  # warm-up: compilation, thread pools
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best / 1e9


def mapped_blas():
    """The BLAS-like libraries mapped into this process, by file name."""
    names = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if "/" in line else ""
            base = os.path.basename(path)
            if any(k in base for k in ("blas", "mkl", "dnnl", "openblas")):
                names.add(os.path.realpath(path))
    return sorted(names)


def check_torch(threads, min_gflops):
    import torch
    torch.set_num_threads(threads)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    gflops = best_gflops(lambda: a @ b)
    libs = mapped_blas()
    problems = []
    reference = [p for p in libs if "/blas/libblas.so" in p or p.endswith("/libblas.so.3")]
    if reference and not any("openblas" in p or "mkl" in p for p in libs):
        problems.append(f"runs on the reference BLAS ({reference[0]}): install libopenblas0-pthread")
    if torch.get_num_threads() != threads:
        problems.append(f"uses {torch.get_num_threads()} threads, not {threads}")
    if gflops < min_gflops:
        problems.append(f"a 1024^3 f32 matmul at {gflops:.1f} GFLOP/s, under {min_gflops:g}: not a real BLAS")
    blas = "MKL" if any("mkl" in p for p in libs) or "BLAS_INFO=mkl" in torch.__config__.show() else \
        "OpenBLAS" if any("openblas" in p for p in libs) else (os.path.basename(libs[0]) if libs else "unknown")
    return f"PyTorch {torch.__version__}", f"BLAS {blas}", torch.get_num_threads(), gflops, problems


def check_jax(threads, min_gflops):
    import jax
    import jax.numpy as jnp
    devices = jax.devices()
    a = jnp.ones((1024, 1024), jnp.float32)
    b = jnp.ones((1024, 1024), jnp.float32)
    mm = jax.jit(lambda x, y: x @ y)
    gflops = best_gflops(lambda: mm(a, b).block_until_ready())
    problems = []
    if devices[0].platform != "cpu":
        problems.append(f"runs on {devices[0].platform}, not the CPU")
    cores = len(os.sched_getaffinity(0))
    if cores != threads:  # XLA's CPU backend takes every core it may use
        problems.append(f"XLA uses the {cores} cores this process may use, not {threads}: run under taskset")
    return f"JAX {jax.__version__}", "XLA CPU", cores, gflops, problems


def check_tinygrad(threads, min_gflops):
    import tinygrad
    from tinygrad import Device, Tensor
    a, b = Tensor.rand(1024, 1024).realize(), Tensor.rand(1024, 1024).realize()
    gflops = best_gflops(lambda: (a @ b).realize())
    version = getattr(tinygrad, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version
        version = dist_version("tinygrad")
    problems = []
    if Device.DEFAULT not in ("CPU", "CLANG", "LLVM"):
        problems.append(f"device {Device.DEFAULT}, not the CPU")
    beam = os.environ.get("BEAM", "0")
    return f"tinygrad {version}", f"{Device.DEFAULT}, BEAM={beam}", None, gflops, problems


CHECKS = {"torch": check_torch, "jax": check_jax, "tinygrad": check_tinygrad}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-gflops", type=float, default=20.0)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    names = [n for n in (args.only.split(",") if args.only else CHECKS) if n]
    ok = True
    print(f"peers in {sys.executable}:")
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            print(f"  {name:<9} not installed here")
            continue
        try:
            what, backend, threads, gflops, problems = CHECKS[name](args.threads, args.min_gflops)
        except Exception as e:  # a broken install is a refusal, not a crash of the check
            print(f"  {name:<9} REFUSED: {type(e).__name__}: {e}")
            ok = False
            continue
        verdict = "ok" if not problems else "REFUSED: " + "; ".join(problems)
        used = "threads: its own" if threads is None else f"{threads} thread{'s' if threads != 1 else ''}"
        print(f"  {what:<22} {backend:<14} {used:<16}  "
              f"matmul {gflops:6.1f} GFLOP/s  {verdict}")
        ok = ok and not problems
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
