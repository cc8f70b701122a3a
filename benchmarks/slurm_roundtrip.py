"""How long a Slurm round trip takes on the single-node test cluster (scripts/slurm).

Two figures, each per job:
- plain sbatch: submit -> seen running -> seen finished (squeue polled every 50 ms) for a
  job that only echoes, with and without a GPU request;
- Snakemake through the Slurm executor and profiles/ci-slurm: wall time of the two-rule
  workflow divided by its Slurm jobs (this is what each pipeline rule adds in CI), split by
  slurmctld's clock into queueing, running (Snakemake's job start-up inside the job
  included) and the rest (sbatch, the plugin's status polling).

Usage: python benchmarks/slurm_roundtrip.py [--jobs N] [--no-snakemake]
Starts the cluster when it is not running, and stops it again at the end in that case.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
# The fixture module is the one place that drives scripts/slurm from Python.
from slurm_cluster import (
    DEFAULT_DIR,
    SlurmCluster,
    cluster_is_running,
    run_two_rule_workflow,
    start_cluster,
    stop_cluster,
)


def _sbatch_round_trips(cluster: SlurmCluster, jobs: int, gres: str | None, workdir: Path) -> None:
    running, finished = [], []
    for _ in range(jobs):
        extra = [f"--gres={gres}"] if gres else []
        submitted = time.monotonic()
        job_id = cluster.sbatch(
            *extra, f"--output={workdir}/%j.out", "--wrap", "echo $SLURM_JOB_ID"
        )
        times = cluster.wait_job(job_id, submitted, poll_s=0.05)
        if times.state != "COMPLETED":
            raise SystemExit(f"job {job_id} ended {times.state}")
        running.append(
            times.seen_running_s if times.seen_running_s is not None else times.seen_finished_s
        )
        finished.append(times.seen_finished_s)
    label = f"sbatch --gres={gres}" if gres else "sbatch (no gres)"
    print(
        f"{label:32s} jobs={jobs}  submit->running median {statistics.median(running):.2f}s "
        f"(max {max(running):.2f}s)  submit->finished median {statistics.median(finished):.2f}s "
        f"(max {max(finished):.2f}s)"
    )


def _slurm_clock(cluster: SlurmCluster, job_id: str) -> tuple[float, float]:
    """(queued, ran) seconds of a job by slurmctld's clock (1 s resolution)."""
    submit, start, end = (
        datetime.fromisoformat(cluster.job_field(job_id, name))
        for name in ("SubmitTime", "StartTime", "EndTime")
    )
    return (start - submit).total_seconds(), (end - start).total_seconds()


def _snakemake_round_trip(cluster: SlurmCluster, workdir: Path) -> None:
    run = run_two_rule_workflow(cluster, workdir)
    if run.returncode != 0:
        raise SystemExit(f"snakemake failed:\n{run.log[-3000:]}")
    per_job = run.wall_s / len(run.slurm_job_ids)
    print(
        f"{'snakemake --profile ci-slurm':32s} slurm jobs={len(run.slurm_job_ids)} "
        f"({', '.join(run.slurm_job_ids)})  wall {run.wall_s:.1f}s  per job {per_job:.1f}s"
    )
    # The rules run one after the other: what is not queueing or running inside Slurm is
    # Snakemake's own start-up, sbatch, and the plugin's status polling.
    clocks = [_slurm_clock(cluster, job_id) for job_id in run.slurm_job_ids]
    queued, ran = sum(c[0] for c in clocks), sum(c[1] for c in clocks)
    outside = run.wall_s - queued - ran
    print(
        f"{'  by slurmctld clock':32s} queued {queued:.0f}s  ran {ran:.0f}s (job start-up "
        f"included)  outside Slurm {outside:.1f}s ({outside / len(clocks):.1f}s per job)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5, help="sbatch jobs per kind (default 5)")
    parser.add_argument("--no-snakemake", action="store_true", help="skip the Snakemake workflow")
    options = parser.parse_args()

    directory = Path(os.environ.get("RECIPEVAL_SLURM_DIR", DEFAULT_DIR))
    started_here = not cluster_is_running(directory)
    up_started = time.monotonic()
    cluster = start_cluster(directory)
    print(
        f"cluster up in {time.monotonic() - up_started:.1f}s ({'started' if started_here else 'already running'})"
    )
    try:
        with tempfile.TemporaryDirectory() as scratch:
            workdir = Path(scratch)
            _sbatch_round_trips(cluster, options.jobs, None, workdir)
            _sbatch_round_trips(cluster, options.jobs, f"gpu:{cluster.gpu_type}:2", workdir)
            if not options.no_snakemake:
                (workdir / "snakemake").mkdir()
                _snakemake_round_trip(cluster, workdir / "snakemake")
    finally:
        if started_here:
            down_started = time.monotonic()
            stop_cluster(cluster)
            print(f"cluster down in {time.monotonic() - down_started:.1f}s")


if __name__ == "__main__":
    main()
