#!/usr/bin/env bash
# The whole GPU check in one call on the GPU machine (device time is scarce):
# the machine's state, the CUDA trainers against the CPU references
# (verify.py), napkin sample's CUDA samplers (sample_check.py: greedy text
# against the CPU's, GPT-2 124M's decode speed), GPT-2 124M's per-kernel profile, GPT-2 124M (and the variants
# prepare.py built) against PyTorch eager and torch.compile, then
# compute-sanitizer on the small gpts; with NAPKIN_GPU_NCU=1, every launch of
# one GPT-2 step under Nsight Compute (bench/gpu/ncu_summary.py). Each
# stage has its own time limit, so one that hangs still leaves the others'
# logs. Expects build/gpu-bundle from bench/gpu/prepare.py (run on a machine
# with napkin's compiler) and writes logs under $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}"
bundle=build/gpu-bundle
# cuBLASLt 13: the toolkit's, else the one PyTorch's wheels bring.
cublas_dir=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  $(python3 -c 'import nvidia.cublas as m; print(*m.__path__)' 2>/dev/null | sed 's|$|/lib|'); do
  if [ -e "$d/libcublasLt.so.13" ]; then cublas_dir=$d; break; fi
done
export LD_LIBRARY_PATH="$PWD/$bundle/lib${cublas_dir:+:$cublas_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
echo "cuBLASLt from: ${cublas_dir:-not found}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used,power.draw,temperature.gpu --format=csv \
  | tee "$out/gpu-state.txt"
status=0
stage() {  # stage NAME SECONDS COMMAND...: runs it under a time limit, its output to $out/NAME.txt
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" 2>&1 | tee "$out/$name.txt"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - t0))s"
  [ "$rc" = 0 ] || status=1
}
stage verify 240 python3 bench/gpu/verify.py --bundle "$bundle"
stage sample 150 python3 bench/gpu/sample_check.py --bundle "$bundle"
stage profile 90 "$bundle/gpt2-124m-cuda" --data "$bundle/gpt2.u16" --steps 15 --order sequential \
  --eval-every 0 --checkpoint-every 0 --log-every 5 --profile
# Every GPT-2 trainer of the bundle (napkin's default first, then the variants prepare.py built), with torch.
trainers=$(python3 -c 'import json, sys; print(" ".join("--trainer " + sys.argv[1] + "/" + t for t in json.load(open(sys.argv[1] + "/manifest.json"))["bench"]["trainers"]))' "$bundle")
stage bench 300 python3 bench/gpt2_cuda_vs_torch.py $trainers --data "$bundle/gpt2.u16" --steps 20 --warmup 5
stage sanitize 150 python3 bench/gpu/verify.py --bundle "$bundle" --sanitize --no-cases
if [ "${NAPKIN_GPU_NCU:-0}" = 1 ]; then  # opt-in: every launch of one step timed by Nsight Compute (about a minute)
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  stage ncu 240 env NAPKIN_CUDA_GRAPHS=0 "$ncu" --metrics gpu__time_duration.sum --csv --clock-control none \
    --log-file "$out/ncu.csv" "$bundle/gpt2-124m-cuda" --data "$bundle/gpt2.u16" --steps 1 --order sequential \
    --eval-every 0 --checkpoint-every 0 --quiet
  python3 bench/gpu/ncu_summary.py "$out/ncu.csv" | tee "$out/ncu-summary.txt"
fi
exit $status
