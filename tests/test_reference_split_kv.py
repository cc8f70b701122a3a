"""The split-KV decode attention kernel (--rollout-attention-backend triton) on CPU: the checks
in tests/split_kv_checks.py, in a pytest of their own with Triton's interpreter on."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

# Not marked reference_engine: the kernel does not touch transformers, so the lowest-release
# environment would only repeat it.
pytest.importorskip("triton")


def test_split_kv_kernel_in_the_triton_interpreter():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/split_kv_checks.py",
        ],
        check=False,
        cwd=REPO,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert re.search(r"\b4 passed", proc.stdout), proc.stdout[-2000:]
