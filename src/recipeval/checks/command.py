"""`recipeval env-check`: run the checks, print one verdict per recipe (and its failing checks),
write the StageResults, and return the exit code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from recipeval.checks.env_check import env_check, exit_status, report_lines
from recipeval.errors import UsageError, say_error, unreadable_reason
from recipeval.exit_codes import EXIT_BAD_INPUT, EXIT_OK


def _read_probe(path: Path) -> dict | str:
    """A probe JSON written by `--probe-only`, or a one-line reason it cannot be used."""
    try:
        found = json.loads(path.read_text())
    except OSError as err:
        return f"--probe-from {path}: cannot read: {err.strerror or err}"
    except json.JSONDecodeError as err:
        return f"--probe-from {path}:{err.lineno}: not JSON ({err.msg}); write it with --probe-only"
    except UnicodeDecodeError as err:
        return f"--probe-from {path}: not UTF-8 text (byte {err.start}); write it with --probe-only"
    if not isinstance(found, dict) or "platform" not in found or "packages" not in found:
        return (
            f"--probe-from {path}: not a probe (no platform/packages); write it with --probe-only"
        )
    try:
        _ProbeShape.model_validate(found)
    except ValidationError as err:
        return f"--probe-from {path}: {unreadable_reason(err)}; write it with --probe-only"
    return found


class _Devices(BaseModel):
    devices: list[dict[str, Any]] | None = None


class _Ray(BaseModel):
    address: str | None = None
    reachable: bool | None = None
    gpus: float | None = None


class _ProbeShape(BaseModel):
    """The parts of a `--probe-only` JSON the live checks read, typed, so a hand-edited or
    foreign file is refused here rather than failing inside a check (extra keys are fine)."""

    platform: str
    packages: dict[str, str | None]
    torch: _Devices | None = None
    nvml: _Devices | None = None
    amdsmi: _Devices | None = None
    ray: _Ray | None = None


def env_check_command(
    recipes: list[Path],
    static: bool,
    stage: str | None,
    out: Path | None,
    exit_zero: bool,
    probe_only: bool,
    probe_from: Path | None = None,
) -> int:
    if probe_only:
        if recipes:
            say_error("--probe-only takes no recipe (it prints this machine's probe)")
            return EXIT_BAD_INPUT
        from recipeval.checks.probe import probe

        print(json.dumps(probe(), indent=2))
        return EXIT_OK
    if not recipes:
        say_error("name at least one recipe (argument or --recipe)")
        return EXIT_BAD_INPUT
    found = None
    if probe_from is not None:
        if static:
            say_error("--probe-from compares a probe with the recipe; drop --static")
            return EXIT_BAD_INPUT
        found = _read_probe(probe_from)
        if isinstance(found, str):
            say_error(found)
            return EXIT_BAD_INPUT
    try:
        report = env_check(recipes, static=static, stage=stage, found=found, out=out)
    except UsageError as err:  # --out cannot hold these results
        say_error(err)
        return EXIT_BAD_INPUT
    except OSError as err:  # the folder vanished, a read-only or pseudo file system, a full disk
        target = err.filename or out
        say_error(f"cannot write {target}: {err.strerror or err}; choose another --out")
        return EXIT_BAD_INPUT
    for line in report.bad_input:
        say_error(line)
    for result in report.results:
        print("\n".join(report_lines(result.status, result.recipe, result.message, result.checks)))
    for path in report.written:
        print(f"wrote {path}")
    return exit_status(report, exit_zero and out is not None)
