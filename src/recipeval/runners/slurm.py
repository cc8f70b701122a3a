"""Run a launch inside a Slurm allocation on one Ray cluster per allocation: a Ray head as a job
step on the allocation's first node (where the batch script runs), one Ray worker step per other
node, wait until every node and GPU has joined, then submit exactly as the `ray` runner does.

The cluster belongs to the allocation, not to one stage: the first runner of a job starts it and
records it in a per-job state dir ($TMPDIR/recipeval-slurm-<SLURM_JOB_ID>/cluster.json); later
runners of the same job (the stages of a grouped allocation) reuse it while every part is alive.
Every Ray process runs inside an `srun` step, so Slurm ends all of them when the allocation
ends. A runner tears the cluster down itself only when it is broken (a start that failed, a
node that died during a run), so the next stage starts a fresh one.

Nodes are told apart by SLURMD_NODENAME (set by Slurm in every job), not by the host name:
several Slurm nodes may share one host (multiple-slurmd test clusters).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from recipeval.atomic import atomic_write_text
from recipeval.engines.launch import Launch
from recipeval.runners import ray_head
from recipeval.runners.base import LineSink, RunnerError, RunResult, node_gpus
from recipeval.runners.ray import RayRunner

JOIN_TIMEOUT_S = 300.0
WATCH_S = 0.5  # how often a run checks that every part of the cluster is alive
WORKER_STOP_S = 30.0
CLUSTER_FILE = "cluster.json"


def in_allocation(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return bool(environ.get("SLURM_JOB_ID") and environ.get("SLURM_JOB_NODELIST"))


def allocation_nodes(environ: Mapping[str, str]) -> list[str]:
    """Expand SLURM_JOB_NODELIST (`node[01-04]`) with Slurm's own `scontrol show hostnames`."""
    nodelist = environ["SLURM_JOB_NODELIST"]
    proc = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist],
        capture_output=True,
        text=True,
        check=False,
        env=dict(environ),
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


def node_address(node: str, environ: Mapping[str, str]) -> str:
    """The IP of a Slurm node: its NodeAddr (`scontrol show node`), else its name, resolved."""
    proc = subprocess.run(
        ["scontrol", "show", "node", "--oneliner", node],
        capture_output=True,
        text=True,
        check=False,
        env=dict(environ),
    )
    fields = dict(w.partition("=")[::2] for w in proc.stdout.split() if "=" in w)
    try:
        return socket.gethostbyname(fields.get("NodeAddr") or node)
    except OSError as err:
        raise RunnerError(f"cannot resolve the address of Slurm node {node}: {err}") from err


def this_node(environ: Mapping[str, str]) -> str:
    """The Slurm node this process runs on: SLURMD_NODENAME inside a job, else the host name."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def gpus_per_node(environ: Mapping[str, str], fallback: int) -> int:
    """GPUs Slurm gave this job per node (gres), else what the recipe asks for."""
    for var in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        value = environ.get(var, "").rsplit(":", 1)[-1]
        if value.isdigit():
            return int(value)
    return fallback


@dataclass
class WorkerStep:
    """The local `srun` client of one node's `ray start --block` step."""

    node: str
    pid: int
    create_time: float
    log: str


@dataclass
class AllocationCluster:
    """The Ray cluster of one allocation, as recorded in its state dir."""

    job_id: str
    head: ray_head.HeadState
    workers: list[WorkerStep] = field(default_factory=list)

    def dead(self) -> str | None:
        """What part of the cluster has died, if any, in words naming the node."""
        if not ray_head.head_alive(self.head):
            return f"the Ray head exited (its log: {self.head.log})"
        for worker in self.workers:
            if not _alive(worker.pid, worker.create_time):
                return f"the Ray worker on node {worker.node} exited (its log: {worker.log})"
        return None


