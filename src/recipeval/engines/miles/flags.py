"""Launch words as flags, the way miles' argparse reads them, and flag-by-flag comparison."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from recipeval.secrets import fingerprint_secret, secret_word_positions

FlagValue = bool | str | list[str]


def parse_flags(words: list[str]) -> dict[str, FlagValue]:
    """`['python3', 'train.py', '--lr', '1e-6', '--colocate', '--x', 'a', 'b']` ->
    `{'lr': '1e-6', 'colocate': True, 'x': ['a', 'b']}`. Words before the first flag (the
    program) are skipped; a flag given twice keeps its last value, as argparse does. The word
    after a secret flag is its value whatever it starts with, as redaction reads it."""
    flags: dict[str, FlagValue] = {}
    secret_words = secret_word_positions(words)
    current: str | None = None
    values: list[str] = []

    def close() -> None:
        if current is not None:
            flags.pop(current, None)
            flags[current] = True if not values else values[0] if len(values) == 1 else values

    for i, word in enumerate(words):
        if word.startswith("--") and len(word) > 2 and i not in secret_words:
            close()
            current, values = word[2:], []
        elif current is not None:
            values.append(word)
    close()
    return flags


def same_value(a: FlagValue | None, b: FlagValue | None) -> bool:
    """Equal as miles reads them: words, or numbers written differently (0.00 and 0.0)."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, str) and isinstance(b, str):
        return a == b or _number(a) is not None and _number(a) == _number(b)
    return a == b


def _number(word: str) -> float | None:
    try:
        return float(word)
    except ValueError:
        return None


# A training flag, a variable of the job's env, or one the launcher exports for the submit.
DifferenceKind = Literal["flag", "env", "client_env"]


@dataclass(frozen=True)
class Difference:
    """One flag or env var that is not the same in `expected` (e.g. upstream) and `actual`."""

    kind: DifferenceKind
    name: str
    change: Literal["added", "removed", "changed"]
    expected: FlagValue | None
    actual: FlagValue | None

    def line(self) -> str:
        label = f"--{self.name}" if self.kind == "flag" else self.name
        if self.change == "added":
            return f"{self.kind} {label}: only in ours ({_show(self.actual)})"
        if self.change == "removed":
            return f"{self.kind} {label}: missing from ours (upstream {_show(self.expected)})"
        return f"{self.kind} {label}: upstream {_show(self.expected)}, ours {_show(self.actual)}"


def _show(value: FlagValue | None) -> str:
    if value is True:
        return "set"
    if isinstance(value, list):
        return " ".join(value)
    return repr(value)


def differences(
    kind: DifferenceKind, expected: dict[str, FlagValue], actual: dict[str, FlagValue]
) -> list[Difference]:
    """What `actual` adds, lacks and changes relative to `expected`, in a stable order."""
    out = []
    for name in dict.fromkeys([*expected, *actual]):
        if name not in actual:
            out.append(_difference(kind, name, "removed", expected[name], None))
        elif name not in expected:
            out.append(_difference(kind, name, "added", None, actual[name]))
        elif not same_value(expected[name], actual[name]):
            out.append(_difference(kind, name, "changed", expected[name], actual[name]))
    return out


def _difference(
    kind: DifferenceKind,
    name: str,
    change: Literal["added", "removed", "changed"],
    expected: FlagValue | None,
    actual: FlagValue | None,
) -> Difference:
    """A difference as it is shown and stored: secret values (HF_TOKEN, --wandb-key, a JSON
    flag holding a key) as fingerprints, which still tell a rotated secret apart."""
    label = f"{kind}.{name}"
    return Difference(
        kind, name, change, fingerprint_secret(label, expected), fingerprint_secret(label, actual)
    )


def launch_differences(
    expected_entrypoint: list[str],
    expected_env: dict[str, str],
    actual_entrypoint: list[str],
    actual_env: dict[str, str],
) -> list[Difference]:
    """Flag by flag over the training command, then env var by env var over the job's env."""
    return [
        *differences("flag", parse_flags(expected_entrypoint), parse_flags(actual_entrypoint)),
        *differences("env", dict(expected_env), dict(actual_env)),
    ]
