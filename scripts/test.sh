#!/usr/bin/env bash
# The test command (README, .ci/run): set up, then run the whole suite.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
export PATH="$PWD/.venv/bin:$PATH"
if ! .venv/bin/ruff check --quiet .; then
  echo "scripts/test.sh: ruff found the problems above; 'ruff check --fix' mends most" >&2
  exit 1
fi
if ! .venv/bin/ruff format --check --quiet .; then
  echo "scripts/test.sh: ruff format would change the files above; run 'ruff format'" >&2
  exit 1
fi
# RECIPEVAL_SLURM_E2E=0 leaves out the pipeline-through-Slurm module (the slowest, about a
# fifth of the suite's time) for a quick local run; CI runs everything.
marker=()
if [ "${RECIPEVAL_SLURM_E2E:-1}" = 0 ]; then
  marker=(-m "not slurm_e2e")
fi
# Two pytest-xdist workers: much of the suite waits on subprocesses (Ray, Snakemake, Slurm),
# so two take about 55 % of one's time on two cores. RECIPEVAL_TEST_WORKERS=0 runs one process.
# tests/conftest.py's scheduler keeps a module on one worker and the Slurm modules together;
# --no-loadscope-reorder keeps its order (the Slurm modules first).
workers=(-n "${RECIPEVAL_TEST_WORKERS:-2}" --no-loadscope-reorder)
# --durations: the slowest tests in every CI log, to keep the suite inside its time budget.
.venv/bin/python -m pytest "${workers[@]}" --durations=25 "${marker[@]}" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests; that is a broken suite, not a pass" >&2
  exit 1
fi
# The reference engine again under the lowest transformers pyproject allows (its own small
# environment, .venv-lowest; a few minutes). RECIPEVAL_ENGINE_LOWEST=0 leaves it out locally.
if [ "${RECIPEVAL_ENGINE_LOWEST:-1}" != 0 ]; then
  scripts/test-engine-lowest.sh
  lowest=$?
  if [ "$lowest" -ne 0 ]; then
    echo "scripts/test.sh: the reference engine failed under the lowest allowed transformers" >&2
    [ "$rc" -ne 0 ] || rc=$lowest
  fi
fi
exit "$rc"
