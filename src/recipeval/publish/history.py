"""The run history: one JSON file per run per recipe, never rewritten, so concurrent writers
never lose a row; plus a consolidated Parquet rebuilt from those files, under a lock, for
reading; plus `acknowledged.json`, the changes someone accepted as the new normal.

A change point, once found, is reported every night until acknowledged: add an entry to
`<history>/acknowledged.json` (a list; `acknowledge` below does it) naming the recipe and the
run where the new level starts (the verdict's `change_run`), optionally one metric and a note:

    [{"recipe": "qwen3-4b-h100", "run_id": "3f2a...", "metric": null, "note": "sglang 0.5.17"}]

From that run on, the recipe's history (that metric's only, when named) starts afresh.

Names taken from result files become paths only after they are checked, and secrets reach the
files as fingerprints only."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
from pydantic import TypeAdapter, ValidationError

from recipeval.atomic import atomic_write, atomic_write_text
from recipeval.errors import say_error, unreadable_reason
from recipeval.lockfile import locked_file
from recipeval.names import UnsafeName, check_name
from recipeval.publish.compare import Acknowledgement
from recipeval.publish.records import RunRecord
from recipeval.readfile import read_regular
from recipeval.secrets import fingerprint_secrets, scrub, secret_values

PARQUET_NAME = "history.parquet"
LOCK_NAME = ".lock"
_STAMP_DROP = re.compile(r"[^0-9A-Za-z.+]")


ACK_NAME = "acknowledged.json"
_ACKS = TypeAdapter(list[Acknowledgement])


def acknowledgements(history: Path) -> list[Acknowledgement]:
    """The acknowledged changes; ValueError (naming the file and what is wrong) on a bad file."""
    path = history / ACK_NAME
    if not path.exists():
        return []
    if not path.is_file():
        raise ValueError(
            f"{path}: not a regular file; move it aside (it holds the acknowledgements)"
        )
    try:
        return _ACKS.validate_json(path.read_bytes())
    except OSError as err:
        raise ValueError(f"{path}: {unreadable_reason(err)}") from None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "top level"
        raise ValueError(
            f"{path}: {where}: {first['msg']}; expected a list of "
            '{"recipe": ..., "run_id": ..., "metric": null, "note": ""}'
        ) from None


def acknowledge(
    history: Path, recipe: str, run_id: str, metric: str | None = None, note: str = ""
) -> Path:
    """Record that the change starting at `run_id` is accepted (see the module docstring).
    ValueError (UnsafeName for a bad name) when the history has no such run of the recipe, or
    that run no such metric: an acknowledgement of a run that is not there would be ignored
    silently, and the change reported on."""
    run = _stored_run(history, recipe, run_id)
    if metric is not None and metric not in run.metrics:
        raise ValueError(
            f"run {run_id} of {recipe} in {history} has no metric {metric!r}; it has: "
            + (", ".join(sorted(run.metrics)) or "none")
        )
    with locked(history):  # read, add, write: concurrent acknowledgements keep each other's
        # Acknowledging the same change again replaces its entry (and note), not a second copy.
        acks = [
            *(
                ack
                for ack in acknowledgements(history)
                if (ack.recipe, ack.run_id, ack.metric) != (recipe, run_id, metric)
            ),
            Acknowledgement(recipe, run_id, metric, scrub(note, secret_values())),
        ]
        return atomic_write_text(
            history / ACK_NAME, _ACKS.dump_json(acks, indent=1).decode() + "\n"
        )


def _stored_run(history: Path, recipe: str, run_id: str) -> RunRecord:
    folder = history / check_name(recipe)
    found = sorted(folder.glob(f"*-{check_name(run_id, 'run id')}.json"))
    if not found:
        raise ValueError(
            f"{folder}: no run {run_id} of recipe {recipe}; acknowledge the change_run that "
            "results/regression.json names for it"
        )
    try:
        return RunRecord.model_validate_json(read_regular(found[0]))
    except OSError as err:  # a FIFO or folder by that name
        raise ValueError(f"{found[0]}: {unreadable_reason(err)}") from None
    except ValidationError as err:
        raise ValueError(f"{found[0]}: not a run record: {str(err).splitlines()[0]}") from None


def record_path(history: Path, record: RunRecord) -> Path:
    stamp = _STAMP_DROP.sub("", record.date or "undated").replace("+0000", "Z")[:40] or "undated"
    path = (
        history / check_name(record.recipe) / f"{stamp}-{check_name(record.run_id, 'run id')}.json"
    )
    if not path.resolve().is_relative_to(history.resolve()):
        raise UnsafeName(f"history file {path} would lie outside {history}")
    return path


@contextmanager
def locked(history: Path) -> Iterator[None]:
    """Hold the history folder's lock (flock: released by the kernel if we die)."""
    history.mkdir(parents=True, exist_ok=True)
    with locked_file(history / LOCK_NAME):
        yield


