#!/usr/bin/env bash
# The test command (README, .ci/run): set up, then run the whole suite.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
export PATH="$PWD/.venv/bin:$PATH"
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests; that is a broken suite, not a pass" >&2
  exit 1
fi
exit "$rc"
