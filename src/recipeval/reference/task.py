"""The task: two-digit addition with a zero-padded three-digit answer, and its rule-based reward.

Prompt `<bos>07+45=` (always PROMPT_TOKENS tokens, so a batch needs no padding), answer `052`
then EOS. The warm start learns from imperfect demonstrations: with probability UNPADDED_DEMOS an
answer is written without its leading zeros (`52`, which scores 0), as SFT data mixes styles.
The policy then keeps a prompt-independent format mistake that GRPO can remove, so reward
visibly rises within a few dozen steps even for a tiny model (learning more arithmetic would
take far longer). Operands stay under OPERAND_LIMIT so every answer has the leading zero: with
sums of 100 and more, half the prompts rewarded the opposite habit and the rise (+0.03 to +0.18
over 30-60 rollouts, depending on seed and CPU kernels) drowned in the reward's step-to-step
noise. Reward = characters of the answer matched at their position, divided by the longer of
answer and response (exact answer: 1.0; `05` : 2/3; `0521`: 3/4), so a person can check any
number by hand and partial progress is visible to GRPO.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from recipeval.reference.tokenizer import BOS_ID, EOS_ID, PAD_ID, decode_until_eos, encode

PROMPT_TOKENS = 7  # <bos> d d + d d =
TASK_NAME = "add2-pad3-v4"
UNPADDED_DEMOS = 0.5
OPERAND_LIMIT = 50  # every sum below 100: see the module docstring


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

    def demonstration_ids(self, rng: random.Random) -> list[int]:
        """Prompt + a demonstration (see UNPADDED_DEMOS) + EOS, right-padded to the answer's
        full length so a batch stays rectangular (padding is never attended by earlier tokens)."""
        answer = self.answer.lstrip("0") or "0" if rng.random() < UNPADDED_DEMOS else self.answer
        ids = [*self.prompt_ids(), *encode(answer), EOS_ID]
        return ids + [PAD_ID] * (PROMPT_TOKENS + len(self.answer) + 1 - len(ids))


def problems(seed: int, stream: str, index: int, count: int) -> list[Problem]:
    """Deterministic problems for (seed, stream, index): rollout N always sees the same prompts."""
    rng = random.Random(f"{TASK_NAME}/{seed}/{stream}/{index}")
    return [
        Problem(rng.randrange(OPERAND_LIMIT), rng.randrange(OPERAND_LIMIT)) for _ in range(count)
    ]


def reward(problem: Problem, response_ids: list[int]) -> float:
    text = decode_until_eos(response_ids)
    matched = sum(1 for got, want in zip(text, problem.answer) if got == want)
    return matched / max(len(problem.answer), len(text))
