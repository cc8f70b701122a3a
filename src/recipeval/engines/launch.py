"""A rendered launch: exactly what a runner executes, with no shell in between."""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from recipeval.recipe.resolve import Resolved, flag_present
from recipeval.secrets import redact_argv, redact_data, redact_env

# Launch.extra key: the file argv reads the Ray runtime env from (written before the launch).
RUNTIME_ENV_FILE = "runtime_env_file"
_HEREDOC_END = "RECIPEVAL_RUNTIME_ENV"


@dataclass(frozen=True)
class Resources:
    nodes: int
    gpus_per_node: int


@dataclass(frozen=True)
class Launch:
    """argv runs the job from a login shell (for miles: `ray job submit ... -- python3 train.py`);
    entrypoint + runtime_env are the same job as a Ray Jobs client submits it. client_env is
    what the launcher exports for argv's own process (miles: no_proxy and PYTHONUNBUFFERED
    for `ray job submit`), on top of the caller's environment and `env`."""

    argv: list[str]
    env: dict[str, str]
    entrypoint: list[str]
    runtime_env: dict[str, Any]
    resources: Resources
    recipe_sha256: str
    engine: str
    stage: str | None = None
    variant: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    client_env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False)

    def to_shell(self) -> str:
        """A script a person can run by hand; every word is quoted."""
        lines = [
            "#!/usr/bin/env bash",
            (
                f"# recipeval render: engine={self.engine} stage={self.stage or '-'}"
                f" recipe_sha256={self.recipe_sha256}"
            ),
            "set -euo pipefail",
        ]
        if self.argv == self.entrypoint:
            lines += [f"export {shell_word(k)}={shell_word(v)}" for k, v in self.env.items()]
        lines += [f"export {shell_word(k)}={shell_word(v)}" for k, v in self.client_env.items()]
        env_file = self.extra.get(RUNTIME_ENV_FILE)
        if env_file:
            # One line of ASCII JSON can never equal the quoted heredoc's end word.
            lines += [
                "umask 077",
                f"mkdir -p -- {shell_word(str(Path(env_file).parent))}",
                f"cat > {shell_word(env_file)} <<'{_HEREDOC_END}'",
                runtime_env_json(self.runtime_env),
                _HEREDOC_END,
            ]
        lines.append(" \\\n  ".join(shell_lines(self.argv)))
        return "\n".join(lines) + "\n"

    def redacted(self) -> Launch:
        """The same launch with every secret (by name or value shape) shown as ***."""
        return replace(
            self,
            argv=redact_argv(self.argv),
            env=redact_env(self.env),
            entrypoint=redact_argv(self.entrypoint),
            runtime_env=redact_data(self.runtime_env),
        )


def runtime_env_json(runtime_env: dict[str, Any]) -> str:
    return json.dumps(runtime_env, separators=(",", ":"), ensure_ascii=True)


def write_runtime_env(launch: Launch) -> Path | None:
    """Write the runtime env file argv names, readable by its owner only (it holds every env
    value, secrets included); None when the launch names none."""
    name = launch.extra.get(RUNTIME_ENV_FILE)
    if not name:
        return None
    path = Path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode on O_CREAT
        handle.write(runtime_env_json(launch.runtime_env) + "\n")
    return path


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def shell_word(word: str) -> str:
    """`word` quoted for bash. One with a control character (a newline, a carriage return, an
    escape sequence) is written in ANSI-C quotes with the character as \\xHH, so the script
    shows on a terminal as it runs: raw, a CR or an escape sequence could hide or redraw part
    of the command."""
    if not _CONTROL.search(word):
        return shlex.quote(word)
    escaped = word.replace("\\", "\\\\").replace("'", "\\'")
    return "$'" + _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", escaped) + "'"


def shell_lines(argv: list[str]) -> list[str]:
    """Quoted words grouped one flag (with its values) per line, like a hand-written launch."""
    groups: list[list[str]] = [[]]
    after_separator = False
    for word in argv:
        starts_flag = word.startswith("-") and not after_separator
        if starts_flag and groups[-1]:
            groups.append([])
        groups[-1].append(shell_word(word))
        after_separator = word == "--"
    return [" ".join(g) for g in groups]


def flag_words(args: dict[str, Any]) -> list[str]:
    """`{'eps-clip': 0.2, 'colocate': True, 'x': [1, 2]}` -> ['--eps-clip', '0.2', '--colocate',
    '--x', '1', '2']; values are words, never shell text."""
    words: list[str] = []
    for flag, value in args.items():
        if not flag_present(value):
            continue
        words.append(f"--{flag}")
        if value is True:
            continue
        if isinstance(value, list):
            words.extend(_word(v) for v in value)
        else:
            words.append(_word(value))
    return words


def _word(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        # YAML 0.00 -> '0.0'; keep floats recognisably floats but without noise digits.
        return repr(value)
    return str(value)


def model_flags(resolved: Resolved, positions: bool = True) -> list[str]:
    """Structured `model` keys as Megatron's model-shape flags, then `model.args`.
    `positions`: miles takes the position range from the checkpoint's rope settings, so its
    launch carries no --max-position-embeddings."""
    m = resolved.recipe.model
    flags: dict[str, Any] = {
        "num-layers": m.layers,
        "hidden-size": m.hidden_size,
        "ffn-hidden-size": m.ffn_hidden_size,
        "num-attention-heads": m.attention_heads,
        "num-query-groups": m.kv_heads,
        "vocab-size": m.vocab_size,
        "max-position-embeddings": m.max_position_embeddings if positions else None,
    }
    if m.experts:
        flags |= {
            "num-experts": m.experts,
            "moe-ffn-hidden-size": m.moe_ffn_hidden_size,
            "moe-router-topk": m.moe_router_topk,
        }
    if m.kv_heads is not None:
        flags = {"group-query-attention": True, **flags}
    return flag_words(flags) + flag_words(m.args)


def parallel_flags(resolved: Resolved) -> list[str]:
    p = resolved.recipe.parallel
    return flag_words(
        {
            "tensor-model-parallel-size": p.tp,
            "sequence-parallel": p.sequence_parallel,
            "pipeline-model-parallel-size": p.pp,
            "decoder-first-pipeline-num-layers": p.pp_first_stage_layers,
            "decoder-last-pipeline-num-layers": p.pp_last_stage_layers,
            "context-parallel-size": p.cp,
            "expert-model-parallel-size": p.ep,
            "expert-tensor-parallel-size": p.etp,
        }
    )


def cluster_flags(resolved: Resolved) -> list[str]:
    c = resolved.recipe.cluster
    return flag_words(
        {
            "actor-num-nodes": c.nodes,
            "actor-num-gpus-per-node": c.gpus_per_node,
            "num-gpus-per-node": c.gpus_per_node,
        }
    )
