#!/usr/bin/env python3
"""Predicted against measured step time: the time model's acceptance bench.

For each model (cruncher, mlp, gpt) in fp32 and bf16-mixed, builds the trainer
with `napkin train` (the cpu row: the built-in one, or this host's when a
local device file exists, see `napkin devices --measure`), runs it on random
data (cruncher, mlp) or data/tiny.u16 (gpt), and prints the trainer's own
end-of-run figures: the median measured step, the predicted step, their ratio
and both MFUs, read from the metrics file's summary record. The model's
YAML is copied with its precision line replaced for bf16-mixed.

Usage (from the repository root, napkin built in build/):
  build/venv/bin/python bench/time_model.py [--steps 30] [--models cruncher,mlp,gpt]
The acceptance target is |measured / predicted - 1| <= 0.25 for every row.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAPKIN = os.path.join(ROOT, "build", "tools", "napkin")


def data_flags(name, tmp):
    rng = np.random.default_rng(0)
    if name == "cruncher":
        np.save(os.path.join(tmp, "x.npy"), rng.standard_normal((256 * 8, 1024), dtype=np.float32))
        np.save(os.path.join(tmp, "y.npy"), rng.standard_normal(256 * 8, dtype=np.float32))
        return ["--data-file", f"x={tmp}/x.npy", "--data-file", f"y={tmp}/y.npy"]
    if name == "mlp":
        np.save(os.path.join(tmp, "images.npy"), rng.standard_normal((512 * 8, 784), dtype=np.float32))
        np.save(os.path.join(tmp, "labels.npy"), rng.integers(0, 10, 512 * 8, dtype=np.int32))
        return ["--data-file", f"images={tmp}/images.npy", "--data-file", f"labels={tmp}/labels.npy"]
    return ["--data", os.path.join(ROOT, "data", "tiny.u16")]


def run(name, precision, steps, tmp):
    yaml = open(os.path.join(ROOT, "models", f"{name}.yaml")).read()
    yaml, count = re.subn(r"^precision: .*$", f"precision: {precision}", yaml, flags=re.M)
    assert count == 1, f"{name}.yaml has no precision line"
    model = os.path.join(tmp, f"{name}-{precision}.yaml")
    open(model, "w").write(yaml)
    metrics = os.path.join(tmp, f"{name}-{precision}.jsonl")
    cmd = [NAPKIN, "train", model, "--", *data_flags(name, tmp), "--steps", str(steps), "--log-every", str(steps),
           "--checkpoint-every", "0", "--metrics", metrics, "--quiet"]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    for line in open(metrics):
        record = json.loads(line)
        if record.get("summary"):
            return record
    sys.exit(f"{name} {precision}: no summary record in {metrics}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--models", default="cruncher,mlp,gpt")
    args = parser.parse_args()
    devices = subprocess.run([NAPKIN, "devices"], capture_output=True, text=True, check=True).stdout
    cpu = next((line for line in devices.splitlines() if line.startswith("cpu")), "")
    print(f"napkin devices (cpu row): {cpu}")
    print(f"{'model':<10} {'precision':<11} {'predicted':>12} {'measured':>12} {'meas/pred':>10} {'MFU pred':>9} {'MFU meas':>9}  within 25%")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            for precision in ("fp32", "bf16-mixed"):
                r = run(name, precision, args.steps, tmp)
                ratio = r["measured_step_ms"] / r["predicted_step_ms"]
                worst = max(worst, abs(ratio - 1))
                pct = lambda v: "n/a" if v is None else f"{100 * v:.1f}%"
                print(f"{name:<10} {precision:<11} {r['predicted_step_ms']:>9.2f} ms {r['measured_step_ms']:>9.2f} ms "
                      f"{ratio:>10.2f} {pct(r['predicted_mfu']):>9} {pct(r['measured_mfu']):>9}  "
                      f"{'yes' if abs(ratio - 1) <= 0.25 else 'NO'}")
    print(f"largest |measured/predicted - 1|: {worst:.2f}")


if __name__ == "__main__":
    main()
