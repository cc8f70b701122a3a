"""The task: two-digit addition with a zero-padded three-digit answer, and its rule-based reward.

Prompt `<bos>07+45=` (always PROMPT_TOKENS tokens, so a batch needs no padding), answer `052`
then EOS. Reward = characters of the answer matched at their position, divided by the longer of
answer and response (exact answer: 1.0; `05` : 2/3; `0521`: 3/4), so a person can check any
number by hand and partial progress is visible to GRPO.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from recipeval.engines.reference.tokenizer import BOS_ID, EOS_ID, decode_until_eos, encode

PROMPT_TOKENS = 7  # <bos> d d + d d =
TASK_NAME = "add2-pad3-v1"


@dataclass(frozen=True)
class Problem:
    a: int
    b: int

    @property
    def prompt(self) -> str:
        return f"{self.a:02d}+{self.b:02d}="

    @property
    def answer(self) -> str:
        return f"{self.a + self.b:03d}"

    def prompt_ids(self) -> list[int]:
        ids = [BOS_ID, *encode(self.prompt)]
        assert len(ids) == PROMPT_TOKENS
        return ids

    def answer_ids(self) -> list[int]:
        return [*encode(self.answer), EOS_ID]


def problems(seed: int, stream: str, index: int, count: int) -> list[Problem]:
    """Deterministic problems for (seed, stream, index): rollout N always sees the same prompts."""
    rng = random.Random(f"{TASK_NAME}/{seed}/{stream}/{index}")
    return [Problem(rng.randrange(100), rng.randrange(100)) for _ in range(count)]


def reward(problem: Problem, response_ids: list[int]) -> float:
    text = decode_until_eos(response_ids)
    matched = sum(1 for got, want in zip(text, problem.answer) if got == want)
    return matched / max(len(problem.answer), len(text))
