#!/usr/bin/env bash
# The whole GPU check in one call on the GPU machine (device time is scarce):
# the machine's state, the CUDA trainers against the CPU references
# (verify.py), then GPT-2 124M against PyTorch eager and torch.compile.
# Expects build/gpu-bundle from bench/gpu/prepare.py (run on a machine with
# napkin's compiler) and writes logs under $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}"
export LD_LIBRARY_PATH="$PWD/build/gpu-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$out/gpu-state.txt"
status=0
python3 bench/gpu/verify.py --bundle build/gpu-bundle --sanitize 2>&1 | tee "$out/verify.txt" || status=1
python3 bench/gpt2_cuda_vs_torch.py --trainer build/gpu-bundle/gpt2-124m-cuda \
  --trainer build/gpu-bundle/gpt2-124m-cuda-8GiB --data build/gpu-bundle/gpt2.u16 \
  2>&1 | tee "$out/bench.txt" || status=1
exit $status
