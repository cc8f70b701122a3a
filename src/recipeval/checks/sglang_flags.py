"""`--sglang-*` flags judged by SGLang's own argument parser (`ServerArgs.add_cli_args`).

miles re-exports SGLang's server flags with the prefix `--sglang-`; each one is mapped back
to SGLang's `--X` and parsed alone (so a failure names its recipe key) the way miles parses
them: argparse with abbreviations off, as Megatron's parser that miles extends. Importing
SGLang takes seconds, so it runs in a worker process (`python -m recipeval.checks.sglang_flags`)
started early and overlapping megatron-core's import in the main process. Protocol: the worker
imports SGLang, then reads one JSON object {"flags": {id: [words]}} from stdin and writes
{"version": ..., "results": {id: {"error": str | null, "notes": str}}} (or {"import_error": ...}).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recipeval.checks.subject import Subject
    from recipeval.result import Check

# miles' own `--sglang-*` flags (router, concurrency, deployment config): not SGLang's.
MILES_OWN_FLAGS = frozenset(
    {
        "sglang-router-ip",
        "sglang-router-port",
        "sglang-router-policy",
        "sglang-router-request-timeout-secs",
        "sglang-server-concurrency",
        "sglang-config",
    }
)
# SGLang server flags miles does not re-export (it sets them itself: model path from
# --hf-checkpoint, ports, node ranks, ...); its parser rejects `--sglang-<these>`. From
# miles backends/sglang_utils/arguments.py (_SKIPPED_SERVER_ARGS, snapshot 2026-08-21).
MILES_MANAGED_FLAGS = (
    frozenset(
        {
            "sglang-model-path",
            "sglang-config",
            "sglang-trust-remote-code",
            "sglang-random-seed",
            "sglang-enable-memory-saver",
            "sglang-port",
            "sglang-nnodes",
            "sglang-node-rank",
            "sglang-dist-init-addr",
            "sglang-gpu-id-step",
            "sglang-base-gpu-id",
            "sglang-nccl-port",
            "sglang-skip-server-warmup",
            "sglang-enable-return-routed-experts",
            "sglang-enable-return-indexer-topk",
        }
    )
    - MILES_OWN_FLAGS
)
# SGLang requires a model; miles passes its checkpoint itself, so any path stands in for it.
MODEL_PLACEHOLDER = ["--model-path", "recipe-model"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class FlagVerdict:
    error: str | None
    notes: str


@dataclass(frozen=True)
class FlagReport:
    """The worker's answer: SGLang's version and one verdict per request id, or why it could
    not judge."""

    version: str | None
    verdicts: dict[str, FlagVerdict]
    failure: str | None = None
    cpu_s: float | None = None  # the worker's own CPU time (import + parsing)


def sglang_words(args: dict[str, Any]) -> dict[str, list[str]]:
    """flag -> the words SGLang sees (`--sglang-X v` -> `--X v`), for SGLang's own flags."""
    from recipeval.engines.launch import flag_words

    out = {}
    for flag, value in args.items():
        if flag.startswith("sglang-") and flag not in MILES_OWN_FLAGS:
            words = flag_words({flag.removeprefix("sglang-"): value})
            if words:
                out[flag] = words
    return out


