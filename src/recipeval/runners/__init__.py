"""Runners execute a rendered Launch: `local` (subprocess), `ray` (Ray Jobs API), `slurm`
(a Ray cluster inside a Slurm allocation)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping

from recipeval.engines.launch import Launch
from recipeval.runners.base import Runner, RunnerError, RunResult

RUNNERS = ("local", "ray", "slurm")


def default_runner_name(environ: Mapping[str, str] | None = None) -> str:
    """slurm inside an allocation, ray when RAY_ADDRESS names a cluster, else local: a laptop
    or a single node asks for no Ray (a private Ray head costs ~100 s a stage on 2 cores), and
    the profile or config (`runner:`) can still ask for it."""
    from recipeval.runners.slurm import in_allocation

    environ = os.environ if environ is None else environ
    if in_allocation(environ):
        return "slurm"
    if environ.get("RAY_ADDRESS"):
        return "ray"
    return "local"


def make_runner(name: str | None, launch: Launch) -> Runner:
    """Build the named runner (None: the default); raises RunnerError when it cannot start."""
    name = name or default_runner_name()
    if name == "local":
        from recipeval.runners.local import LocalRunner

        return LocalRunner()
    if importlib.util.find_spec("ray") is None:
        raise RunnerError(f"--runner {name} needs ray[default]; install it or use --runner local")
    if name == "ray":
        from recipeval.runners.ray import RayRunner

        return RayRunner()
    if name == "slurm":
        from recipeval.runners.slurm import SlurmRunner

        return SlurmRunner(gpus_per_node_hint=launch.resources.gpus_per_node)
    raise RunnerError(f"unknown runner {name!r}; choose one of: {', '.join(RUNNERS)}")


__all__ = ["RUNNERS", "RunResult", "Runner", "RunnerError", "default_runner_name", "make_runner"]
