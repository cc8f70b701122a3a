"""The exit codes of every recipeval command, and the code a stage's status maps to."""

from __future__ import annotations

from collections.abc import Iterable

from recipeval.result import Status

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_ERROR = 0, 1, 2, 3
# Publish's per-recipe verdicts that make `publish --fail-on-regression` and `nightly` exit 1.
FAILING_VERDICTS = ("failed", "regressed")
STATUS_EXIT: dict[Status, int] = {
    "pass": EXIT_OK,
    "fail": EXIT_FAIL,
    "error": EXIT_ERROR,  # the stage could not judge (crash, timeout, a validator missing)
    "skipped": EXIT_ERROR,  # a gate was not pass: this stage judged nothing
}


def exit_code(statuses: Iterable[Status], exit_zero: bool = False) -> int:
    """One code for the results of one command: could not judge beats a failed check beats
    pass; `exit_zero` (results were written) makes it 0."""
    if exit_zero:
        return EXIT_OK
    codes = {STATUS_EXIT[status] for status in statuses}
    return EXIT_ERROR if EXIT_ERROR in codes else max(codes, default=EXIT_OK)
