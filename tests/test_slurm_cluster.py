"""The single-node test Slurm (scripts/slurm) and the CI profile (profiles/ci-slurm), for real."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import slurm_cluster as slurm_cluster_module
from conftest import interruptible_session, kill_session
from slurm_cluster import (  # noqa: F401  (slurm_cluster_fixture provides `slurm_cluster`)
    CI_PROFILE,
    SUBMITTED_LINE,
    SlurmCluster,
    free_port_pair,
    processes_of,
    require_slurm_machine,
    run_two_rule_workflow,
    skip_or_fail_under_ci,
    slurm_cluster_fixture,
    start_cluster,
    stop_cluster,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def _env_values(text: str, name: str) -> str:
    """The value of `name=...` in a job's output; fails the test when missing."""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key == name:
            return value
    raise AssertionError(f"{name} not in job output:\n{text}")


def test_gpu_batch_job_gets_its_gpus_and_output_comes_back(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    submitted = time.monotonic()
    job_id = slurm_cluster.sbatch(
        f"--gres=gpu:{slurm_cluster.gpu_type}:2",
        f"--output={tmp_path}/%j.out",
        "--wrap",
        "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; echo SLURM_JOB_GPUS=$SLURM_JOB_GPUS; "
        "echo HOST=$(hostname -s)",
    )
    times = slurm_cluster.wait_job(job_id, submitted)
    running = "-" if times.seen_running_s is None else f"{times.seen_running_s:.2f}s"
    print(
        f"slurm job {job_id}: {times.state}, seen running after {running}, "
        f"finished after {times.seen_finished_s:.2f}s (submit -> end)"
    )

    assert times.state == "COMPLETED"
    output = (tmp_path / f"{job_id}.out").read_text()
    assert len(_env_values(output, "CUDA_VISIBLE_DEVICES").split(",")) == 2
    assert len(_env_values(output, "SLURM_JOB_GPUS").split(",")) == 2
    assert _env_values(output, "HOST") == slurm_cluster.node
    assert slurm_cluster.job_field(job_id, "TresPerNode") == f"gres:gpu:{slurm_cluster.gpu_type}:2"


def test_srun_inside_an_allocation_runs_one_task_per_rank_with_gpus(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    job_id = slurm_cluster.sbatch(
        "--ntasks=2",
        f"--gres=gpu:{slurm_cluster.gpu_type}:2",
        f"--output={tmp_path}/%j.out",
        "--wrap",
        'srun --ntasks=2 bash -c "echo rank=\\$SLURM_PROCID step=\\$SLURM_STEP_ID '
        'gpus=\\$CUDA_VISIBLE_DEVICES"',
    )
    times = slurm_cluster.wait_job(job_id, time.monotonic())

    assert times.state == "COMPLETED"
    lines = sorted(
        line
        for line in (tmp_path / f"{job_id}.out").read_text().splitlines()
        if line.startswith("rank=")
    )
    assert [line.split()[0] for line in lines] == ["rank=0", "rank=1"]
    assert all("step=0" in line and "gpus=0,1" in line for line in lines), lines


def test_more_gpus_than_the_node_has_is_refused(slurm_cluster: SlurmCluster) -> None:
    result = subprocess.run(
        ["sbatch", f"--gres=gpu:{slurm_cluster.gpu_type}:9", "--wrap", "true"],
        check=False,
        env=dict(slurm_cluster.env),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert "Requested node configuration is not available" in result.stderr


def test_snakemake_ci_profile_runs_both_rules_through_sbatch(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    run = run_two_rule_workflow(slurm_cluster, tmp_path)
    for line in run.log.splitlines():
        if "submitted with SLURM jobid" in line or line.startswith("Finished jobid"):
            print(line)
    print(
        f"snakemake: {len(run.slurm_job_ids)} slurm jobs {run.slurm_job_ids} in {run.wall_s:.1f}s "
        f"({run.wall_s / max(len(run.slurm_job_ids), 1):.1f}s per job)"
    )

    assert run.returncode == 0, run.log[-3000:]
    assert len(run.slurm_job_ids) == 2, run.log[-3000:]
    assert [slurm_cluster.job_state(job_id) for job_id in run.slurm_job_ids] == ["COMPLETED"] * 2
    cpu_line, gpu_line = (tmp_path / "gpu.txt").read_text().splitlines()
    assert cpu_line == f"job={run.slurm_job_ids[0]}"
    gpu_fields = dict(word.split("=", 1) for word in gpu_line.split())
    assert gpu_fields["job"] == run.slurm_job_ids[1]
    assert gpu_fields["cuda"] != "none" and len(gpu_fields["cuda"].split(",")) == 1
    assert slurm_cluster.job_field(run.slurm_job_ids[1], "TresPerJob").endswith(
        f"gpu:{slurm_cluster.gpu_type}:1"
    )
    assert slurm_cluster.job_field(run.slurm_job_ids[0], "Partition") == slurm_cluster.partition


def test_interrupting_snakemake_cancels_its_slurm_jobs(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "Snakefile").write_text(
        'rule long:\n    output: "never.txt"\n    shell: "sleep 600; touch {output}"\n'
    )
    snakemake = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--profile",
            str(CI_PROFILE),
            "--directory",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=dict(slurm_cluster.env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=interruptible_session,  # noqa: PLW1509
    )
    job_id = None
    try:
        for line in snakemake.stdout:
            match = SUBMITTED_LINE.search(line)
            if match:
                job_id = match.group(1)
                print(line.strip())
                break
        assert job_id, "snakemake never submitted its job"
        deadline = time.monotonic() + 60
        while slurm_cluster.job_state(job_id) != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.2)
        snakemake.send_signal(signal.SIGINT)
        rest, _ = snakemake.communicate(timeout=120)
    finally:
        kill_session(snakemake)

    assert snakemake.returncode != 0
    # scancel is asynchronous: the job passes through CANCELLING/COMPLETING first.
    deadline = time.monotonic() + 30
    while slurm_cluster.job_state(job_id) != "CANCELLED" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slurm_cluster.job_state(job_id) == "CANCELLED", rest[-2000:]
    deadline = time.monotonic() + 30
    while slurm_cluster.job_processes(job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slurm_cluster.job_processes(job_id) == []


def test_a_process_that_left_its_job_is_ended_with_the_job(slurm_cluster: SlurmCluster) -> None:
    # A job step whose batch shell dies first is re-parented; Snakemake's remote job under a
    # time limit is one. Real clusters track jobs by cgroup and end it; so must the test cluster,
    # or a test finds it running after the job and a run on a loaded machine flakes.
    tracker = slurm_cluster.run(["scontrol", "show", "config"]).stdout
    if "proctrack/cgroup" not in tracker:
        skip_or_fail_under_ci(
            "no writable cgroup freezer: the test cluster tracks processes by parentage",
            "a re-parented job process outlives its job",
        )
    job_id = slurm_cluster.sbatch(
        "--output=/dev/null",
        "--wrap",
        "setsid bash -c 'trap \"\" TERM; exec sleep 300' & sleep 300",
    )

    def sleepers() -> int:
        return sum(p.endswith(" sleep 300") for p in slurm_cluster.job_processes(job_id))

    deadline = time.monotonic() + 30
    while sleepers() < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sleepers() == 2, slurm_cluster.job_processes(job_id)
    slurm_cluster.run(["scancel", job_id])
    deadline = time.monotonic() + 30
    while slurm_cluster.job_processes(job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slurm_cluster.job_processes(job_id) == []


@pytest.mark.parametrize(
    ("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)]
)
def test_a_machine_without_slurm_skips_but_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(slurm_cluster_module.shutil, "which", lambda name, path=None: None)
    with pytest.raises(outcome, match="cannot be installed here"):
        require_slurm_machine()


@pytest.mark.parametrize("nodes", [1, 2])
def test_up_and_down_are_idempotent_and_down_leaves_nothing(tmp_path: Path, nodes: int) -> None:
    # A second, private cluster (own directory and ports) so the session's cluster is untouched.
    directory = tmp_path / "cluster"
    ports = {
        "RECIPEVAL_SLURM_CTLD_PORT": _free_port(),
        "RECIPEVAL_SLURM_SLURMD_PORT": str(free_port_pair()),
    }
    # The default config path stays with the session's cluster.
    extra = {
        **ports,
        "RECIPEVAL_SLURM_DEFAULT_CONF": str(tmp_path / "default-slurm.conf"),
        "RECIPEVAL_SLURM_NODES": str(nodes),
    }
    require_slurm_machine()
    cluster = start_cluster(directory, extra)
    try:
        assert len(cluster.nodes) == nodes
        slurmd = sorted(p for p in processes_of(directory) if " slurmd " in f" {p.split()[1]} ")
        again = start_cluster(directory, extra)
        assert again.conf == cluster.conf
        # The second up.sh left the running cluster alone: the same slurmd, one per node.
        assert (
            sorted(p for p in processes_of(directory) if " slurmd " in f" {p.split()[1]} ")
            == slurmd
        )
        assert len(slurmd) == nodes
        job_id = cluster.sbatch("--output=/dev/null", "--wrap", "sleep 600")
        deadline = time.monotonic() + 30
        while not cluster.job_processes(job_id) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cluster.job_processes(job_id), "the job's sleep should be running before down"
        assert processes_of(directory)
    finally:
        stop_cluster(cluster)
    stop_cluster(cluster)

    assert processes_of(directory) == []
    assert cluster.job_processes(job_id) == []
    leftovers = subprocess.run(
        ["pgrep", "-a", "-f", str(directory)], check=False, capture_output=True, text=True
    ).stdout
    assert leftovers == ""
    assert not (tmp_path / "default-slurm.conf").exists()
