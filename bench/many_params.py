#!/usr/bin/python3
"""A model made of many small parameters, for timing `napkin report` on big graphs.

N parameters `p<i>: {shape: [d], init: zeros}` and a forward of N residual adds
`- h<i>: h<i-1> + p<i>`, one YAML line each (2·N lines in all), then an mse
loss and SGD (or `--optimizer adamw`: AdamW with weight decay and gradient
clipping, whose per-parameter scalar 1 - lr·wd joins the optimizer's scalar
group N times). Every parameter's gradient, optimizer update and buffer is
its own, so each pass and analysis sees O(N) values, nodes and buffers:
anything quadratic in them shows at N in the tens of thousands.

Usage: bench/many_params.py LINES > model.yaml      (LINES: parameter + forward lines, e.g. 80000)
       bench/many_params.py LINES --optimizer adamw > model.yaml
       bench/many_params.py LINES --time             (writes the model to a temporary file, times napkin report)
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


OPTIMIZERS = {
    "sgd": "sgd(lr=0.01)",
    "adamw": "adamw(lr=1e-3, weight_decay=0.01, grad_clip=1.0)",
}


def model(lines, optimizer="sgd"):
    n = max(1, lines // 2)
    out = [
        f"# bench/many_params.py {lines}: {n} parameters, {n} residual adds",
        "model: many_params",
        "dims:",
        "  batch: 4",
        "  d: 8",
        "inputs:",
        "  x: {shape: [batch, d]}",
        "  y: {shape: [batch, d]}",
        "params:",
    ]
    out += [f"  p{i}: {{shape: [d], init: zeros}}" for i in range(1, n + 1)]
    out += ["forward:", "  - h1: x + p1"]
    out += [f"  - h{i}: h{i - 1} + p{i}" for i in range(2, n + 1)]
    out += [f"loss: mse(h{n}, y)", f"optimizer: {OPTIMIZERS[optimizer]}", "precision: fp32", ""]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lines", type=int)
    ap.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="sgd", help=f"the update: {OPTIMIZERS}")
    ap.add_argument("--time", action="store_true", help="time `napkin report` on the model instead of printing it")
    ap.add_argument("--napkin", default=os.path.join(ROOT, "build/tools/napkin"))
    args = ap.parse_args()
    if not args.time:
        sys.stdout.write(model(args.lines, args.optimizer))
        return
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(model(args.lines, args.optimizer))
        f.flush()
        start = time.perf_counter()
        subprocess.run([args.napkin, "report", f.name], check=True, stdout=subprocess.DEVNULL)
        print(f"{args.lines} lines: {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
