"""Environment names that make a program run code chosen by the value: a recipe's env is
exported to the engine (and, for miles, through Ray's runtime env to every worker), so such a
name turns a recipe into a program. The loader refuses them unless the recipe lists them in
`allow_exec_env`; env_check then warns about each one it allows."""

from __future__ import annotations

from collections.abc import Iterator

from recipeval.recipe.schema import Recipe

# Why each name is here:
# - shells: BASH_ENV (bash sources it for every non-interactive script, e.g. Ray's entrypoint
#   shell), ENV (sh/dash/ksh source it), PROMPT_COMMAND and PS4 (run or expanded by bash),
#   SHELLOPTS/BASHOPTS (turn on xtrace and friends in every child bash), BASH_XTRACEFD.
# - dynamic loader: LD_PRELOAD and LD_AUDIT load a library into every process; LD_LIBRARY_PATH
#   decides which libcuda/libc gets loaded; GCONV_PATH loads charset modules.
# - Python: PYTHONSTARTUP, PYTHONPATH, PYTHONHOME, PYTHONUSERBASE and PYTHONSAFEPATH change what
#   code is imported; PYTHONINSPECT/PYTHONBREAKPOINT run a hook. miles' launcher sets PYTHONPATH
#   itself (to its checkouts); a recipe adding to it must say so.
# - other interpreters a job may start: PERL5OPT, PERL5LIB, RUBYOPT, NODE_OPTIONS,
#   JAVA_TOOL_OPTIONS, _JAVA_OPTIONS.
EXEC_ENV: frozenset[str] = frozenset(
    {
        "BASH_ENV",
        "ENV",
        "PROMPT_COMMAND",
        "PS4",
        "SHELLOPTS",
        "BASHOPTS",
        "BASH_XTRACEFD",
        "LD_PRELOAD",
        "LD_AUDIT",
        "LD_LIBRARY_PATH",
        "GCONV_PATH",
        "PYTHONSTARTUP",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONUSERBASE",
        "PYTHONSAFEPATH",
        "PYTHONINSPECT",
        "PYTHONBREAKPOINT",
        "PERL5OPT",
        "PERL5LIB",
        "RUBYOPT",
        "NODE_OPTIONS",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
    }
)


def env_maps(recipe: Recipe) -> Iterator[tuple[str, dict[str, str | None]]]:
    """Every env mapping of a recipe with its dotted key: top level, stages, variants."""
    yield "env", dict(recipe.env)
    for stage in ("env_check", "smoke", "logprob_diff", "bench"):
        yield f"stages.{stage}.env", dict(getattr(recipe.stages, stage).env)
    for name, variant in recipe.stages.logprob_diff.variants.items():
        yield f"stages.logprob_diff.variants.{name}.env", dict(variant.env)


def exec_env_keys(recipe: Recipe) -> list[tuple[str, str]]:
    """(dotted key, name) for every exec-capable env name the recipe sets (null removes, so
    it does not count)."""
    return [
        (f"{where}.{name}", name)
        for where, env in env_maps(recipe)
        for name, value in env.items()
        if name in EXEC_ENV and value is not None
    ]


def refused_exec_env(recipe: Recipe) -> list[tuple[str, str]]:
    """(dotted key, message) for exec-capable names the recipe does not allow."""
    allowed = set(recipe.allow_exec_env)
    return [
        (
            key,
            (
                f"{name} makes the shell, loader or interpreter run code chosen by its value; "
                f"if that is intended, list it in allow_exec_env: [{name}]"
            ),
        )
        for key, name in exec_env_keys(recipe)
        if name not in allowed
    ]
