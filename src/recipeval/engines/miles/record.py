"""Record the launch a miles launch script builds, without starting anything.

The script's own typer app runs in a subprocess (record_driver.py) with miles' process-starting
helpers replaced by a recorder. The recorded `ray job submit` command is shell text; it is
turned into words by bash itself, restricted (no redirection, no `exec`, no `/` in a command
name), where `ray` is a function that prints its arguments and PATH names an empty directory,
so no program can start and no file be written, whatever the script's arguments put into it.

Where the checkout lives is not part of a launch: its path is written as MILES_PLACEHOLDER.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from recipeval.engines.miles.record_driver import UNRECORDABLE_EXIT
from recipeval.errors import unreadable_reason
from recipeval.readfile import read_regular

MILES_PLACEHOLDER = "{miles}"
DEFAULT_REPO = "radixark/miles"
DRIVER = Path(__file__).with_name("record_driver.py")
# Two answers to every node probe: what differs between the two launches comes from a probe.
PROBE_ANSWERS = ("0", "1")
RECORD_TIMEOUT_S = 120
# Shell state bash exports by itself; not part of the recorded command.
_SHELL_OWN = {"PATH", "PWD", "OLDPWD", "SHLVL", "_"}
# Limits of the bash that reads a recorded command (it only expands words).
_SHELL_TIMEOUT_S = 30
_SHELL_MEMORY_KB = 1 << 20


class RecordError(Exception):
    """The launch could not be recorded (bad checkout, script failure, no ray job submit)."""


@dataclass
class Recording:
    """One recorded miles launch. `argv` is the `ray job submit` command as words; `client_env`
    what the command exports for the submitting client; `runtime_env` the job's env_vars;
    `probed` maps an env var or flag to the node probe its value comes from."""

    repo: str
    commit: str
    script: str
    args: list[str]
    argv: list[str]
    client_env: dict[str, str]
    runtime_env: dict[str, str]
    probed: dict[str, str] = field(default_factory=dict)
    megatron_model_type: str | None = None
    train_words: int | None = None
    commands: list[str] = field(default_factory=list)
    stand_ins: list[str] = field(default_factory=list)

    @property
    def entrypoint(self) -> list[str]:
        return self.argv[self.argv.index("--") + 1 :]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def load(cls, path: Path) -> Recording:
        """A recording file, its fields type-checked; RecordError naming the file and the first
        field that is wrong (a hand-edited file must not reach compare as the wrong type)."""
        from pydantic import TypeAdapter, ValidationError

        try:
            recording = TypeAdapter(cls).validate_json(read_regular(path))
        except (ValidationError, OSError) as err:
            raise RecordError(f"recorded launch {path}: {unreadable_reason(err)}") from None
        if "--" not in recording.argv:
            raise RecordError(
                f"recorded launch {path}: argv has no '--'; a recorded `ray job submit` "
                "command ends its options with '--' before the training command"
            )
        return recording


def git_commit(checkout: Path) -> str:
    return _git(checkout, "rev-parse", "HEAD")


def git_repo(checkout: Path) -> str:
    """owner/name from the checkout's origin, else miles' public repository."""
    try:
        url = _git(checkout, "config", "--get", "remote.origin.url")
    except RecordError:
        return DEFAULT_REPO
    match = re.search(r"github\.com[:/]([^/]+/[^/]+?)(?:\.git)?/?$", url)
    return match.group(1) if match else url


def _git(checkout: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(checkout), *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RecordError(f"{checkout}: git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def is_checkout(path: Path) -> bool:
    return (path / "miles" / "utils" / "external_utils").is_dir()


def find_checkout(start: Path) -> Path | None:
    """The miles checkout a path lies in."""
    return next((d for d in (start, *start.parents) if is_checkout(d)), None)


def record_launch(
    checkout: Path,
    script: str,
    args: list[str],
    python: str | None = None,
    commit: str | None = None,
) -> Recording:
    """Run `script args` from `checkout` with the recorder and return its launch. `commit`:
    the commit an exported tree (no .git) was taken from."""
    checkout = checkout.resolve()
    if not is_checkout(checkout):
        raise RecordError(f"{checkout} is not a miles checkout (no miles/utils/external_utils)")
    if not (checkout / script).is_file():
        raise RecordError(f"{checkout / script}: no such launch script in the checkout")
    result = _run_driver(checkout, script, args, python or sys.executable)
    runs = result["runs"]
    launches = [_launch(run, checkout) for run in runs]
    argv, client_env, runtime_env = launches[0]
    probe_text = "; ".join(dict.fromkeys(p for run in runs for p in run["probes"]))
    probed = {k: probe_text for k in _differing_env(launches)}
    probed |= {f: probe_text for f in _differing_words(launches)}
    calls = runs[0]["train_calls"]
    train_words = len(shlex.split(calls[-1]["train_args"])) if calls else None
    return Recording(
        repo=DEFAULT_REPO if commit else git_repo(checkout),
        commit=commit or git_commit(checkout),
        script=script,
        args=list(args),
        argv=argv,
        client_env=client_env,
        runtime_env=runtime_env,
        probed=probed,
        megatron_model_type=calls[-1]["megatron_model_type"] if calls else None,
        train_words=train_words,
        commands=[
            _placeholder(str(c["cmd"]), checkout)
            for c in runs[0]["commands"]
            if "ray job submit" not in str(c["cmd"])
        ],
        stand_ins=result["stand_ins"],
    )


def record_at_commit(
    checkout: Path, commit: str, script: str, args: list[str], repo: str | None = None
) -> Recording:
    """Record from `commit` of the git checkout: the checkout itself when it is there, else that
    commit's tree exported to a temporary folder (`git archive`; the checkout is not touched)."""
    full = _git(checkout, "rev-parse", "--verify", f"{commit}^{{commit}}")
    if full == git_commit(checkout):
        rec = record_launch(checkout, script, args)
        rec.repo = repo or rec.repo
        return rec
    archive = subprocess.run(
        ["git", "-C", str(checkout), "archive", "--format=tar", full],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise RecordError(
            f"{checkout}: git archive {full} failed: {archive.stderr.decode().strip()}"
        )
    with tempfile.TemporaryDirectory(prefix="recipeval-miles-") as tree:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tree, filter="data")
        rec = record_launch(Path(tree), script, args, commit=full)
    rec.repo = repo or git_repo(checkout)
    return rec