class FlagChecker:
    """A running worker: start it early, send all flags once, read the verdicts."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "recipeval.checks.sglang_flags"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def judge(self, flags: dict[str, list[str]], timeout: float = 120) -> FlagReport:
        try:
            out, err = self._proc.communicate(json.dumps({"flags": flags}), timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.communicate()
            return FlagReport(None, {}, f"SGLang flag worker gave no answer within {timeout:.0f} s")
        try:
            answer = json.loads(out.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            tail = " ".join((err or out).strip().splitlines()[-1:])[:300]
            return FlagReport(
                None, {}, f"SGLang flag worker failed (exit {self._proc.returncode}): {tail}"
            )
        if "import_error" in answer:
            return FlagReport(None, {}, answer["import_error"])
        verdicts = {k: FlagVerdict(v["error"], v["notes"]) for k, v in answer["results"].items()}
        return FlagReport(answer["version"], verdicts, cpu_s=answer.get("cpu_s"))

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.communicate()


def flag_checks(
    subject: Subject, flags: dict[str, list[str]], report: FlagReport, prefix: str
) -> list[Check]:
    """One check per flag SGLang rejects (unknown flag, wrong type, value not among its
    choices), a warning per flag it calls deprecated, and one passing summary."""
    if report.failure:
        return [
            subject.check(
                "sglang.flags",
                False,
                f"could not judge --sglang-* flags: {report.failure} (install SGLang's parser: pip install --no-deps -r envs/sglang-cpu.txt)",
            )
        ]
    checks = []
    label = f"SGLang {report.version} ServerArgs"
    for flag in flags:
        if flag in MILES_MANAGED_FLAGS:
            checks.append(
                subject.check(
                    "sglang.miles-managed-flag",
                    False,
                    f"--{flag}: miles sets this SGLang option itself and does not accept the flag",
                    key=subject.arg_key(flag),
                    value=flags[flag][1:] or True,
                )
            )
    for flag, words in flags.items():
        verdict = report.verdicts[f"{prefix}{flag}"]
        key = subject.arg_key(flag)
        shown = " ".join(words)
        if verdict.error:
            unknown = verdict.error.startswith("unrecognized arguments")
            checks.append(
                subject.check(
                    "sglang.unknown-flag" if unknown else "sglang.bad-value",
                    False,
                    f"--{flag} (SGLang `{shown}`): {label} rejects it: {verdict.error[:300]}",
                    key=key,
                    value=words[1:] or True,
                )
            )
        elif "deprecated" in verdict.notes.lower():
            checks.append(
                subject.check(
                    "sglang.deprecated-flag",
                    False,
                    f"--{flag}: {verdict.notes[:300]}",
                    key=key,
                    severity="warning",
                    value=words[1:] or True,
                )
            )
    if not any(c.severity == "error" for c in checks):
        checks.append(
            subject.check(
                "sglang.flags",
                True,
                f"{len(flags)} --sglang-* flags accepted by {label}: " + ", ".join(flags)
                if flags
                else "no --sglang-* flags to check",
                value=len(flags),
            )
        )
    return checks


def _parser():  # -> argparse.ArgumentParser
    import argparse

    from recipeval.checks.fastimport import import_leaf

    server_args = import_leaf("sglang.srt.server_args", ("sglang",))

    class RaisingParser(argparse.ArgumentParser):
        def error(self, message: str):  # argparse would print usage and exit
            raise ValueError(message)

    parser = RaisingParser(prog="sglang", allow_abbrev=False)
    server_args.ServerArgs.add_cli_args(parser)
    return parser


def _judge(parser, words: list[str]) -> FlagVerdict:
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            parser.parse_args(MODEL_PLACEHOLDER + words)
        error = None
    except ValueError as err:
        error = str(err)
    notes = " ".join(ANSI.sub("", said.getvalue()).split())
    return FlagVerdict(error, notes)


def serve() -> int:
    import warnings
    from importlib.metadata import version

    warnings.simplefilter("ignore")
    try:
        with contextlib.redirect_stdout(sys.stderr):
            parser = _parser()
        sglang_version = version("sglang")
    except Exception as err:  # noqa: BLE001 - reported to the parent as "could not judge"
        print(
            json.dumps(
                {"import_error": f"cannot import SGLang's ServerArgs: {type(err).__name__}: {err}"}
            )
        )
        return 0
    request = json.loads(sys.stdin.read() or "{}")
    results = {}
    for key, words in request.get("flags", {}).items():
        verdict = _judge(parser, words)
        results[key] = {"error": verdict.error, "notes": verdict.notes}
    print(
        json.dumps(
            {"version": sglang_version, "results": results, "cpu_s": round(time.process_time(), 2)}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(serve())
