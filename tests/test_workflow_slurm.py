"""The pipeline through a real Slurm: `snakemake --profile slurm-amd --profile ci-slurm` on the
single-node test cluster (tests/slurm_cluster.py). End to end over a recipe that asks for GPUs
(sbatch per recipe, its GPU stages grouped in one allocation, gres, the slurm runner's Ray head
inside the allocation, results and the published table back); a CPU recipe's stage over its
Slurm time limit (an error, then a retry with more time; no gres asked); cancelling Snakemake.
After each test no Slurm job and no process of it is left. The module is the suite's slowest,
so each case runs one recipe (several recipes in one DAG are tests/test_workflow.py's, locally).

What sbatch submitted is read back from slurmctld (`scontrol show job`: partition, nodes, CPUs,
gres, time limit), not from the plugin's --verbose log, which also dumps each job's whole
environment. The submissions, job ids, Slurm's clock and the final table are printed (pytest
-rA or -s shows them) and a short summary is written to the terminal at the end of the run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil
import pytest
from conftest import TERMINAL_SUMMARY, interruptible_session, kill_session
from slurm_cluster import (  # noqa: F401  (slurm_cluster_fixture provides `slurm_cluster`)
    TERMINAL_STATES,
    SlurmCluster,
    job_processes,
    slurm_cluster_fixture,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.slurm_e2e]

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY_GPU = REPO / "recipes/ci/tiny-grpo-2gpu.yaml"
TINY_SLOW = REPO / "recipes/ci/tiny-grpo-slow.yaml"
# What Snakemake and the Slurm plugin log.
SUBMITTED_LINE = re.compile(r"^.*has been submitted with SLURM jobid (\d+).*$", re.MULTILINE)
FINISHED = re.compile(r"^Finished jobid: \d+ \(Rule: (\w+)\)", re.MULTILINE)
# What slurmctld recorded of each submission.
JOB_FIELDS = ("JobState", "Comment", "Partition", "NumNodes", "NumCPUs", "TresPerNode",
              "TimeLimit", "SubmitTime", "StartTime", "EndTime")  # fmt: skip


@dataclass(frozen=True)
class Run:
    """One Snakemake run: exit status, wall time, its log, the Slurm jobs it made."""

    returncode: int
    wall_s: float
    log: str
    workdir: Path

    @property
    def submissions(self) -> list[str]:
        return [m.group(0).strip() for m in SUBMITTED_LINE.finditer(self.log)]

    @property
    def job_ids(self) -> list[str]:
        return [m.group(1) for m in SUBMITTED_LINE.finditer(self.log)]

    @property
    def finished_rules(self) -> list[str]:
        return sorted(FINISHED.findall(self.log))

    def slurm_logs(self, job_id: str = "*") -> str:
        """The end of each Slurm log the plugin kept (of one job, given its id)."""
        logs = sorted((self.workdir / ".snakemake" / "slurm_logs").rglob(f"{job_id}.log"))
        return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}" for p in logs)


@pytest.fixture
def summary(record_property: Callable[[str, object], None]) -> Callable[[str], None]:
    """Adds a line to the summary printed at the end of the run (conftest.TERMINAL_SUMMARY)."""
    return lambda line: record_property(TERMINAL_SUMMARY, line)


@pytest.fixture(scope="module")
def profiles_env(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """The cluster's environment with the repo's profiles installed by name (as a user does
    with scripts/install-profiles.sh) in a private config folder, and this venv first on PATH."""
    xdg = tmp_path_factory.mktemp("xdg")
    env = {
        **slurm_cluster.env,
        "XDG_CONFIG_HOME": str(xdg),
        "PATH": f"{BIN}{os.pathsep}{slurm_cluster.env.get('PATH', os.defpath)}",
    }
    subprocess.run(
        [str(REPO / "scripts/install-profiles.sh")], env=env, check=True, capture_output=True
    )
    return env


def snakemake_argv(workdir: Path, recipes: list[Path], config: list[str], *extra: str) -> list[str]:
    """`snakemake --profile slurm-amd --profile ci-slurm` over `recipes` (the --config entries
    come last: --config takes every word after it)."""
    files = ", ".join(str(r) for r in recipes)
    return [
        sys.executable, "-m", "snakemake",
        "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
        "--profile", "slurm-amd", "--profile", "ci-slurm", *extra,
        "--config", f"recipes={{globs: [], files: [{files}]}}", *config,
    ]  # fmt: skip


def start_snakemake(argv: list[str], workdir: Path, env: dict[str, str]) -> subprocess.Popen:
    log = open(workdir / "snakemake.log", "wb")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, preexec_fn=interruptible_session,  # noqa: PLW1509
        )  # fmt: skip
    finally:
        log.close()


def run_snakemake(argv: list[str], workdir: Path, env: dict[str, str], timeout: float) -> Run:
    started = time.monotonic()
    proc = start_snakemake(argv, workdir, env)
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # cancels its Slurm jobs
            proc.wait(timeout=120)
    log = (workdir / "snakemake.log").read_text(errors="replace")
    return Run(proc.returncode, time.monotonic() - started, log, workdir)


def slurm_job(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    """A job as slurmctld recorded it (kept for MinJobAge): what was asked, state and clock."""
    fields = {}
    for name in JOB_FIELDS:
        try:
            fields[name] = cluster.job_field(job_id, name)
        except KeyError:  # scontrol leaves out what was not asked for (TresPerNode)
            fields[name] = "none"
    submit, start, end = (
        datetime.fromisoformat(fields[k]) for k in ("SubmitTime", "StartTime", "EndTime")
    )
    fields["queued_s"] = f"{(start - submit).total_seconds():.0f}"
    fields["ran_s"] = f"{(end - start).total_seconds():.0f}"
    return fields


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)


def stop_with(proc: subprocess.Popen, signum: int) -> float:
    """Send `signum` and wait for the process to exit; the seconds that took."""
    sent = time.monotonic()
    proc.send_signal(signum)
    proc.wait(timeout=120)
    return time.monotonic() - sent


def wait_for_running_job(cluster: SlurmCluster, log_path: Path) -> str:
    """The id of the first job the run at `log_path` submitted, once Slurm runs it."""
    wait_for(lambda: SUBMITTED_LINE.search(log_path.read_text(errors="replace")), 120,
             "the first job's submission")  # fmt: skip
    job_id = SUBMITTED_LINE.search(log_path.read_text(errors="replace")).group(1)
    wait_for(lambda: cluster.job_state(job_id) == "RUNNING", 60, f"job {job_id} to run")
    return job_id


def assert_nothing_left(cluster: SlurmCluster, job_ids: list[str], workdir: Path) -> None:
    """No job of the run still in the queue, no process of its jobs (Ray included: it inherits
    the job's environment), no process running from its working directory."""
    active = [j for j in job_ids if cluster.job_state(j) not in TERMINAL_STATES]
    assert active == [], f"slurm jobs still active: {active}"

    def leftovers() -> list[str]:
        found = [p for j in job_ids for p in job_processes(j, cluster.conf)]
        for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
            try:
                in_workdir = str(workdir) in " ".join(proc.info["cmdline"] or []) or str(
                    proc.info["cwd"] or ""
                ).startswith(str(workdir))
            except psutil.Error:
                continue
            if in_workdir and proc.info["pid"] != os.getpid():
                found.append(f"{proc.info['pid']} {' '.join(proc.info['cmdline'] or [])}")
        return found

    try:
        wait_for(lambda: not leftovers(), 60, "the jobs' processes to exit")
    except AssertionError:
        raise AssertionError(f"processes left: {leftovers()}") from None


def settled_state(cluster: SlurmCluster, job_id: str) -> str:
    """The job's state once Slurm is done with it: scancel is asynchronous, and a cancelled job
    stays COMPLETING until every process of its cgroup has ended (KillWait, then SIGKILL)."""
    return cluster.wait_job(job_id, time.monotonic(), timeout=30).state


def report(
    run: Run, cluster: SlurmCluster, summary: Callable[[str], None], title: str
) -> dict[str, dict]:
    """Print the submissions and what slurmctld recorded of each job; add them to the summary."""
    jobs = {job_id: slurm_job(cluster, job_id) for job_id in run.job_ids}
    print(f"== {title}: snakemake exit {run.returncode} after {run.wall_s:.0f}s")
    print("\n".join(run.submissions))
    summary(
        f"{title}: {len(jobs)} slurm jobs in {run.wall_s:.0f}s (snakemake exit {run.returncode})"
    )
    for job_id, job in jobs.items():
        line = (
            f"  job {job_id} {job['Comment']}: -p {job['Partition']} --nodes={job['NumNodes']} "
            f"cpus={job['NumCPUs']} {job['TresPerNode']} -t {job['TimeLimit']} -> "
            f"{job['JobState']}, queued {job['queued_s']}s, ran {job['ran_s']}s"
        )
        print(line)
        summary(line)
    return jobs


def stage_result(workdir: Path, recipe: str, stage: str) -> dict:
    return json.loads((workdir / "results" / recipe / f"{stage}.json").read_text())


def test_pipeline_runs_through_slurm_with_gres_and_the_slurm_runner(
    slurm_cluster: SlurmCluster,
    profiles_env: dict[str, str],
    summary: Callable[[str], None],
    tmp_path: Path,
) -> None:
    # Every stage, the GPU ones grouped in one allocation.
    argv = snakemake_argv(tmp_path, [TINY_GPU], [])
    run = run_snakemake(argv, tmp_path, profiles_env, timeout=1800)
    try:
        jobs = report(run, slurm_cluster, summary, "pipeline (2-GPU recipe)")
        table = (tmp_path / "results/tables/benchmarks.md").read_text()
        print(table)
        for line in table.splitlines():
            summary(f"  {line}")
    except Exception:
        print(run.log[-5000:], run.slurm_logs())
        raise
    assert run.returncode == 0, run.log[-5000:] + run.slurm_logs()

    # One allocation for the recipe's GPU stages; env_check and publish stay local.
    (job,) = jobs.values()
    assert job["TresPerNode"] == f"gres:gpu:{slurm_cluster.gpu_type}:2", job
    assert job["JobState"] == "COMPLETED"
    assert job["Comment"] == "rule_gpu_stages_bench_logprob_diff_smoke"
    assert job["Partition"] == slurm_cluster.partition
    assert (job["NumNodes"], job["NumCPUs"]) == ("1", "2")
    # Each stage's timeout * 1.1 + 10 min, summed over the group: smoke and logprob_diff
    # 10 min -> 21 each, bench 20 min -> 32.
    assert job["TimeLimit"] == "01:14:00"

    # Snakemake saw every job finish.
    stages = ["env_check", "smoke", "logprob_diff", "bench"]
    assert run.finished_rules == sorted(["all", "publish", *stages])
    assert re.search(r"(\d+) of \1 steps \(100%\) done", run.log)

    # Each GPU stage ran inside the allocation through the slurm runner (Ray head there).
    recipe = "tiny-grpo-2gpu"
    results = {stage: stage_result(tmp_path, recipe, stage) for stage in stages}
    assert results["env_check"]["status"] == "pass"
    for stage in stages[1:]:
        result = results[stage]
        assert result["status"] == "pass", (stage, result["message"])
        assert result["summary"]["runner"] == "slurm", (stage, result["summary"])
    info = results["smoke"]["summary"]["runner_info"]
    assert info["nodes"] == [slurm_cluster.node] and info["gpus_per_node"] == 2
    # The group's stages ran on one Ray cluster: smoke (first) started it, bench reused it.
    bench = results["bench"]["summary"]
    bench_info = bench["runner_info"]
    assert (info["head_reused"], bench_info["head_reused"]) == (False, True), bench_info
    assert bench_info["ray_temp_dir"] == info["ray_temp_dir"]
    # 16-token steps last ~0.1 s and wander by more than 10 %: the bench may run to its
    # max_steps (a warning); what counts here is that it judged a steady state at all.
    assert bench["stop"] in ("precise", "max_steps") and bench["steps"] >= 5, bench
    assert {"perf/rollout_time", "cycle_time"} <= set(bench["metrics"]), bench["metrics"]
    pair = results["logprob_diff"]["summary"]["pairwise"][0]
    assert pair["identical_tokens"]["method"] == "re-scored"
    # The recipe's env_check is static here: the submit host has none of its GPUs.
    assert not any(c["id"].startswith("probe.") for c in results["env_check"]["checks"])

    # The published table came back with the recipe's stages.
    assert recipe in (tmp_path / "results/tables/benchmarks.md").read_text()
    assert (tmp_path / "results/junit.xml").is_file()
    assert_nothing_left(slurm_cluster, run.job_ids, tmp_path)


def test_stage_over_its_time_limit_is_an_error_and_a_retry_with_more_time_completes(
    slurm_cluster: SlurmCluster,
    profiles_env: dict[str, str],
    summary: Callable[[str], None],
    tmp_path: Path,
) -> None:
    # Attempt 1 gets 1 minute, less than the stage's own 90 s timeout: Slurm kills it. Attempt 2
    # gets 5 minutes: the stage's own timeout fires first and writes its (error) result, as the
    # pipeline intends. The local runner keeps Ray's start-up out of this test.
    argv = snakemake_argv(
        tmp_path, [TINY_SLOW], ["stages=[env_check,smoke]", "runner=local", "gpu_group=none"],
        "--retries", "1", "--set-resources", "smoke:runtime=1+4*(attempt-1)",
    )  # fmt: skip
    run = run_snakemake(argv, tmp_path, profiles_env, timeout=900)
    try:
        jobs = report(run, slurm_cluster, summary, "time limit, then retry with more time")
    except Exception:
        print(run.log[-5000:], run.slurm_logs())
        raise
    assert run.returncode == 0, run.log[-5000:] + run.slurm_logs()
    first, second = run.job_ids
    assert {job["Comment"] for job in jobs.values()} == {"rule_smoke_wildcards_tiny-grpo-slow"}
    # A recipe without GPUs asks Slurm for none.
    assert {job["TresPerNode"] for job in jobs.values()} == {"none"}
    assert (jobs[first]["TimeLimit"], jobs[first]["JobState"]) == ("00:01:00", "TIMEOUT")
    assert "DUE TO TIME LIMIT" in run.slurm_logs(first)
    assert (jobs[second]["TimeLimit"], jobs[second]["JobState"]) == ("00:05:00", "COMPLETED")
    # Snakemake names the stage and Slurm's verdict, then retries it.
    assert f"SLURM-job '{first}' failed, SLURM status is: 'TIMEOUT'" in run.log
    assert re.search(r"Error in rule smoke:", run.log)
    assert "Trying to restart job" in run.log
    result = stage_result(tmp_path, "tiny-grpo-slow", "smoke")
    assert result["status"] == "error" and "90" in result["message"], result["message"]
    table = (tmp_path / "results/tables/benchmarks.md").read_text()
    row = next(line for line in table.splitlines() if "tiny-grpo-slow" in line)
    print(row)
    assert "error" in row
    assert_nothing_left(slurm_cluster, run.job_ids, tmp_path)


def test_sigterm_waits_for_running_jobs_and_sigint_cancels_them(
    slurm_cluster: SlurmCluster,
    profiles_env: dict[str, str],
    summary: Callable[[str], None],
    tmp_path: Path,
) -> None:
    argv = snakemake_argv(
        tmp_path, [TINY_SLOW], ["stages=[env_check,smoke]", "runner=local", "gpu_group=none"]
    )
    log_path = tmp_path / "snakemake.log"
    proc = start_snakemake(argv, tmp_path, profiles_env)
    try:
        job_id = wait_for_running_job(slurm_cluster, log_path)

        # SIGTERM is Snakemake's graceful stop: it waits for running jobs, cancels nothing.
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "Will exit after finishing currently running jobs"
                 in log_path.read_text(errors="replace"), 60, "snakemake's graceful stop")  # fmt: skip
        time.sleep(3)
        assert proc.poll() is None and slurm_cluster.job_state(job_id) == "RUNNING"

        # SIGINT (Ctrl-C) cancels its Slurm jobs (scancel) and exits.
        exit_s = stop_with(proc, signal.SIGINT)
    finally:
        kill_session(proc)
    log = log_path.read_text(errors="replace")
    print("\n".join(m.group(0) for m in SUBMITTED_LINE.finditer(log)))
    state = settled_state(slurm_cluster, job_id)
    summary(
        f"cancel: SIGTERM kept job {job_id} running; SIGINT -> {state}, snakemake "
        f"exit {proc.returncode} after {exit_s:.1f}s"
    )
    assert proc.returncode != 0
    assert state == "CANCELLED", log[-3000:]
    assert "Terminating processes on user request" in log
    assert_nothing_left(slurm_cluster, [job_id], tmp_path)