def _alive(pid: int, create_time: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.create_time() == create_time and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def read_cluster(state_dir: Path) -> AllocationCluster | None:
    try:
        data = json.loads((state_dir / CLUSTER_FILE).read_text())
        return AllocationCluster(
            job_id=data["job_id"],
            head=ray_head.HeadState(**data["head"]),
            workers=[WorkerStep(**w) for w in data["workers"]],
        )
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _write_cluster(state_dir: Path, cluster: AllocationCluster) -> None:
    atomic_write_text(state_dir / CLUSTER_FILE, json.dumps(asdict(cluster), indent=2))


def stop_cluster(cluster: AllocationCluster) -> None:
    """Stop the worker steps (srun forwards SIGTERM to `ray start --block`), then the head."""
    procs = []
    for worker in cluster.workers:
        if _alive(worker.pid, worker.create_time):
            proc = psutil.Process(worker.pid)
            procs.append(proc)
            try:
                proc.terminate()
            except psutil.Error:
                continue
    _, left = psutil.wait_procs(procs, timeout=WORKER_STOP_S)
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            continue
    ray_head.stop_head(cluster.head)


def _step(node: str) -> list[str]:
    """An `srun` prefix that runs one task on `node` as a step of the job named by SLURM_JOB_ID
    of the runner's environment, beside whatever else runs there."""
    return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap"]


class SlurmRunner(RayRunner):
    name = "slurm"

    def __init__(
        self,
        gpus_per_node_hint: int = 0,
        environ: Mapping[str, str] | None = None,
        join_timeout: float = JOIN_TIMEOUT_S,
    ) -> None:
        ray_head.pin_auth_mode()
        environ = dict(os.environ if environ is None else environ)
        # The Ray steps must agree with this process's clients on token authentication.
        environ.setdefault(ray_head.AUTH_MODE_ENV, os.environ[ray_head.AUTH_MODE_ENV])
        self._private_head = self._shared_head = None
        self.cluster: AllocationCluster | None = None
        self.reused = False
        self._broken: str | None = None
        if not in_allocation(environ):
            raise RunnerError(
                "--runner slurm needs a Slurm allocation (SLURM_JOB_ID, SLURM_JOB_NODELIST): "
                "run it through sbatch/salloc, or choose --runner ray or local"
            )
        self.nodes = allocation_nodes(environ)
        self.gpus = gpus_per_node(environ, gpus_per_node_hint)
        here = this_node(environ)
        if here != self.nodes[0].split(".")[0]:
            raise RunnerError(
                f"the slurm runner starts the Ray head on the allocation's first node "
                f"{self.nodes[0]}, but runs on {here}; run it from the batch script"
            )
        job = environ["SLURM_JOB_ID"]
        self.state_dir = Path(environ.get("TMPDIR", "/tmp")) / f"recipeval-slurm-{job}"
        with ray_head.locked(self.state_dir):
            recorded = read_cluster(self.state_dir)
            if (
                recorded is not None
                and recorded.dead() is None
                and ray_head.dashboard_ready(recorded.head.dashboard)
            ):
                self.cluster, self.reused = recorded, True
            else:
                if recorded is not None:
                    stop_cluster(recorded)
                self._start_cluster(environ, job, join_timeout)
        super().__init__(address=self.cluster.head.dashboard)

    def _start_cluster(self, environ: Mapping[str, str], job: str, join_timeout: float) -> None:
        (self.state_dir / CLUSTER_FILE).unlink(missing_ok=True)
        head = ray_head.start_head(
            self.state_dir,
            host=node_address(self.nodes[0], environ),
            num_gpus=self.gpus,
            node_name=self.nodes[0],
            launcher=_step(self.nodes[0]),
            env=environ,
        )
        self.cluster = AllocationCluster(job_id=job, head=head)
        try:
            for node in self.nodes[1:]:
                self.cluster.workers.append(self._start_worker(node, environ))
            wait_for_nodes(
                head.dashboard,
                self.nodes,
                self.gpus * len(self.nodes),
                join_timeout,
                self.cluster.dead,
            )
        except BaseException:
            stop_cluster(self.cluster)
            self.cluster = None
            raise
        _write_cluster(self.state_dir, self.cluster)

    def _start_worker(self, node: str, environ: Mapping[str, str]) -> WorkerStep:
        assert self.cluster is not None
        cmd = [
            *_step(node),
            ray_head.ray_executable(),
            "start",
            "--block",
            "--disable-usage-stats",
            f"--address={self.cluster.head.gcs}",
            f"--num-gpus={self.gpus}",
            f"--node-name={node}",
        ]
        log = self.state_dir / f"ray-worker-{node}.log"
        with open(log, "wb") as out:
            # Its own session: stopping this stage's process group leaves the step to its runner.
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=dict(environ),
            )
        return WorkerStep(
            node=node,
            pid=proc.pid,
            create_time=psutil.Process(proc.pid).create_time(),
            log=str(log),
        )

    def run(
        self,
        launch: Launch,
        on_line: LineSink,
        timeout: float | None = None,
        stop: threading.Event | None = None,
    ) -> RunResult:
        """Run as the ray runner does, while a watcher checks every node of the cluster: when one
        dies the job is stopped and the run fails with a RunnerError naming the node."""
        assert self.cluster is not None
        cluster = self.cluster
        halt = threading.Event()
        finished = threading.Event()
        dead: list[str] = []

        def watch() -> None:
            while not finished.wait(WATCH_S):
                if stop is not None and stop.is_set():
                    halt.set()
                why = cluster.dead()
                if why:
                    dead.append(why)
                    halt.set()
                    return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            result = super().run(launch, on_line, timeout=timeout, stop=halt)
        finally:
            finished.set()
            watcher.join()
        if dead:
            self._broken = dead[0]
            raise RunnerError(
                f"Ray cluster of Slurm job {cluster.job_id} broke during the run: "
                f"{dead[0]}; {result.detail or 'job ended'}"
            )
        return result

    def describe(self) -> dict[str, object]:
        return {
            "runner": self.name,
            "address": self.address,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus,
            "ray_temp_dir": self.cluster.head.temp_dir if self.cluster else None,
            "head_reused": self.reused,
            # The stage runs inside the allocation, on its first node.
            "gpu": node_gpus(),
        }

    def close(self) -> None:
        """Leave a healthy cluster to the next stage of the allocation (Slurm ends its steps
        with the job); tear a broken one down so the next stage starts afresh."""
        if self.cluster is not None and self._broken:
            with ray_head.locked(self.state_dir):
                stop_cluster(self.cluster)
                (self.state_dir / CLUSTER_FILE).unlink(missing_ok=True)
        self.cluster = None
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