def _run_driver(checkout: Path, script: str, args: list[str], python: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="recipeval-record-") as tmp:
        request = Path(tmp) / "request.json"
        out = Path(tmp) / "recorded.json"
        request.write_text(
            json.dumps(
                {
                    "miles_dir": str(checkout),
                    "script": script,
                    "args": args,
                    "probe_answers": list(PROBE_ANSWERS),
                    "out": str(out),
                }
            )
        )
        # A bare environment: nothing of this shell (MASTER_ADDR, NCCL_*, a W&B key, miles'
        # MILES_SCRIPT_* options) may change or leak into the recorded launch.
        env = {"PATH": os.defpath, "HOME": tmp, "LANG": "C.UTF-8"}
        try:
            # -B: no __pycache__ written into the checkout
            proc = subprocess.run(
                [python, "-I", "-B", str(DRIVER), str(request)],
                env=env,
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=RECORD_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as err:
            raise RecordError(f"{script} did not finish within {RECORD_TIMEOUT_S} s") from err
        if proc.returncode == UNRECORDABLE_EXIT:
            reason = (proc.stderr.strip().splitlines() or ["no reason given"])[-1]
            raise RecordError(f"{script}: {reason}")
        if proc.returncode != 0 or not out.is_file():
            raise RecordError(
                f"{script} {shlex.join(args)} failed while building its launch: "
                + script_error(proc.stderr or proc.stdout)
            )
        return json.loads(out.read_text())


def script_error(output: str) -> str:
    """A failed script's error in one line: the exception its traceback ends with (Python's
    own, or the box rich draws for typer), lines rich wrapped joined again."""
    lines = output.strip().splitlines()
    tail: list[str] = []
    for line in reversed(lines):  # frames are indented or boxed; the exception is not
        if not line.strip() or line[0].isspace() or line[0] in "│╭╰":
            break
        tail.insert(0, line.strip())
    return " ".join(tail or lines[-1:]) or "no reason given"


def _launch(
    run: dict[str, Any], checkout: Path
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    submits = [c["cmd"] for c in run["commands"] if "ray job submit" in c["cmd"]]
    if len(submits) != 1:
        raise RecordError(f"expected one `ray job submit` from the script, recorded {len(submits)}")
    words, exported = _shell_words(submits[0])
    words = [_placeholder(w, checkout) for w in words]
    env_json = next(
        (w.split("=", 1)[1] for w in words if w.startswith("--runtime-env-json=")), None
    )
    if env_json is None:
        raise RecordError("the recorded `ray job submit` has no --runtime-env-json")
    try:
        runtime_env = _RuntimeEnv.model_validate_json(env_json).env_vars
    except ValidationError as err:
        raise RecordError(
            f"the recorded `ray job submit` has a --runtime-env-json ray cannot use "
            f"({unreadable_reason(err)}); the launch script must pass a JSON object whose "
            "env_vars maps names to strings"
        ) from None
    return ["ray", *words], {k: _placeholder(v, checkout) for k, v in exported.items()}, runtime_env


class _RuntimeEnv(BaseModel):
    """What the recording keeps of a job's runtime env: env_vars, strings as ray requires (a
    number is not turned into one); other keys are ignored."""

    env_vars: dict[str, str] = {}


def _shell_words(command: str) -> tuple[list[str], dict[str, str]]:
    """The words bash passes to `ray` for `command`, and the variables it exported.

    The command is miles' shell text, built from the recipe's `source.args`: bash reads it in
    restricted mode (no output redirection, no `exec`, no command name with a `/`), PATH an empty
    directory and memory and CPU limited, so text that slipped into it can start no program and
    write no file. `ray` prints its words to stdout between random markers."""
    bash = shutil.which("bash")
    if bash is None:
        raise RecordError("bash is needed to read the recorded launch command; none on PATH")
    marker = os.urandom(16).hex()
    # Restricted bash refuses `source` of a path; older miles commands source the model's
    # script from the checkout, so `source` and `.` read the file and evaluate it, still
    # restricted.
    prelude = (
        f"ulimit -v {_SHELL_MEMORY_KB} -t {_SHELL_TIMEOUT_S}\n"
        'source() { local __sourced=$1; shift; eval "$(< "$__sourced")"; }; .() { source "$@"; }\n'
        f'ray() {{ printf "%s\\0" {marker} "$@" {marker}; '
        'for n in $(compgen -e); do printf "%s=%s\\0" "$n" "${!n}"; done; '
        f'printf "%s\\0" {marker}; }}\n'
    )
    with tempfile.TemporaryDirectory(prefix="recipeval-sh-") as tmp:
        empty = Path(tmp, "bin")
        empty.mkdir()
        proc = subprocess.Popen(
            [bash, "--noprofile", "--norc", "-r", "-c", prelude + command],
            env={"PATH": str(empty)},
            cwd=tmp,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=_SHELL_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            # The whole group: a subshell left running would hold the pipes open.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RecordError(
                f"bash did not finish reading the launch command within {_SHELL_TIMEOUT_S} s"
            ) from exc
    fields = out.split("\0")
    if fields.count(marker) < 3:
        raise RecordError(f"bash did not reach `ray job submit`: {err.strip()}")
    first = fields.index(marker)
    middle = fields.index(marker, first + 1)
    last = fields.index(marker, middle + 1)
    exported = dict(e.split("=", 1) for e in fields[middle + 1 : last])
    return fields[first + 1 : middle], {k: v for k, v in exported.items() if k not in _SHELL_OWN}


def _placeholder(text: str, checkout: Path) -> str:
    for path in {str(checkout), os.path.realpath(checkout)}:
        text = text.replace(path, MILES_PLACEHOLDER)
    return text


def _differing_env(launches: list[tuple[list[str], dict[str, str], dict[str, str]]]) -> list[str]:
    envs = [launch[2] for launch in launches]
    keys = dict.fromkeys(k for env in envs for k in env)
    return [k for k in keys if len({env.get(k) for env in envs}) > 1]


def _differing_words(launches: list[tuple[list[str], dict[str, str], dict[str, str]]]) -> list[str]:
    from recipeval.engines.miles.flags import parse_flags

    parsed = [parse_flags(launch[0][launch[0].index("--") + 1 :]) for launch in launches]
    keys = dict.fromkeys(k for p in parsed for k in p)
    return [f"--{k}" for k in keys if len({json.dumps(p.get(k)) for p in parsed}) > 1]
