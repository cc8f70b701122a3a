"""Flags whose values the launcher's argparse reads with int(): a value it cannot read stops
the launch at argument parsing, so a check must report it instead of quietly reading the
flag's default (which is what the layout and batch arithmetic fall back to)."""

from __future__ import annotations

from typing import Any

from recipeval.checks.subject import Subject
from recipeval.result import Check

# The flags the checks read as counts; `type=int` in miles' (and Megatron's, for the batch
# sizes) argparse, and in the reference engine's.
INTEGER_FLAGS = (
    "global-batch-size",
    "micro-batch-size",
    "max-tokens-per-gpu",
    "n-samples-per-prompt",
    "num-rollout",
    "num-steps-per-rollout",
    "rollout-batch-size",
    "rollout-max-context-len",
    "rollout-max-prompt-len",
    "rollout-max-response-len",
    "rollout-num-gpus",
    "rollout-num-gpus-per-engine",
    "sglang-context-length",
)


def reads_as_int(value: Any) -> bool:
    """Whether argparse's int() accepts the word render writes for `value`: 8 and '8' do;
    8.0 (written '8.0'), true (a bare flag, no value) and 'abc' do not."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, str):
        try:
            int(value)
        except ValueError:
            return False
        return True
    return False


def integer_flag_checks(subject: Subject) -> list[Check]:
    """One failing check per count flag int() cannot read, or one passing check."""
    bad = [f for f in INTEGER_FLAGS if f in subject.args and not reads_as_int(subject.args[f])]
    if not bad:
        given = sum(f in subject.args for f in INTEGER_FLAGS)
        return [subject.check("args.integers", True, f"{given} count flag(s) are whole numbers")]
    return [
        subject.check(
            "args.integers",
            False,
            f"--{flag} {subject.args[flag]!r} is not a whole number; the launcher reads it "
            "with int() and stops at argument parsing",
            key=subject.arg_key(flag),
            value=subject.args[flag],
        )
        for flag in bad
    ]