def test_sigterm_to_nightly_cancels_its_slurm_jobs(
    slurm_cluster: SlurmCluster,
    profiles_env: dict[str, str],
    summary: Callable[[str], None],
    tmp_path: Path,
) -> None:
    # What a CI timeout or a cron kill sends: the nightly turns it into Snakemake's cancel.
    files = f"recipes={{globs: [], files: [{TINY_SLOW}]}}"
    argv = [
        str(BIN / "recipeval"), "nightly", "--profile", "slurm-amd", "--profile", "ci-slurm",
        "--verdict", str(tmp_path / "results/regression.json"),
        "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
        "--config", files, "stages=[env_check,smoke]", "runner=local", "gpu_group=none",
    ]  # fmt: skip
    log_path = tmp_path / "snakemake.log"
    proc = start_snakemake(argv, tmp_path, profiles_env)
    try:
        job_id = wait_for_running_job(slurm_cluster, log_path)
        exit_s = stop_with(proc, signal.SIGTERM)
    finally:
        kill_session(proc)
    log = log_path.read_text(errors="replace")
    state = settled_state(slurm_cluster, job_id)
    summary(f"nightly: SIGTERM -> job {job_id} {state}, exit {proc.returncode} after {exit_s:.1f}s")
    assert proc.returncode == 128 + signal.SIGTERM, log[-3000:]
    assert state == "CANCELLED", log[-3000:]
    assert "SIGTERM: cancelling snakemake's jobs" in log
    assert "stopped by SIGTERM" in log and "no verdict" in log
    assert_nothing_left(slurm_cluster, [job_id], tmp_path)
