"""Run a launch inside a Slurm allocation: a Ray head on the allocation's first node (where the
batch script runs), one `srun` Ray worker per other node, wait until every node and GPU has
joined, then submit exactly as the `ray` runner does. The cluster is torn down when the runner
closes, also after a failure."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from recipeval.runners import ray_head
from recipeval.runners.base import RunnerError
from recipeval.runners.ray import RayRunner

JOIN_TIMEOUT_S = 300.0


def in_allocation(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return bool(environ.get("SLURM_JOB_ID") and environ.get("SLURM_JOB_NODELIST"))


def allocation_nodes(environ: Mapping[str, str]) -> list[str]:
    """Expand SLURM_JOB_NODELIST (`node[01-04]`) with Slurm's own `scontrol show hostnames`."""
    nodelist = environ["SLURM_JOB_NODELIST"]
    proc = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RunnerError(f"scontrol show hostnames {nodelist} failed: {proc.stderr.strip()}")
    nodes = proc.stdout.split()
    expected = int(environ.get("SLURM_JOB_NUM_NODES", len(nodes)))
    if len(nodes) != expected:
        raise RunnerError(
            f"SLURM_JOB_NODELIST {nodelist} has {len(nodes)} nodes, SLURM_JOB_NUM_NODES says {expected}"
        )
    return nodes


def gpus_per_node(environ: Mapping[str, str], fallback: int) -> int:
    """GPUs Slurm gave this job per node (gres), else what the recipe asks for."""
    for var in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        value = environ.get(var, "").rsplit(":", 1)[-1]
        if value.isdigit():
            return int(value)
    return fallback


class SlurmRunner(RayRunner):
    name = "slurm"

    def __init__(
        self,
        gpus_per_node_hint: int = 0,
        environ: Mapping[str, str] | None = None,
        join_timeout: float = JOIN_TIMEOUT_S,
    ) -> None:
        environ = dict(os.environ if environ is None else environ)
        self._private_head = self._shared_head = None
        self.workers: list[subprocess.Popen] = []
        self._head: ray_head.HeadState | None = None
        if not in_allocation(environ):
            raise RunnerError(
                "--runner slurm needs a Slurm allocation (SLURM_JOB_ID, SLURM_JOB_NODELIST): "
                "run it through sbatch/salloc, or choose --runner ray or local"
            )
        self.nodes = allocation_nodes(environ)
        self.gpus = gpus_per_node(environ, gpus_per_node_hint)
        here = socket.gethostname().split(".")[0]
        if here != self.nodes[0].split(".")[0]:
            raise RunnerError(
                f"the slurm runner starts the Ray head on the allocation's first node "
                f"{self.nodes[0]}, but runs on {here}; run it from the batch script"
            )
        try:
            self._start_cluster(environ, join_timeout)
        except BaseException:
            self.close()
            raise
        super().__init__(address=self._head.dashboard)

    def _start_cluster(self, environ: Mapping[str, str], join_timeout: float) -> None:
        job = environ["SLURM_JOB_ID"]
        state_dir = Path(environ.get("TMPDIR", "/tmp")) / f"recipeval-slurm-{job}"
        head_ip = socket.gethostbyname(self.nodes[0])
        self._head = ray_head.start_head(
            state_dir, host=head_ip, num_gpus=self.gpus, node_name=self.nodes[0]
        )
        for node in self.nodes[1:]:
            cmd = [
                "srun",
                "--nodes=1",
                "--ntasks=1",
                f"--nodelist={node}",
                "--overlap",
                ray_head.ray_executable(),
                "start",
                "--block",
                "--disable-usage-stats",
                f"--address={self._head.gcs}",
                f"--num-gpus={self.gpus}",
                f"--node-name={node}",
            ]
            log = open(state_dir / f"ray-worker-{node}.log", "wb")  # noqa: SIM115 - lives with the worker
            self.workers.append(
                subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            )
            log.close()
        wait_for_nodes(
            self._head.dashboard,
            self.nodes,
            self.gpus * len(self.nodes),
            join_timeout,
            self._exited,
        )

    def _exited(self) -> str | None:
        """What of the cluster being started has already died, if anything."""
        if self._head is not None and not ray_head.head_alive(self._head):
            return f"the Ray head exited (its log: {self._head.log})"
        for node, worker in zip(self.nodes[1:], self.workers, strict=False):
            if worker.poll() is not None:
                return f"the Ray worker on {node} exited with status {worker.returncode} (srun)"
        return None

    def describe(self) -> dict[str, object]:
        return {
            "runner": self.name,
            "address": self.address,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus,
            "ray_temp_dir": self._head.temp_dir if self._head else None,
        }

    def close(self) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                worker.terminate()  # srun forwards it to the step: `ray start --block` exits
        for worker in self.workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        self.workers = []
        if self._head is not None:
            ray_head.stop_head(self._head)
            self._head = None
        super().close()


def wait_for_nodes(
    dashboard: str,
    nodes: list[str],
    gpus: int,
    timeout: float,
    exited: Callable[[], str | None] = lambda: None,
) -> None:
    """Block until every node is ALIVE in Ray and the GPU total is reached; else name what is
    missing. `exited` says what part of the cluster died, if one did: waiting on stops then."""
    from ray.util.state import list_nodes

    end = time.monotonic() + timeout
    joined: dict[str, float] = {}
    while True:
        dead = exited()
        if dead:
            raise RunnerError(f"Ray cluster start failed: {dead}")
        try:
            states = list_nodes(address=dashboard, timeout=10)
        except Exception:  # noqa: BLE001 - the state API answers only once the head is up
            states = []
        joined = {
            s.node_name: float((s.resources_total or {}).get("GPU", 0))
            for s in states
            if str(s.state).endswith("ALIVE")
        }
        have_gpus = sum(joined.values())
        missing = [n for n in nodes if n not in joined]
        if not missing and have_gpus >= gpus:
            return
        if time.monotonic() > end:
            raise RunnerError(
                f"Ray cluster incomplete after {timeout:g} s: missing nodes "
                f"{', '.join(missing) or 'none'}; GPUs joined {have_gpus:g} of {gpus}"
            )
        time.sleep(1.0)
