"""A real Slurm for tests: the session fixtures `slurm_cluster` (one node) and
`two_node_slurm_cluster` (two slurmd on this host, its own directory and ports).

It installs Slurm from Debian's packages when missing (scripts/slurm/install.sh), starts it with
scripts/slurm/up.sh and stops it with scripts/slurm/down.sh at the end of the session. A
cluster that was already running in the same directory is used as it is and left running.
It skips only when this machine cannot run Slurm at all; with CI=true it fails instead.

Use it from a test module with `from slurm_cluster import slurm_cluster_fixture  # noqa: F401`
(registered under the name `slurm_cluster`).
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = REPO_ROOT / "scripts" / "slurm"
CI_PROFILE = REPO_ROOT / "profiles" / "ci-slurm"
DEFAULT_DIR = Path("/tmp/recipeval-slurm")
SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "slurmstepd", "sbatch", "srun", "squeue")
# Process names of a cluster; after down.sh none of ours may be left.
CLUSTER_PROCESS_NAMES = frozenset({"slurmctld", "slurmd", "slurmstepd", "munged"})
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


@dataclass(frozen=True)
class JobTimes:
    """Client-side clock of one job: seconds since submission when each state was first seen."""

    job_id: str
    state: str
    seen_running_s: float | None
    seen_finished_s: float


@dataclass(frozen=True)
class SlurmCluster:
    """A running cluster: where it lives, what it offers, and the environment to reach it."""

    directory: Path
    partition: str
    gpu_type: str
    node: str  # the first node
    nodes: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)

    @property
    def conf(self) -> Path:
        return self.directory / "etc" / "slurm.conf"

    def run(
        self, argv: list[str], timeout: float = 60, **kwargs: object
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster; raise with its stderr if it fails."""
        result = subprocess.run(
            argv,
            check=False,
            env=dict(self.env),
            capture_output=True,
            text=True,
            timeout=timeout,
            **kwargs,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}"
            )
        return result

    def sbatch(self, *args: str, cwd: Path | None = None) -> str:
        """Submit with sbatch --parsable; return the job id."""
        result = self.run(["sbatch", "--parsable", f"--partition={self.partition}", *args], cwd=cwd)
        return result.stdout.strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        """The job's state as squeue shows it (finished jobs stay visible for MinJobAge)."""
        result = self.run(
            ["squeue", "--noheader", "--states=all", f"--jobs={job_id}", "--format=%T"]
        )
        return result.stdout.strip()

    def job_field(self, job_id: str, name: str) -> str:
        """One `Name=value` field of `scontrol show job`."""
        for word in self.run(["scontrol", "show", "job", job_id]).stdout.split():
            key, _, value = word.partition("=")
            if key == name:
                return value
        raise KeyError(f"scontrol show job {job_id} has no field {name}")

    def job_processes(self, job_id: str) -> list[str]:
        """`pid args` of every process that runs as part of job `job_id` of this cluster."""
        return job_processes(job_id, self.conf)

    def wait_job(
        self, job_id: str, submitted_at: float, timeout: float = 120, poll_s: float = 0.05
    ) -> JobTimes:
        """Poll squeue until the job reaches a terminal state; time it from `submitted_at`."""
        seen_running = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            now = time.monotonic() - submitted_at
            if state in ("RUNNING", "COMPLETING") and seen_running is None:
                seen_running = now
            if state in TERMINAL_STATES:
                return JobTimes(job_id, state, seen_running, now)
            time.sleep(poll_s)
        raise TimeoutError(
            f"slurm job {job_id} not finished after {timeout:.0f}s (state {state!r})"
        )


def cluster_environment(directory: Path) -> dict[str, str]:
    """Environment variables that point Slurm clients (and scripts/slurm) at `directory`."""
    return {
        "SLURM_CONF": str(directory / "etc" / "slurm.conf"),
        "RECIPEVAL_SLURM_DIR": str(directory),
    }


def cluster_is_running(directory: Path) -> bool:
    """Whether the slurmctld recorded in `directory` is alive."""
    pid_file = directory / "run" / "slurmctld.pid"
    try:
        pid = int(pid_file.read_text().strip())
        return Path(f"/proc/{pid}/comm").read_text().strip() == "slurmctld"
    except (OSError, ValueError):
        return False


