"""`recipeval env-check`: run the checks, print one verdict per recipe (and its failing checks),
write the StageResults, and return the exit code."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

from recipeval.checks.env_check import env_check, exit_status, report_lines
from recipeval.errors import UsageError, say_error, unreadable_reason
from recipeval.exit_codes import EXIT_BAD_INPUT, EXIT_OK
from recipeval.readfile import read_regular


def _read_probe(path: Path) -> dict | str:
    """A probe JSON written by `--probe-only`, or a one-line reason it cannot be used."""
    try:
        # read_regular: a FIFO or device is refused, never waited on; pydantic's parser stops
        # at a nesting depth the result file can still hold (json.loads recursed past it).
        found = from_json(read_regular(path).decode())
    except OSError as err:
        reason = err.strerror or err
        return f"--probe-from {path}: cannot read: {reason}; name the file --probe-only wrote"
    except UnicodeDecodeError as err:
        return f"--probe-from {path}: not UTF-8 text (byte {err.start}); write it with --probe-only"
    except ValueError as err:
        return f"--probe-from {path}: not JSON ({err}); write it with --probe-only"
    if not isinstance(found, dict) or "platform" not in found or "packages" not in found:
        return (
            f"--probe-from {path}: not a probe (no platform/packages); write it with --probe-only"
        )
    try:
        # strict: the checks read the file's values, not these, so "1" is no number here
        _ProbeShape.model_validate(found, strict=True)
    except ValidationError as err:
        return f"--probe-from {path}: {unreadable_reason(err)}; write it with --probe-only"
    return found


class _Device(BaseModel):
    name: str | None = None  # amdsmi may have no market name


class _Devices(BaseModel):
    devices: list[_Device] = []  # absent when the source failed (then it has an error)


class _Torch(_Devices):
    version: str | None = None
    cuda: str | None = None
    hip: str | None = None
    error: str | None = None


class _Ray(BaseModel):
    address: str | None = None
    reachable: bool | None = None
    gpus: float | None = None
    nodes: int | None = None
    ray_version: str | None = None
    note: str | None = None
    error: str | None = None


class _ProbeShape(BaseModel):
    """The parts of a `--probe-only` JSON the live checks read, typed as probe.py writes them,
    so a hand-edited or foreign file is refused here rather than failing inside a check, after
    the previous result was removed (extra keys are fine)."""

    platform: str
    packages: dict[str, str | None]
    torch: _Torch | None = None
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
