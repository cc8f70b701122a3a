"""The slurm runner on a real two-node Slurm (scripts/slurm with RECIPEVAL_SLURM_NODES=2: two
slurmd on this host, nodes n1 and n2): one Ray cluster over both nodes per allocation, a job's
actors on both, reuse by a later stage of the same allocation, a node that dies during a run,
and nothing of the job left on either node afterwards."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
from slurm_cluster import SlurmCluster, two_node_slurm_cluster  # noqa: F401

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TESTS = Path(__file__).parent
GPUS = 2

# One stage: the batch job runs it twice, one process after the other, as the stages of a
# grouped allocation run.
STAGE = """\
import json, sys
sys.path.insert(0, sys.argv[1])
from ray.util.state import list_nodes
from runner_jobs import SPREAD_ACTORS, python_launch
from recipeval.runners.slurm import SlurmRunner
lines = []
with SlurmRunner() as runner:
    nodes = [{"node_id": n.node_id, "name": n.node_name, "state": str(n.state)}
             for n in list_nodes(address=runner.address)]
    result = runner.run(python_launch(SPREAD_ACTORS), lines.append, timeout=300)
    stage = {"info": runner.describe(), "head_pid": runner.cluster.head.pid, "nodes": nodes,
             "exit_code": result.exit_code, "detail": result.detail, "lines": lines}
with open(sys.argv[2], "w") as fh:
    json.dump(stage, fh)
"""

# A run that waits forever; the test kills node n2 meanwhile.
NODE_DIES = """\
import json, sys, time
sys.path.insert(0, sys.argv[1])
from runner_jobs import WAIT_FOR_STOP, python_launch
from recipeval.runners.base import RunnerError
from recipeval.runners.slurm import SlurmRunner
report = {}
with open(sys.argv[3], "w", buffering=1) as seen, SlurmRunner() as runner:
    report["info"] = runner.describe()
    try:
        result = runner.run(python_launch(WAIT_FOR_STOP), lambda line: seen.write(line + "\\n"),
                            timeout=300)
        report["exit_code"] = result.exit_code
    except RunnerError as err:
        report["error"], report["error_at"] = str(err), time.time()
with open(sys.argv[2], "w") as fh:
    json.dump(report, fh)
"""


def _submit(
    cluster: SlurmCluster, tmp_path: Path, program: str, *runs: list[str]
) -> tuple[str, float]:
    """sbatch a 2-node job that runs `program` once per entry of `runs` (its arguments)."""
    (tmp_path / "program.py").write_text(program)
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\nset -e\n"
        + "".join(
            shlex.join([sys.executable, str(tmp_path / "program.py"), str(TESTS), *args]) + "\n"
            for args in runs
        )
    )
    script.chmod(0o755)
    submitted = time.monotonic()
    job = cluster.sbatch(
        "--nodes=2",
        f"--gres=gpu:{cluster.gpu_type}:{GPUS}",
        "--time=10",
        f"--output={tmp_path / 'job.out'}",
        str(script),
        cwd=tmp_path,
    )
    return job, submitted


def _finished(cluster: SlurmCluster, job: str, submitted: float, tmp_path: Path) -> str:
    times = cluster.wait_job(job, submitted, timeout=600)
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert times.state == "COMPLETED", log[-3000:]
    return log


def _job_processes_on(
    cluster: SlurmCluster, job: str, node: str | None = None
) -> list[psutil.Process]:
    """Processes of `job` of this cluster (on `node` when given), Slurm's own steps excepted."""
    wanted = {f"SLURM_JOB_ID={job}", f"SLURM_CONF={cluster.conf}"}
    if node is not None:
        wanted.add(f"SLURMD_NODENAME={node}")
    found = []
    for proc in psutil.process_iter(["name"]):
        try:
            environ = {f"{k}={v}" for k, v in proc.environ().items()}
        except psutil.Error:
            continue
        if wanted <= environ and proc.info["name"] != "slurmstepd" and proc.pid != os.getpid():
            found.append(proc)
    return found


