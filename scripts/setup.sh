#!/usr/bin/env bash
# Set up everything recipeval needs on a fresh machine: a virtual environment with the
# launcher, the reference engine (CPU torch), the real validators (megatron-core, SGLang's
# argument parser), Ray, Snakemake + the Slurm plugin, and the profiles where Snakemake finds
# them. Idempotent: a second run with unchanged inputs returns in well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV=${RECIPEVAL_VENV:-.venv}
# torch is pinned before anything else asks for it: an unpinned torch pulls several GB of CUDA
# wheels; 2.13.0 is the CPU build this project is tested with.
TORCH_SPEC=${RECIPEVAL_TORCH:-torch==2.13.0}

inputs_hash() {
  local f
  for f in pyproject.toml envs/engine-newest.txt envs/sglang-cpu.txt scripts/setup.sh scripts/install-profiles.sh; do
    if [ -f "$f" ]; then cat "$f"; fi
  done | sha256sum | cut -c1-16
}
stamp="$VENV/.recipeval-setup-$(inputs_hash)"
if [ -f "$stamp" ]; then
  exit 0
fi

echo "recipeval setup: creating $VENV with $($PYTHON --version 2>&1)" >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
"${pip[@]}" install "$TORCH_SPEC"
# The newest transformers that pyproject allows, pinned: the lowest runs in
# scripts/test-engine-lowest.sh, so CI covers both ends of the declared range.
"${pip[@]}" install -c envs/engine-newest.txt -e ".[engine,ray,checks,workflow,dev]"
if [ -f envs/sglang-cpu.txt ]; then
  # SGLang without its GPU stack: only its argument parser is used on CPU machines.
  "${pip[@]}" install --no-deps -r envs/sglang-cpu.txt
fi
if [ -x scripts/install-profiles.sh ]; then
  scripts/install-profiles.sh
fi
rm -f "$VENV"/.recipeval-setup-*
touch "$stamp"
echo "recipeval setup: done ($VENV)" >&2
