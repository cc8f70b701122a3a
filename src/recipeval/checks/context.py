"""Context and batch arithmetic: sequences within the model's positions (and SGLang's context
length), and the rollout batch splitting into whole training steps as miles computes them."""

from __future__ import annotations

from recipeval.checks.subject import Subject
from recipeval.result import Check


def context_checks(subject: Subject) -> list[Check]:
    positions = subject.recipe.model.max_position_embeddings
    response = subject.int_arg("rollout-max-response-len")
    if response is None:
        return [
            subject.check(
                "context.positions",
                True,
                "rollout-max-response-len not set: the trainer's default applies",
                severity="info",
            )
        ]
    prompt = subject.int_arg("rollout-max-prompt-len")
    context = subject.int_arg("rollout-max-context-len")
    checks = []
    longest = response + (prompt or 0)
    prompt_note = (
        f"prompt {prompt} + response {response}"
        if prompt is not None
        else f"response {response} (rollout-max-prompt-len not set: prompt length not counted)"
    )
    key = subject.arg_key("rollout-max-response-len")
    checks.append(
        subject.check(
            "context.positions",
            longest <= positions,
            f"{prompt_note} = {longest} tokens vs the model's {positions} positions",
            key=key,
            value=longest,
            threshold=positions,
        )
    )
    if context is not None:
        checks.append(
            subject.check(
                "context.rollout-context-len",
                context <= positions,
                f"rollout-max-context-len {context} vs the model's {positions} positions",
                key=subject.arg_key("rollout-max-context-len"),
                value=context,
                threshold=positions,
            )
        )
    sglang_context = subject.int_arg("sglang-context-length")
    if sglang_context is not None:
        checks.append(
            subject.check(
                "context.sglang-context-length",
                longest <= sglang_context,
                f"{prompt_note} = {longest} tokens vs sglang-context-length {sglang_context}: SGLang "
                "cuts longer sequences",
                key=subject.arg_key("sglang-context-length"),
                value=longest,
                threshold=sglang_context,
            )
        )
    return checks


def global_batch(subject: Subject) -> int | None:
    """The global batch miles derives: rollout batch x samples per prompt // steps per rollout,
    unless global-batch-size is given."""
    rollout = subject.int_arg("rollout-batch-size")
    samples = subject.int_arg("n-samples-per-prompt", 1)
    steps = subject.int_arg("num-steps-per-rollout")
    if rollout is None or not samples:
        return subject.int_arg("global-batch-size")
    if steps:
        return rollout * samples // steps
    return subject.int_arg("global-batch-size")


def batch_checks(subject: Subject) -> list[Check]:
    rollout = subject.int_arg("rollout-batch-size")
    samples = subject.int_arg("n-samples-per-prompt", 1)
    if rollout is None:
        return []
    per_rollout = rollout * (samples or 1)
    steps = subject.int_arg("num-steps-per-rollout")
    given = subject.int_arg("global-batch-size")
    checks = []
    what = f"rollout-batch-size {rollout} x n-samples-per-prompt {samples} = {per_rollout} samples"
    if steps:
        ok = per_rollout % steps == 0
        checks.append(
            subject.check(
                "batch.steps-per-rollout",
                ok,
                f"{what} over num-steps-per-rollout {steps}"
                + (
                    f": global batch {per_rollout // steps}"
                    if ok
                    else f": miles floors the global batch to {per_rollout // steps} and never trains the "
                    f"last {per_rollout % steps} samples"
                ),
                key=subject.arg_key("num-steps-per-rollout"),
                value=per_rollout,
                threshold=steps,
            )
        )
        if given is not None and given != per_rollout // steps:
            checks.append(
                subject.check(
                    "batch.global-batch",
                    False,
                    f"global-batch-size {given} but {what} // num-steps-per-rollout {steps} = "
                    f"{per_rollout // steps}: miles asserts they are equal",
                    key=subject.arg_key("global-batch-size"),
                    value=given,
                    threshold=per_rollout // steps,
                )
            )
    elif given is not None:
        checks.append(
            subject.check(
                "batch.global-batch",
                given > 0 and per_rollout % given == 0,
                f"{what} in global batches of {given}"
                if given > 0
                else f"global-batch-size {given}: a batch holds at least one sample",
                key=subject.arg_key("global-batch-size"),
                value=per_rollout,
                threshold=given,
            )
        )
    return checks


def rollout_engine_checks(subject: Subject) -> list[Check]:
    """The rollout engines tile their GPUs as miles places them: rollout-num-gpus (all the
    cluster's GPUs when colocated or unset) in engines of rollout-num-gpus-per-engine, and an
    engine larger than a node spans whole nodes."""
    r = subject.recipe
    engine = subject.int_arg("rollout-num-gpus-per-engine")
    if engine is None or not r.cluster.gpus_per_node:
        return []
    per_node = r.cluster.gpus_per_node
    own = None if subject.flag_on("colocate") else subject.int_arg("rollout-num-gpus")
    if own is not None and own < 1:
        if own == 0 and subject.flag_on("rollout-external-engine-addrs"):
            return []  # the engines run outside this cluster: nothing here to tile
        # miles' placement group then holds the trainer's GPUs only, so no engine starts.
        why = (
            f"rollout-num-gpus {own}: without colocate or rollout-external-engine-addrs miles "
            "starts no rollout engine; set it to the GPUs the engines get, or colocate"
        )
        return [
            subject.check(
                "rollout.engine-tiling",
                False,
                why,
                key=subject.arg_key("rollout-num-gpus"),
                value=own,
                threshold=engine,
            )
        ]
    gpus = own or r.world_size
    where = f"{gpus} rollout GPUs" if own else f"{r.cluster.nodes} nodes x {per_node} GPUs"
    key = subject.arg_key("rollout-num-gpus-per-engine")
    fits = engine > 0 and gpus % engine == 0
    whole = engine > 0 and (engine <= per_node and per_node % engine == 0 or engine % per_node == 0)
    if fits and whole:
        why = f"{gpus // engine} engine(s) of {engine} GPUs on {where}"
    else:
        sizes = [
            n
            for n in range(1, gpus + 1)
            if gpus % n == 0 and (per_node % n == 0 or n % per_node == 0)
        ]
        why = (
            f"rollout-num-gpus-per-engine {engine}: engines of {engine} GPUs do not tile {where}"
            + ("" if fits else f" ({gpus} GPUs are not a whole number of engines)")
            + ("" if whole else f" (an engine would straddle two nodes of {per_node} GPUs)")
            + f"; use one of: {', '.join(map(str, sizes))}"
        )
    return [
        subject.check(
            "rollout.engine-tiling", fits and whole, why, key=key, value=engine, threshold=gpus
        )
    ]
