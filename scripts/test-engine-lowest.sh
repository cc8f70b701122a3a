#!/usr/bin/env bash
# The reference engine under the oldest transformers that pyproject allows: a second, small
# virtual environment (torch, the lowest transformers, recipeval with its engine extra, and
# pytest) that runs the tests marked reference_engine. The main environment (scripts/setup.sh)
# holds the newest allowed release, so CI covers both ends of the declared range.
# Idempotent: a second run with unchanged inputs skips the install.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV=${RECIPEVAL_LOWEST_VENV:-.venv-lowest}
TORCH_SPEC=${RECIPEVAL_TORCH:-torch==2.13.0}

inputs_hash() {
  cat pyproject.toml envs/engine-lowest.txt scripts/test-engine-lowest.sh | sha256sum | cut -c1-16
}
stamp="$VENV/.recipeval-lowest-$(inputs_hash)"
if [ ! -f "$stamp" ]; then
  echo "recipeval: creating $VENV for the lowest allowed transformers" >&2
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
  "${pip[@]}" install "$TORCH_SPEC"
  # Only pytest of the dev tools: these tests need no linters, hypothesis or Triton.
  "${pip[@]}" install -c envs/engine-lowest.txt -e ".[engine]" "pytest>=8"
  rm -f "$VENV"/.recipeval-lowest-*
  touch "$stamp"
fi
"$VENV/bin/python" -c 'import torch, transformers; print(f"recipeval: reference engine tests under torch {torch.__version__}, transformers {transformers.__version__}")'
exec "$VENV/bin/python" -m pytest -m reference_engine -q "$@"
