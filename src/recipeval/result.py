"""StageResult: what every stage writes to results/<recipe>/<stage>.json."""

from __future__ import annotations

import getpass
import platform
import socket
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict  # pydantic needs this one below Python 3.12

from recipeval.atomic import atomic_write_text
from recipeval.readfile import read_regular
from recipeval.secrets import fingerprint_secrets, scrub, secret_values

Status = Literal["pass", "fail", "error", "skipped"]
Severity = Literal["error", "warning", "info"]

TRACKED_PACKAGES = (
    "recipeval",
    "torch",
    "transformers",
    "megatron-core",
    "sglang",
    "ray",
    "snakemake",
)


class Check(BaseModel):
    id: str
    ok: bool
    severity: Severity = "error"
    message: str = ""
    key: str | None = Field(None, description="dotted recipe key the check is about")
    value: Any = None
    threshold: Any = None


def _aware_time(value: str | None) -> str | None:
    """An ISO 8601 time with its UTC offset, as stages write them (now_iso). A time without one
    is refused rather than read as UTC: publish compares the stages' times (stale_results), and
    a guessed zone hours off would silently leave a result out as stale."""
    if value is None:
        return None
    try:
        offset = datetime.fromisoformat(value).utcoffset()
    except ValueError:
        offset = None
    if offset is None:
        raise PydanticCustomError(
            "aware_time",
            "{value} is not an ISO 8601 time with a UTC offset (stages write e.g. "
            "2026-12-07T02:38:27+00:00)",
            {"value": repr(value)},
        )
    return value


Timestamp = Annotated[str | None, AfterValidator(_aware_time)]


class RecipeFacts(TypedDict, total=False):
    """recipe_facts as recipe.facts writes them, typed so a hand-edited result is refused when
    read, naming the field, not deep inside publish."""

    __pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[misc]
    platform: str | None
    gpu: str | None
    nodes: int | None
    gpus_per_node: int | None
    layout: str | None
    max_response_len: int | None
    recipe_values: dict[str, Any]


class Provenance(BaseModel):
    recipe: str
    recipe_path: str | None = None
    recipe_sha256: str
    stage: str
    host: str = Field(default_factory=socket.gethostname)
    user: str | None = None
    started: Timestamp = None
    finished: Timestamp = None
    packages: dict[str, str] = Field(default_factory=dict)
    gpu: str | None = None
    launcher_revision: str | None = None
    python: str = Field(default_factory=platform.python_version)


class StageResult(BaseModel):
    stage: str
    recipe: str
    status: Status
    checks: list[Check] = Field(default_factory=list)
    summary: dict[str, Any] = Field(default_factory=dict)
    provenance: Provenance
    artifacts: dict[str, str] = Field(default_factory=dict, description="name -> path")
    message: str = ""
    recipe_facts: RecipeFacts = Field(
        default_factory=dict,
        description="the recipe as the stage ran it (platform, GPUs, layout, values): what "
        "publish shows, so it never reads recipe files again",
    )

    def failed_checks(self, severity: Severity = "error") -> list[Check]:
        return [c for c in self.checks if not c.ok and c.severity == severity]


def status_from_checks(checks: list[Check]) -> Status:
    return "fail" if any(not c.ok and c.severity == "error" for c in checks) else "pass"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def git_revision(path: Path) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def provenance(
    recipe_name: str,
    recipe_sha256: str,
    stage: str,
    recipe_path: Path | None = None,
    started: str | None = None,
) -> Provenance:
    return Provenance(
        recipe=recipe_name,
        recipe_path=str(recipe_path) if recipe_path else None,
        recipe_sha256=recipe_sha256,
        stage=stage,
        user=_user(),
        started=started or now_iso(),
        packages=package_versions(),
        launcher_revision=git_revision(Path(__file__).resolve().parent),
    )


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def write_result(result: StageResult, path: Path) -> Path:
    """Write atomically (temp file + rename) so a crash never leaves half a JSON behind. The
    recipe's secrets leave only as fingerprints in its values, and as *** wherever else they
    show (a check's message or value, the summary), as do the environment's."""
    facts = dict(result.recipe_facts)
    values = facts.get("recipe_values", {})
    if values:
        facts["recipe_values"] = fingerprint_secrets(values)
    stored = result.model_copy(update={"recipe_facts": facts})
    text = scrub(stored.model_dump_json(indent=2), secret_values(recipe=values))
    return atomic_write_text(path, text + "\n")


def read_result(path: Path) -> StageResult:
    """A stage result file; OSError for one that cannot be read (a FIFO is refused, never
    waited on), ValueError for one that is not a stage result."""
    return StageResult.model_validate_json(read_regular(path))