def processes_of(directory: Path) -> list[str]:
    """`pid args` of every process that belongs to the cluster in `directory`.

    A process belongs to it when it is a Slurm/munge daemon or job step whose environment,
    working directory or open files point into `directory`, or any process (a job's payload)
    whose environment names this cluster's slurm.conf.
    """
    marker = str(directory)
    conf_entry = f"SLURM_CONF={directory / 'etc' / 'slurm.conf'}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in _ancestors():
            continue
        try:
            name = (proc / "comm").read_text().strip()
            environ = (proc / "environ").read_bytes().split(b"\0")
            if name in CLUSTER_PROCESS_NAMES:
                links = [os.readlink(proc / "cwd")]
                links += [os.readlink(fd) for fd in (proc / "fd").iterdir()]
                ours = f"RECIPEVAL_SLURM_DIR={marker}".encode() in environ or any(
                    link.startswith(marker + "/") for link in links
                )
            else:
                ours = conf_entry in environ
            if ours:
                args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                found.append(f"{proc.name} {args or name}")
        except OSError:
            continue  # exited meanwhile, or not ours to read
    return found


def job_processes(job_id: str, conf: Path | None = None) -> list[str]:
    """`pid args` of every process of Slurm job `job_id` (of the cluster whose slurm.conf is
    `conf`, when given: job ids repeat across clusters)."""
    entries = {f"SLURM_JOB_ID={job_id}".encode()}
    if conf is not None:
        entries.add(f"SLURM_CONF={conf}".encode())
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if entries <= set((proc / "environ").read_bytes().split(b"\0")):
                args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                found.append(f"{proc.name} {args}")
        except OSError:
            continue  # exited meanwhile
    return found


def _ancestors() -> set[int]:
    """This process and its parents (a shell that exported SLURM_CONF is not a leftover)."""
    pids, pid = set(), os.getpid()
    while pid > 0 and pid not in pids:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def _unavailable_reason() -> str | None:
    """Why this machine cannot run the test cluster, or None when it can (maybe after installing)."""
    if platform.system() != "Linux":
        return f"Slurm test cluster needs Linux (this is {platform.system()})"
    if os.geteuid() != 0:
        return (
            "Slurm test cluster needs root (slurmd runs jobs as root here): run the tests as root"
        )
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
    if all(shutil.which(binary, path=path) for binary in SLURM_BINARIES):
        return None
    if shutil.which("apt-get") is None:
        return (
            "Slurm is not installed and cannot be installed here (no apt-get): "
            "install munge, slurmctld, slurmd and the Slurm clients"
        )
    return None