def _nothing_left(cluster: SlurmCluster, job: str, ray_temp_dir: str) -> None:
    """No process of the job on any node and none naming its Ray temp dir (Slurm's job end
    takes a few seconds after squeue says COMPLETED)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = _job_processes_on(cluster, job) + [
            p
            for p in psutil.process_iter(["cmdline"])
            if ray_temp_dir in " ".join(p.info["cmdline"] or [])
        ]
        if not left:
            return
        time.sleep(0.5)
    raise AssertionError(f"left after job {job}: {[p.cmdline() for p in left if p.is_running()]}")


def test_two_node_allocation_one_ray_cluster_actors_on_both_nodes_reused_by_the_next_stage(
    two_node_slurm_cluster: SlurmCluster,  # noqa: F811 - the fixture, imported above
    tmp_path: Path,
) -> None:
    cluster = two_node_slurm_cluster
    assert cluster.nodes == ("n1", "n2")
    reports = [tmp_path / "stage1.json", tmp_path / "stage2.json"]
    job, submitted = _submit(cluster, tmp_path, STAGE, *([str(r)] for r in reports))
    _finished(cluster, job, submitted, tmp_path)
    first, second = (json.loads(r.read_text()) for r in reports)

    # One Ray cluster of both Slurm nodes, each a live Ray node under its Slurm name.
    assert first["info"]["nodes"] == ["n1", "n2"] and first["info"]["gpus_per_node"] == GPUS
    assert sorted(n["name"] for n in first["nodes"]) == ["n1", "n2"]
    assert all(n["state"].endswith("ALIVE") for n in first["nodes"])
    name_of = {n["node_id"]: n["name"] for n in first["nodes"]}
    # The job's two actors ran one on each node: Ray's node ids, and Slurm's node names.
    for stage in (first, second):
        assert stage["exit_code"] == 0, stage["detail"]
        actors = json.loads(next(line for line in stage["lines"] if line.startswith("ACTORS "))[7:])
        assert sorted(name_of[a["node_id"]] for a in actors) == ["n1", "n2"]
        assert all(a["slurm_node"] == name_of[a["node_id"]] for a in actors)
    # The second stage (another process) ran on the first stage's cluster: one head.
    assert first["info"]["head_reused"] is False and second["info"]["head_reused"] is True
    assert second["head_pid"] == first["head_pid"]
    assert second["info"]["address"] == first["info"]["address"]
    assert second["nodes"] == first["nodes"]
    # The allocation's end took the cluster with it, on both nodes.
    _nothing_left(cluster, job, first["info"]["ray_temp_dir"])


def test_a_node_that_dies_during_the_run_fails_it_naming_the_node(
    two_node_slurm_cluster: SlurmCluster,  # noqa: F811 - the fixture, imported above
    tmp_path: Path,
) -> None:
    cluster = two_node_slurm_cluster
    report, seen = tmp_path / "report.json", tmp_path / "seen.txt"
    job, submitted = _submit(cluster, tmp_path, NODE_DIES, [str(report), str(seen)])
    deadline = time.monotonic() + 400
    while not (seen.exists() and "ready" in seen.read_text()):
        assert time.monotonic() < deadline, "the job never started"
        assert cluster.job_state(job) in ("PENDING", "RUNNING"), cluster.job_state(job)
        time.sleep(0.5)
    # n2 dies: every process of the job there, Ray's included, is killed at once.
    victims = _job_processes_on(cluster, job, "n2")
    assert any("raylet" in " ".join(p.cmdline()) for p in victims), [p.cmdline() for p in victims]
    killed_at = time.time()
    for proc in victims:
        proc.send_signal(signal.SIGKILL)

    _finished(cluster, job, submitted, tmp_path)
    done = json.loads(report.read_text())
    assert "error" in done, done
    assert "node n2 exited" in done["error"]
    print(f"node n2 killed -> RunnerError after {done['error_at'] - killed_at:.1f} s")
    assert done["error_at"] - killed_at < 30, done["error"]
    _nothing_left(cluster, job, done["info"]["ray_temp_dir"])