def _stored(record: RunRecord) -> RunRecord:
    """The record as the history keeps it: secret recipe values as fingerprints."""
    return record.model_copy(update={"recipe_values": fingerprint_secrets(record.recipe_values)})


def append(history: Path, record: RunRecord) -> bool:
    """Add a run; False when this run is already there (publishing again adds nothing).
    The file appears complete or not at all: written aside, then hard-linked into place, which
    fails instead of replacing when another writer got there first."""
    final = record_path(history, record)
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        return False
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    # Results written before their secrets were fingerprinted still hold them plain.
    secrets = secret_values(recipe=record.recipe_values)
    tmp.write_text(scrub(_stored(record).model_dump_json(indent=1), secrets) + "\n")
    try:
        os.link(tmp, final)
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
    return True


def load(history: Path, report_skips: bool = True) -> list[RunRecord]:
    """Every run in the history, oldest first; unreadable files are skipped, and reported on
    stderr unless `report_skips` is False (a second read in the same command)."""
    records = []
    for file in sorted(history.glob("*/*.json")):
        try:
            # files written before secrets were fingerprinted get the same treatment on reading
            records.append(_stored(RunRecord.model_validate_json(read_regular(file))))
        except (ValueError, OSError) as err:  # OSError: a folder or unreadable file named *.json
            if report_skips:
                say_error(f"skipping history file {file}: {unreadable_reason(err)}")
    records.sort(key=lambda r: (r.date or "", r.run_id))
    return records


def to_frame(records: list[RunRecord]) -> pd.DataFrame:
    """One row per run and metric: the long table plots and ad-hoc queries read."""
    rows = []
    for rec in records:
        base = {
            "run_id": rec.run_id,
            "recipe": rec.recipe,
            "recipe_sha256": rec.recipe_sha256,
            "date": rec.date,
            "platform": rec.platform,
            "gpu": rec.gpu,
            "failed": rec.failed,
            "packages": json.dumps(rec.packages, sort_keys=True),
        }
        for metric, value in rec.metrics.items():
            low, high = rec.intervals.get(metric, (None, None))
            stage = metric.split(".", 1)[0]
            status = rec.stages[stage].status if stage in rec.stages else None
            rows.append(
                {
                    **base,
                    "stage": stage,
                    "stage_status": status,
                    "metric": metric,
                    "value": value,
                    "low": low,
                    "high": high,
                }
            )
    columns = [
        "run_id",
        "recipe",
        "recipe_sha256",
        "date",
        "platform",
        "gpu",
        "failed",
        "packages",
        "stage",
        "stage_status",
        "metric",
        "value",
        "low",
        "high",
    ]
    frame = pd.DataFrame(rows, columns=columns)
    frame["date"] = pd.to_datetime(frame["date"], utc=True, errors="coerce", format="ISO8601")
    return frame


def rebuild_parquet(history: Path) -> Path:
    """history.parquet from every JSON file there, under the folder's lock: concurrent
    publishes each add their file first, and the last rebuild sees all of them. The caller
    has already read the folder once and reported what it skipped."""
    with locked(history):
        return write_parquet(load(history, report_skips=False), history / PARQUET_NAME)


def write_parquet(records: list[RunRecord], path: Path) -> Path:
    frame = to_frame(records)
    return atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))
