"""The slurm runner: allocation detection and sizing; the real run inside an sbatch job on
the single-node test Slurm (scripts/slurm/)."""

from __future__ import annotations

import pytest
from conftest import clean_env, run_cli

from recipeval.runners import default_runner_name
from recipeval.runners.base import RunnerError
from recipeval.runners.slurm import SlurmRunner, gpus_per_node, in_allocation

ALLOCATION = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_JOB_NUM_NODES": "2"}


def test_default_runner_is_slurm_inside_an_allocation():
    assert in_allocation(ALLOCATION)
    assert default_runner_name(ALLOCATION) == "slurm"
    assert default_runner_name({}) == "local"
    assert default_runner_name({"RAY_ADDRESS": "http://127.0.0.1:8265"}) == "ray"


@pytest.mark.parametrize("stage", ["smoke", "logprob-diff", "bench"])
def test_runner_help_names_the_default_as_chosen(stage):
    """The --runner help says what default_runner_name does: ray only when RAY_ADDRESS is set
    (an installed ray alone does not pick it)."""
    proc = run_cli(stage, "--help", env=clean_env(COLUMNS="100"))
    assert proc.returncode == 0, proc.stderr
    words = " ".join(proc.stdout.replace("\u2502", " ").split())
    assert "slurm in an allocation, ray when RAY_ADDRESS is set, else local" in words


def test_gpus_per_node_from_slurm_else_recipe():
    assert gpus_per_node({"SLURM_GPUS_ON_NODE": "8"}, 0) == 8
    assert gpus_per_node({"SLURM_GPUS_PER_NODE": "mi355x:4"}, 0) == 4
    assert gpus_per_node({}, 2) == 2


def test_outside_an_allocation_the_error_says_what_to_do():
    with pytest.raises(RunnerError, match="needs a Slurm allocation.*--runner ray or local"):
        SlurmRunner(environ={})


# --- for real: sbatch on the single-node test Slurm --------------------------------------

import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import psutil
from conftest import TINY_RECIPE
from slurm_cluster import job_processes, slurm_cluster  # noqa: F401

RECIPEVAL = str(Path(sys.executable).parent / "recipeval")
GPUS = 2


def _batch_script(path: Path, command: list[str]) -> Path:
    path.write_text("#!/bin/bash\n" + shlex.join(command) + "\n")
    path.chmod(0o755)
    return path


def _no_process_names(text: str) -> bool:
    return not [
        p for p in psutil.process_iter(["cmdline"]) if text in " ".join(p.info["cmdline"] or [])
    ]


@pytest.mark.slow
@pytest.mark.slurm
def test_smoke_in_sbatch_uses_the_slurm_runner_and_tears_ray_down(slurm_cluster, tmp_path):  # noqa: F811
    """`recipeval smoke` inside an sbatch job with GPUs: the default runner is slurm, the Ray
    head inside the allocation sees the allocated GPUs, the tiny recipe passes, and nothing of
    the job (Ray included) is left afterwards."""
    out = tmp_path / "out"
    script = _batch_script(
        tmp_path / "smoke.sh", [RECIPEVAL, "smoke", str(TINY_RECIPE), "--out", str(out)]
    )
    submitted = time.monotonic()
    job = slurm_cluster.sbatch(
        "--nodes=1",
        f"--gres=gpu:{slurm_cluster.gpu_type}:{GPUS}",
        "--time=20",
        f"--output={tmp_path / 'job.out'}",
        str(script),
        cwd=tmp_path,
    )
    times = slurm_cluster.wait_job(job, submitted, timeout=900)
    job_log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert times.state == "COMPLETED", job_log[-3000:]
    result = json.loads((out / "smoke.json").read_text())
    assert result["status"] == "pass", result["message"]
    info = result["summary"]["runner_info"]
    assert info["runner"] == "slurm" and info["gpus_per_node"] == GPUS
    assert info["nodes"] == [slurm_cluster.node]
    assert job_processes(job) == []
    assert _no_process_names(info["ray_temp_dir"])


RUNNER_PROGRAM = """\
import json, sys
sys.path.insert(0, sys.argv[1])
from runner_jobs import miles_like_program, python_launch
from recipeval.runners.slurm import SlurmRunner
lines = []
with SlurmRunner() as runner:
    info = runner.describe()
    result = runner.run(python_launch(miles_like_program(3)), lines.append, timeout=300)
with open(sys.argv[2], "w") as fh:
    json.dump({"info": info, "exit_code": result.exit_code, "lines": lines}, fh)
"""


@pytest.mark.slow
@pytest.mark.slurm
def test_slurm_runner_in_sbatch_runs_a_job_on_the_allocation(slurm_cluster, tmp_path):  # noqa: F811
    report = tmp_path / "report.json"
    program = tmp_path / "runner.py"
    program.write_text(RUNNER_PROGRAM)
    script = _batch_script(
        tmp_path / "runner.sh",
        [sys.executable, str(program), str(Path(__file__).parent), str(report)],
    )
    submitted = time.monotonic()
    job = slurm_cluster.sbatch(
        "--nodes=1",
        f"--gres=gpu:{slurm_cluster.gpu_type}:{GPUS}",
        "--time=10",
        f"--output={tmp_path / 'job.out'}",
        str(script),
        cwd=tmp_path,
    )
    times = slurm_cluster.wait_job(job, submitted, timeout=600)
    job_log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert times.state == "COMPLETED", job_log[-3000:]
    done = json.loads(report.read_text())
    assert done["exit_code"] == 0
    assert done["info"]["gpus_per_node"] == GPUS and done["info"]["nodes"] == [slurm_cluster.node]
    assert sum("step 2:" in line for line in done["lines"]) == 1
    assert job_processes(job) == []
    assert _no_process_names(done["info"]["ray_temp_dir"])


@pytest.mark.slow
@pytest.mark.slurm
def test_a_head_that_dies_while_starting_fails_the_start_at_once(slurm_cluster, tmp_path):  # noqa: F811
    """The head runs as a step of the allocation; a head step that cannot start (here: the job
    is not Slurm's) ends the start at once with its output, instead of waiting out the start
    timeout, and leaves no Ray behind."""
    environ = {
        **os.environ,
        "SLURM_JOB_ID": "999999",
        "SLURM_JOB_NODELIST": slurm_cluster.node,
        "SLURM_JOB_NUM_NODES": "1",
        "SLURMD_NODENAME": slurm_cluster.node,
        "TMPDIR": str(tmp_path),
    }
    ray_dirs = set(Path(tempfile.gettempdir()).glob("rv-ray-*"))
    started = time.monotonic()
    with pytest.raises(
        RunnerError, match="(?s)Ray head exited with status 1 while starting.*999999"
    ):
        SlurmRunner(environ=environ)
    assert time.monotonic() - started < 60
    # The head was stopped: its Ray temp dir and its log are gone, and nothing was recorded.
    assert set(Path(tempfile.gettempdir()).glob("rv-ray-*")) <= ray_dirs
    assert list((tmp_path / "recipeval-slurm-999999").glob("ray-head-*.log")) == []
    assert not (tmp_path / "recipeval-slurm-999999" / "cluster.json").exists()
