#!/usr/bin/env bash
# Snakemake runs this once after creating envs/recipeval.yaml (`--sdm conda`), in the working
# directory of the run: install the launcher from this checkout, without touching the pinned
# dependencies above.
set -euo pipefail
python -m pip install --no-deps --editable "${RECIPEVAL_SOURCE:-$PWD}"
