#!/usr/bin/env bash
# The benchmarks' peers (not a build dependency of napkin; CI does not run
# this): whole-step compilers a user would pick instead of napkin on a CPU,
# installed from PyPI into one virtual environment, and Debian's PyTorch
# 1.13 with OpenBLAS for bench/train_vs_torch.py's eager baseline.
#
#   venv:  $NAPKIN_BENCH_VENV, default ~/.cache/napkin/bench-venv
#          torch (PyTorch 2: torch.compile with inductor on the CPU; the PyPI
#          wheel is the CUDA build, which needs its CUDA libraries to import,
#          about 5 GB in all), jax[cpu] (XLA's whole-step jit), tinygrad
#          (TinyJit), numpy, transformers and safetensors (the Hugging Face
#          references of bench/hf_parity.py), tokenizers, tiktoken and regex
#          (bench/tokenizer.py)
#   apt:   python3-torch and libopenblas0-pthread (without it Debian's torch
#          runs on the reference BLAS, 30x slower)
#
# Idempotent: what is there is kept. Ends by printing each peer's build
# configuration through bench/peers/check.py, which refuses a peer on a
# reference BLAS or with the wrong thread count.
set -euo pipefail
cd "$(dirname "$0")/../.."

venv="${NAPKIN_BENCH_VENV:-$HOME/.cache/napkin/bench-venv}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
missing=()
for p in python3-torch libopenblas0-pthread python3-venv; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bench peers: apt-get install ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "bench peers: creating $venv"
  /usr/bin/python3 -m venv "$venv"
fi
have() { "$venv/bin/python" -c "import $1" >/dev/null 2>&1; }
want=()
have torch || want+=(torch "setuptools>=77")
have jax || want+=("jax[cpu]")
have tinygrad || want+=(tinygrad)
have numpy || want+=(numpy)
# The references a user trusts for Hugging Face models (bench/hf_parity.py).
have transformers || want+=(transformers)
have safetensors || want+=(safetensors)
# The BPE tokenizers napkin's are compared with (bench/tokenizer.py): Hugging Face tokenizers, tiktoken, and the
# regex module that GPT-2's pre-tokenization pattern needs (bench/bpe_reference.py).
have tokenizers || want+=(tokenizers)
have tiktoken || want+=(tiktoken)
have regex || want+=(regex)
if ((${#want[@]})); then
  echo "bench peers: pip install ${want[*]} (PyPI)"
  "$venv/bin/pip" install -q --upgrade "${want[@]}"
fi

"$venv/bin/python" bench/peers/check.py --threads "${NAPKIN_BENCH_THREADS:-2}"
/usr/bin/python3 bench/peers/check.py --threads "${NAPKIN_BENCH_THREADS:-2}" --only torch
echo "bench peers: ready; run the benches with $venv/bin/python (PyTorch 2, JAX, tinygrad) or /usr/bin/python3 (PyTorch 1.13)"