def skip_or_fail_under_ci(reason: str, what_fails: str) -> NoReturn:
    """Skip the calling test for `reason`; under CI=true fail instead, naming `what_fails`:
    CI must run every Slurm test."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {what_fails}: {reason}", pytrace=False)
    pytest.skip(reason)


def require_slurm_machine() -> None:
    """Skip the calling test when this machine cannot run Slurm; fail instead when CI=true."""
    reason = _unavailable_reason()
    if reason is not None:
        skip_or_fail_under_ci(reason, "the Slurm test cluster cannot run")


def _run_script(
    name: str, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(SCRIPTS / name)],
        check=False,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise RuntimeError(f"scripts/slurm/{name} exited {result.returncode}:\n{result.stderr}")
    return result


def _parse_exports(text: str) -> dict[str, str]:
    """`export KEY=VALUE` lines (as up.sh prints them) -> {KEY: VALUE}."""
    exports = {}
    for line in text.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, _, value = words[1].partition("=")
            exports[key] = value
    return exports


def start_cluster(directory: Path, extra_env: Mapping[str, str] | None = None) -> SlurmCluster:
    """Install when needed, run up.sh for `directory`, and describe the cluster it started."""
    env = {**cluster_environment(directory), **(extra_env or {})}
    _run_script("install.sh", env, timeout=900)
    exports = _parse_exports(_run_script("up.sh", env, timeout=180).stdout)
    cluster_env = {**os.environ, **env, **exports}
    nodes = subprocess.run(
        ["sinfo", "--noheader", "--Node", "--format=%N"],
        capture_output=True,
        text=True,
        check=True,
        env=cluster_env,
    ).stdout.split()
    return SlurmCluster(
        directory=directory,
        partition=exports["RECIPEVAL_SLURM_PARTITION"],
        gpu_type=exports["RECIPEVAL_SLURM_GPU_TYPE"],
        node=nodes[0],
        nodes=tuple(nodes),
        env=cluster_env,
    )


def stop_cluster(cluster: SlurmCluster) -> None:
    """Run down.sh; it fails when a daemon, job step or job of the cluster is left."""
    _run_script("down.sh", cluster.env, timeout=120)


@pytest.fixture(scope="session", name="slurm_cluster")
def slurm_cluster_fixture() -> Iterator[SlurmCluster]:
    """The single-node Slurm of this test session; SLURM_CONF is set while it is up."""
    require_slurm_machine()
    directory = Path(os.environ.get("RECIPEVAL_SLURM_DIR", DEFAULT_DIR))
    started_here = not cluster_is_running(directory)
    cluster = start_cluster(directory)
    saved = {key: os.environ.get(key) for key in cluster_environment(directory)}
    os.environ.update(cluster_environment(directory))
    try:
        yield cluster
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if started_here:
            stop_cluster(cluster)


TWO_NODE_DIR = Path("/tmp/recipeval-slurm-2node")


def free_port_pair() -> int:
    """A port p with p and p + 1 free (the two slurmd of a two-node cluster)."""
    import socket

    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two consecutive free ports")


def _configured_port(conf: Path, key: str) -> str | None:
    try:
        for line in conf.read_text().splitlines():
            if line.startswith(f"{key}="):
                return line.partition("=")[2]
    except OSError:
        return None
    return None


@pytest.fixture(scope="session")
def two_node_slurm_cluster() -> Iterator[SlurmCluster]:
    """A two-node Slurm (multiple-slurmd mode) beside the session's single-node one: its own
    directory, ports and default-config path, so neither sees the other. Started and stopped
    like `slurm_cluster`; one already running in its directory is used and left running."""
    require_slurm_machine()
    directory = Path(os.environ.get("RECIPEVAL_SLURM_2NODE_DIR", TWO_NODE_DIR))
    started_here = not cluster_is_running(directory)
    conf = directory / "etc" / "slurm.conf"
    ctld = (None if started_here else _configured_port(conf, "SlurmctldPort")) or str(
        free_port_pair()
    )
    slurmd = (None if started_here else _configured_port(conf, "SlurmdPort")) or str(
        free_port_pair()
    )
    extra = {
        "RECIPEVAL_SLURM_NODES": "2",
        "RECIPEVAL_SLURM_CTLD_PORT": ctld,
        "RECIPEVAL_SLURM_SLURMD_PORT": slurmd,
        "RECIPEVAL_SLURM_DEFAULT_CONF": str(directory / "default-slurm.conf"),
    }
    cluster = start_cluster(directory, extra)
    try:
        yield cluster
    finally:
        if started_here:
            stop_cluster(cluster)


# Two rules, one on CPU and one asking for a GPU the way pipeline rules do (gpu + gpu_model);
# each writes what Slurm gave it.
TWO_RULE_SNAKEFILE = """\
rule all:
    input: "gpu.txt"

rule cpu_step:
    output: "cpu.txt"
    shell: "echo job=$SLURM_JOB_ID > {output}"

rule gpu_step:
    input: "cpu.txt"
    output: "gpu.txt"
    resources: gpu=1, gpu_model="mi355x"
    shell:
        "cat {input} > {output}; "
        "echo job=$SLURM_JOB_ID step_gpus=${{SLURM_STEP_GPUS:-none}} "
        "cuda=${{CUDA_VISIBLE_DEVICES:-none}} rocr=${{ROCR_VISIBLE_DEVICES:-none}} >> {output}"
"""
SUBMITTED_LINE = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+)")


@dataclass(frozen=True)
class SnakemakeRun:
    """One `snakemake --profile profiles/ci-slurm` run: what it printed and which Slurm jobs it made."""

    returncode: int
    wall_s: float
    log: str
    slurm_job_ids: list[str]


def run_two_rule_workflow(
    cluster: SlurmCluster, workdir: Path, timeout: float = 300
) -> SnakemakeRun:
    """Run TWO_RULE_SNAKEFILE in `workdir` through the Slurm executor with the CI profile."""
    (workdir / "Snakefile").write_text(TWO_RULE_SNAKEFILE)
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--profile",
            str(CI_PROFILE),
            "--directory",
            str(workdir),
        ],
        check=False,
        cwd=workdir,
        env=dict(cluster.env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    log = result.stdout + result.stderr
    return SnakemakeRun(
        returncode=result.returncode,
        wall_s=time.monotonic() - started,
        log=log,
        slurm_job_ids=SUBMITTED_LINE.findall(log),
    )


# The fixture under its own name too, for `from slurm_cluster import slurm_cluster`.
slurm_cluster = slurm_cluster_fixture
