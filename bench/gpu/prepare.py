#!/usr/bin/python3
"""Prepares the GPU check: everything the GPU machine needs, built here.

The GPU machine has the CUDA toolkit and PyTorch but no LLVM or yaml-cpp, so
napkin cannot run there; its trainers can. For each case below this script

  1. builds the CUDA trainer (`napkin build MODEL --target cuda`) into the
     bundle, and the CPU trainer into a temp dir;
  2. writes the case's data (random npy inputs or u16 tokens, fixed seed);
  3. runs the CPU trainer STEPS steps with --order sequential and stores its
     per-step losses (metrics), and, for the small models, one step with a
     checkpoint, as the references the GPU run must match.

Both trainers initialize the weights from the same seed with the same code
(runtime/init.cpp runs on the host in both), so the GPU run starts from the
CPU run's weights without an --init file. bench/gpu/verify.py, on the GPU
machine, runs each CUDA trainer with the same flags and compares.

It also builds napkin sample's CUDA samplers (`napkin build --sampler`): the
gpt case's, with the CPU sampler's greedy text from the case's one-step
checkpoint as the reference, and GPT-2 124M's, whose decode speed
bench/gpu/sample_check.py measures against napkin's prediction.

It also builds the GPT-2 124M CUDA trainer, its variants (BENCH_VARIANTS:
fusions undone, other classifier chunk sizes) and a token file for
bench/gpt2_cuda_vs_torch.py. The bundle goes to build/gpu-bundle (carry it;
about 56 MiB, with the repository's files under the device's 64 MiB carry
limit), with manifest.json describing every case.

Usage: bench/gpu/prepare.py [--napkin build/tools/napkin] [--steps 5] [--out build/gpu-bundle]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# name, model, --dims override, precision, keep the final checkpoint as a reference
CASES = [
    ("linear", "models/linear.yaml", "batch=256", "fp32", True),
    ("mlp", "models/mlp.yaml", "batch=128,hidden=256", "fp32", True),
    ("cruncher", "models/cruncher.yaml", "d=256", "fp32", True),
    ("gpt", "models/gpt.yaml", "d=128,layers=2", "fp32", True),
    ("gpt-bf16", "models/gpt.yaml", "d=128,layers=2", "bf16-mixed", True),
    ("gpt2-small", "models/gpt2-124m.yaml", "layers=2,seq=128,batch=4", "bf16-mixed", False),
]
# GPT-2 124M trainers for bench/gpt2_cuda_vs_torch.py: napkin's default, then one fusion undone in each.
# (Measured on an H100, 2026-11-26: --unfused-epilogues and --no-rematerialize cost 0.6 and 0.5 ms a step; the
# classifier is the largest gap, so its chunk size is what the next run measures.)
BENCH_VARIANTS = [
    ("", []),
    ("-unfused-classifier", ["--unfused-classifier"]),
    ("-unfused-attention", ["--unfused-attention"]),
    ("-classifier-16MiB", ["--classifier-chunk", "16MiB"]),
    ("-classifier-64MiB", ["--classifier-chunk", "64MiB"]),
    ("-classifier-128MiB", ["--classifier-chunk", "128MiB"]),
]
CLASS_INPUTS = {"labels": 10}  # integer (class id) inputs of the npy models and their bound (mlp.yaml: classes)


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}{r.stderr}")
    return r.stdout


def with_precision(model, precision, tmp):
    with open(os.path.join(ROOT, model)) as f:
        text = f.read()
    text, n = re.subn(r"(?m)^precision:.*$", f"precision: {precision}", text)
    if n == 0:
        text += f"\nprecision: {precision}\n"
    out = os.path.join(tmp, f"{precision}-{os.path.basename(model)}")
    with open(out, "w") as f:
        f.write(text)
    return out


def input_specs(program):
    return [(t["name"], t["dtype"], t["shape"]) for t in program["tensors"] if t["role"] == "input"]


def write_data(program, out_dir, name, rng, batches=4):
    """Data flags (paths relative to the bundle) for the trainer's inputs."""
    inputs = input_specs(program)
    vocab = None
    for t in program["tensors"]:
        if t["name"] == "wte":
            vocab = t["shape"][0]
    if program["train"]["data"] and program["train"]["data"]["format"] == "tokens":
        (_, _, shape), = [i for i in inputs if i[0] == "tokens"]
        b, t = shape
        n = int((b * t * batches + t + 1) / 0.9) + 2 * t
        tokens = rng.integers(0, vocab, n, dtype=np.uint16)
        path = f"{name}.u16"
        tokens.astype("<u2").tofile(os.path.join(out_dir, path))
        return ["--data", path]
    flags = []
    for input_name, dtype, shape in inputs:
        rows = [shape[0] * batches] + shape[1:]
        if dtype == "i32":
            a = rng.integers(0, CLASS_INPUTS[input_name], rows, dtype=np.int32)
        else:
            a = rng.standard_normal(rows, dtype=np.float32)
        path = f"{name}-{input_name}.npy"
        np.save(os.path.join(out_dir, path), a)
        flags += ["--data-file", f"{input_name}={path}"]
    return flags


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--napkin", default=os.path.join(ROOT, "build/tools/napkin"))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "build/gpu-bundle"))
    a = ap.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    rng = np.random.default_rng(0)
    manifest = {"steps": a.steps, "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, dims, precision, keep_checkpoint in CASES:
            yaml = with_precision(model, precision, tmp) if precision != "fp32" else os.path.join(ROOT, model)
            dims_flags = ["--dims", dims] if dims else []
            cuda = os.path.join(a.out, f"{name}-cuda")
            cpu = os.path.join(tmp, f"{name}-cpu")
            run([a.napkin, "build", yaml, "--target", "cuda", "-o", cuda, "--quiet"] + dims_flags)
            run([a.napkin, "build", yaml, "-o", cpu, "--quiet"] + dims_flags)
            program = json.loads(run([cpu, "--print-program"]))
            flags = ["--steps", str(a.steps), "--order", "sequential", "--log-every", "1", "--eval-every", "0",
                     "--seed", "0"] + write_data(program, a.out, name, rng)
            ckpt = os.path.join(a.out, f"{name}-cpu-checkpoint")
            metrics = os.path.join(a.out, f"{name}-cpu.jsonl")
            run([cpu] + flags + ["--metrics", metrics, "--checkpoint-dir", ckpt, "--quiet"], cwd=a.out)
            shutil.rmtree(ckpt)  # the weights are compared after one step (verify.py says why), the losses over all
            if keep_checkpoint:
                one_step = list(flags)
                one_step[one_step.index("--steps") + 1] = "1"
                run([cpu] + one_step + ["--checkpoint-dir", ckpt, "--quiet"], cwd=a.out)
            manifest["cases"].append({"name": name, "precision": precision, "trainer": os.path.basename(cuda),
                                      "flags": flags, "cpu_metrics": os.path.basename(metrics),
                                      "cpu_checkpoint": os.path.basename(ckpt) if keep_checkpoint else None})
            print(f"{name}: CUDA trainer {os.path.getsize(cuda) / 1e6:.1f} MB, CPU reference over {a.steps} steps")
        # napkin sample on the GPU: the gpt case's sampler against the CPU's greedy text from the same
        # checkpoint, and GPT-2 124M's (weights made on the GPU by its trainer's --steps 0) for speed.
        gpt_case = next(c for c in CASES if c[0] == "gpt")
        sample_flags = ["--prompt", "The napkin ", "--tokens", "60", "--temperature", "0"]
        run([a.napkin, "build", os.path.join(ROOT, gpt_case[1]), "--dims", gpt_case[2], "--sampler", "--target", "cuda",
             "-o", os.path.join(a.out, "gpt-sampler-cuda"), "--quiet"])
        cpu_sampler = os.path.join(tmp, "gpt-sampler-cpu")
        run([a.napkin, "build", os.path.join(ROOT, gpt_case[1]), "--dims", gpt_case[2], "--sampler", "-o", cpu_sampler,
             "--quiet"])
        checkpoint = "gpt-cpu-checkpoint"
        expected = subprocess.run([cpu_sampler, "--checkpoint", checkpoint] + sample_flags, cwd=a.out,
                                  capture_output=True)
        if expected.returncode != 0:
            sys.exit("the CPU sampler failed:\n" + expected.stderr.decode(errors="replace"))
        with open(os.path.join(a.out, "gpt-sample-cpu.txt"), "wb") as f:
            f.write(expected.stdout)
        run([a.napkin, "build", os.path.join(ROOT, "models/gpt2-124m.yaml"), "--sampler", "--target", "cuda", "-o",
             os.path.join(a.out, "gpt2-124m-sampler-cuda"), "--quiet"])
        manifest["samplers"] = {"gpt": {"sampler": "gpt-sampler-cuda", "checkpoint": checkpoint, "flags": sample_flags,
                                        "expected": "gpt-sample-cpu.txt"},
                                "gpt2": {"sampler": "gpt2-124m-sampler-cuda", "trainer": "gpt2-124m-cuda"}}
        print("samplers: gpt (CUDA against the CPU's greedy text), gpt2-124m (decode speed)")
        # The benchmark: GPT-2 124M as the YAML says (batch 8, seq 1024), random GPT-2 token ids; and the
        # same model with each fusion decision undone, to measure what each one is worth on the GPU.
        gpt2 = os.path.join(ROOT, "models/gpt2-124m.yaml")
        trainers = []
        for suffix, flags in BENCH_VARIANTS:
            trainers.append(f"gpt2-124m-cuda{suffix}")
            run([a.napkin, "build", gpt2, "--target", "cuda", "-o", os.path.join(a.out, trainers[-1]), "--quiet"] + flags)
        rng.integers(0, 50257, 8 * 1025 * 16, dtype=np.uint16).astype("<u2").tofile(os.path.join(a.out, "gpt2.u16"))
        manifest["bench"] = {"trainers": trainers, "data": "gpt2.u16"}
    # Trainers link libfmt dynamically; the GPU machine may not have it.
    for lib in ("libfmt.so.9",):
        src = os.path.join("/usr/lib/x86_64-linux-gnu", lib)
        if os.path.exists(src):
            os.makedirs(os.path.join(a.out, "lib"), exist_ok=True)
            shutil.copy(os.path.realpath(src), os.path.join(a.out, "lib", lib))
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(a.out) for f in fs)
    print(f"bundle: {a.out}, {total / 2**20:.1f} MiB")
    if total > 64 * 2**20:
        sys.exit("the bundle exceeds the 64 MiB a device call can carry: make the cases smaller")


if __name__ == "__main__":
    main()
