"""The live probe compared with a recipe: platform, GPU count per node, GPU model, the
trainer's packages, and the Ray cluster's size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from recipeval.checks.subject import Subject
from recipeval.recipe.facts import gpu_model_matches
from recipeval.result import Check

# What each engine imports on the machine that runs it.
# envs/trainer-<platform>.yaml: the trainer environment a GPU recipe expects on its nodes.
TRAINER_ENVS = Path(__file__).resolve().parents[3] / "envs"


def _devices(found: dict[str, Any]) -> list[dict[str, Any]]:
    for source in ("torch", "nvml", "amdsmi"):
        info = found.get(source) or {}
        if info.get("devices"):
            return info["devices"]
    return []


def live_checks(subject: Subject, found: dict[str, Any]) -> list[Check]:
    r = subject.recipe
    checks: list[Check] = []
    devices = _devices(found)
    torch_info = found.get("torch") or {}
    build = (
        f"torch {torch_info.get('version')}"
        if torch_info.get("version")
        else torch_info.get("error", "torch missing")
    )
    here = found.get("platform", "cpu")
    if r.platform == "cpu":
        checks.append(
            subject.check(
                "probe.platform",
                True,
                f"cpu recipe: runs on any machine (this one: {here}, {build})",
                key="platform",
                value=here,
            )
        )
    else:
        needs = f"{r.cluster.gpus_per_node} x {r.cluster.gpu or 'GPU'} per node ({r.platform})"
        if not devices:
            why = (
                "no CUDA/ROCm build"
                if not (torch_info.get("cuda") or torch_info.get("hip"))
                else "no device visible"
            )
            checks.append(
                subject.check(
                    "probe.platform",
                    False,
                    f"recipe needs {needs}; this machine has no GPU ({build}: {why}). Run the live "
                    "probe on a node of the target cluster, or use --static here",
                    key="platform",
                    value=here,
                    threshold=r.platform,
                )
            )
        else:
            checks.append(
                subject.check(
                    "probe.platform",
                    here == r.platform,
                    f"recipe platform {r.platform}; this machine: {here} ({build})",
                    key="platform",
                    value=here,
                    threshold=r.platform,
                )
            )
            checks.append(
                subject.check(
                    "probe.gpu-count",
                    len(devices) >= r.cluster.gpus_per_node,
                    f"recipe needs {r.cluster.gpus_per_node} GPUs per node; this machine has {len(devices)}",
                    key="cluster.gpus_per_node",
                    value=len(devices),
                    threshold=r.cluster.gpus_per_node,
                )
            )
            checks.extend(_trainer_env_checks(subject, found))
            names = sorted({d.get("name") or "?" for d in devices})
            if r.cluster.gpu:
                ok = gpu_model_matches(r.cluster.gpu, names)
                checks.append(
                    subject.check(
                        "probe.gpu-model",
                        ok,
                        f"recipe GPU {r.cluster.gpu}; this machine: {', '.join(names)}",
                        key="cluster.gpu",
                        value=names,
                        threshold=r.cluster.gpu,
                    )
                )
    checks.append(_package_check(subject, found))
    checks.append(_ray_check(subject, found.get("ray")))
    return checks


def _package_check(subject: Subject, found: dict[str, Any]) -> Check:
    versions = found.get("packages") or {}
    needed = subject.engine.packages
    missing = [p for p in needed if not versions.get(p)]
    listed = ", ".join(
        f"{p} {versions.get(p) or 'missing'}" for p in (*needed, "miles") if p in versions
    )
    return subject.check(
        "probe.packages",
        not missing,
        f"engine {subject.recipe.engine} needs {', '.join(needed)}"
        + (f"; missing here: {', '.join(missing)}" if missing else "")
        + f" ({listed})",
        key="engine",
        value={p: versions.get(p) for p in needed},
    )


def _ray_check(subject: Subject, ray: dict[str, Any] | None) -> Check:
    if ray is None:
        return subject.check(
            "probe.ray", True, "RAY_ADDRESS not set: no Ray cluster to probe", severity="info"
        )
    address = ray.get("address")
    if not ray.get("reachable"):
        return subject.check(
            "probe.ray",
            False,
            f"Ray cluster at RAY_ADDRESS={address} unreachable: {ray.get('error')}",
            value=address,
        )
    gpus = ray.get("gpus")
    world = subject.recipe.cluster.nodes * subject.recipe.cluster.gpus_per_node
    if gpus is None:
        return subject.check(
            "probe.ray",
            True,
            f"Ray at {address} answers (Ray {ray.get('ray_version')}); {ray.get('note')}",
            severity="info",
            value=address,
        )
    return subject.check(
        "probe.ray",
        gpus >= world,
        f"Ray at {address} (Ray {ray.get('ray_version')}, {ray.get('nodes')} nodes) has {gpus:g} GPUs; "
        f"the recipe needs {world}",
        key="cluster.nodes",
        value=gpus,
        threshold=world,
    )


def _trainer_env_checks(subject: Subject, found: dict[str, Any]) -> list[Check]:
    """Versions found vs envs/trainer-<platform>.yaml (a null version is reported, not compared).
    Warnings: a different stack still runs, but its numbers are not the recipe's."""
    path = TRAINER_ENVS / f"trainer-{subject.recipe.platform}.yaml"
    if not path.is_file():
        return []
    expected = yaml.safe_load(path.read_text()) or {}
    versions = found.get("packages") or {}
    torch_info = found.get("torch") or {}
    differ = []
    for name, spec in (expected.get("packages") or {}).items():
        if spec is None:
            continue
        have = versions.get(name)
        try:
            fits = have is not None and SpecifierSet(str(spec)).contains(
                have.split("+")[0], prereleases=True
            )
        except InvalidSpecifier:
            continue
        if not fits:
            differ.append(f"{name} {have or 'missing'} (expected {spec})")
    runtime = {"rocm": torch_info.get("hip"), "cuda": torch_info.get("cuda")}.get(
        subject.recipe.platform
    )
    want = expected.get(subject.recipe.platform)
    if want and not (runtime or "").startswith(str(want)):
        differ.append(f"{subject.recipe.platform} {runtime or 'unknown'} (expected {want})")
    return [
        subject.check(
            "probe.trainer-env",
            not differ,
            f"versions vs {path.name}: " + ("; ".join(differ) if differ else "as expected"),
            key="platform",
            severity="warning",
            value=differ or None,
        )
    ]
