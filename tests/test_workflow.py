"""The Snakemake DAG: lint, dry runs in tmp working directories, gating, the Slurm profile's
real sbatch arguments, profile installation, and (slow) the full default DAG end to end."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
SNAKEFILE = REPO / "Snakefile"
BIN = Path(sys.executable).parent
TINY = REPO / "recipes/local/tiny-grpo-cpu.yaml"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    env.update(extra)
    return env


def snakemake(
    workdir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    argv = [
        str(BIN / "snakemake"),
        "--snakefile",
        str(SNAKEFILE),
        "--directory",
        str(workdir),
        *args,
    ]
    return subprocess.run(
        argv, capture_output=True, text=True, env=env or _env(), timeout=timeout, check=False
    )


def job_counts(output: str) -> dict[str, int]:
    """The `Job stats` table of a dry run (empty when there is nothing to do)."""
    counts: dict[str, int] = {}
    for match in re.finditer(r"^(\w+)\s+(\d+)$", output, re.MULTILINE):
        counts[match.group(1)] = int(match.group(2))
    counts.pop("total", None)
    return counts


def _workdir(tmp: Path, *recipes: Path) -> Path:
    (tmp / "recipes/local").mkdir(parents=True)
    for recipe in recipes:
        shutil.copy(recipe, tmp / "recipes/local" / recipe.name)
    return tmp


def _copy_recipe(src: Path, dest: Path, name: str, **replace: str) -> Path:
    text = src.read_text().replace(f"name: {src.stem}", f"name: {name}")
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    dest.write_text(text)
    return dest


def test_lint_and_snakefmt_are_clean() -> None:
    lint = subprocess.run(
        [str(BIN / "snakemake"), "--lint"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
        check=False,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "Congratulations, your workflow is in a good condition" in lint.stdout + lint.stderr
    fmt = subprocess.run(
        [str(BIN / "snakefmt"), "--check", "Snakefile", "rules"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_dry_run_plans_every_stage_of_the_default_recipe(tmp_path: Path) -> None:
    work = _workdir(tmp_path, TINY)
    proc = snakemake(work, "-n", "-p")
    assert proc.returncode == 0, proc.stderr
    assert job_counts(proc.stdout) == {
        "env_check": 1,
        "smoke": 1,
        "logprob_diff": 1,
        "bench": 1,
        "publish": 1,
        "all": 1,
    }
    out = proc.stdout
    assert (
        "recipeval smoke --recipe recipes/local/tiny-grpo-cpu.yaml --out results/tiny-grpo-cpu "
        "--require results/tiny-grpo-cpu/env_check.json"
    ) in out
    assert (
        "recipeval bench --recipe recipes/local/tiny-grpo-cpu.yaml --out results/tiny-grpo-cpu "
        "--require results/tiny-grpo-cpu/smoke.json  --exit-zero" in out
    )
    assert (
        "recipeval env-check --recipe recipes/local/tiny-grpo-cpu.yaml "
        "--out results/tiny-grpo-cpu/env_check.json --exit-zero"
    ) in out


def test_stage_selection_moves_the_gates(tmp_path: Path) -> None:
    work = _workdir(tmp_path, TINY)
    proc = snakemake(work, "-n", "-p", "--config", "stages=[env_check,bench]", "runner=local")
    assert proc.returncode == 0, proc.stderr
    assert job_counts(proc.stdout) == {"env_check": 1, "bench": 1, "publish": 1, "all": 1}
    assert (
        "--require results/tiny-grpo-cpu/env_check.json --runner local --exit-zero" in proc.stdout
    )


def test_a_stage_without_a_recipe_timeout_gets_the_configured_default(tmp_path: Path) -> None:
    """default_timeout_min reaches the stage as --timeout, so the stage's own limit fires
    before the scheduler's (or at all, on a local run) and writes a result."""
    work = _workdir(tmp_path)
    _copy_recipe(
        TINY, work / "recipes/local/no-limit.yaml", "no-limit", **{"    timeout: 20m\n": ""}
    )
    limits = work / "limits.yaml"
    limits.write_text(
        "default_timeout_min: {env_check: 15, smoke: 60, logprob_diff: 120, bench: 30}\n"
    )
    proc = snakemake(work, "-n", "-p", "--configfile", str(limits))
    assert proc.returncode == 0, proc.stderr
    (bench,) = [line for line in proc.stdout.splitlines() if "recipeval bench " in line]
    assert "--timeout 1800" in bench
    (smoke,) = [line for line in proc.stdout.splitlines() if "recipeval smoke " in line]
    assert "--timeout" not in smoke  # the recipe's own 10m holds
    assert re.search(r"\bruntime=43\b", proc.stdout), proc.stdout  # 30 min x 1.1 + 10


def refused(proc: subprocess.CompletedProcess) -> str:
    """What snakemake printed when the workflow refused its config or recipes before planning:
    our line, with no traceback and no stub of one (`File ".../common.smk", line N`)."""
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-2000:]
    assert "Traceback" not in text and 'common.smk", line' not in text, text[-2000:]
    assert "InputFunctionException" not in text, text[-2000:]
    return text


def test_config_numbers_from_the_command_line_and_impossible_ones(tmp_path: Path) -> None:
    """Nested --config values reach the workflow as strings ('30' was refused as "not of type
    'number'"); nan passed every bound and inf every bound but none, and both ended in a
    traceback while the jobs were planned."""
    work = _workdir(tmp_path)
    _copy_recipe(
        TINY, work / "recipes/local/no-limit.yaml", "no-limit", **{"    timeout: 20m\n": ""}
    )
    proc = snakemake(work, "-n", "-p", "--config", "default_timeout_min={bench: 30}")
    assert proc.returncode == 0, proc.stderr
    (bench,) = [line for line in proc.stdout.splitlines() if "recipeval bench " in line]
    assert "--timeout 1800" in bench
    for config, reason in (
        ("runtime_factor=nan", "config runtime_factor: not a finite number; give a number"),
        ("default_timeout_min={bench: nan}", "config default_timeout_min.bench: not a finite"),
        ("runtime_margin_min=inf", "config runtime_margin_min: inf is greater than the maximum"),
        (
            "default_timeout_min={smoke: 50000}",
            "config default_timeout_min.smoke: 50000 is greater than the maximum of 43200",
        ),
        ("runtime_factor=50", "config runtime_factor: 50 is greater than the maximum of 10"),
        ("stages=[env_check,smok]", "config stages.1: 'smok' is not one of ['env_check', "),
        (
            "runtime_factr=2",
            (
                "config: Additional properties are not allowed ('runtime_factr' was unexpected); "
                "the keys here: recipes, stages, "
            ),
        ),
        ("recipes={glob: [a]}", "config recipes: Additional properties are not allowed"),
        ("recipes={sweeps: [no-such]}", "config recipes.sweeps: no-such is not a folder"),
    ):
        text = refused(snakemake(work, "-n", "--config", config))
        assert f"recipeval workflow: {reason}" in text, (config, text[-2000:])
        assert "$schema" not in text, config  # one line, not the schema and config printed


def test_recipes_from_globs_files_and_excludes(tmp_path: Path) -> None:
    work = _workdir(tmp_path, TINY)
    _copy_recipe(TINY, work / "recipes/local/tiny-b.yaml", "tiny-b")
    (work / "recipes/extra").mkdir()
    _copy_recipe(TINY, work / "recipes/extra/tiny-c.yaml", "tiny-c")
    config = (
        "recipes={globs: [recipes/local/*.yaml], files: [recipes/extra/tiny-c.yaml], "
        "exclude: [recipes/local/tiny-grpo-cpu.yaml]}"
    )
    proc = snakemake(work, "-n", "--config", config)
    assert proc.returncode == 0, proc.stderr
    planned = set(re.findall(r"wildcards: recipe=(\S+)", proc.stdout))
    assert planned == {"tiny-b", "tiny-c"}


def test_bad_recipe_stops_the_plan_with_file_line_and_key(tmp_path: Path) -> None:
    work = _workdir(tmp_path, TINY)
    _copy_recipe(TINY, work / "recipes/local/broken.yaml", "broken", **{"layers: 2": "layers: -2"})
    text = refused(snakemake(work, "-n"))
    assert re.search(r"recipes/local/broken\.yaml:\d+: model\.layers: ", text), text


def test_empty_selection_is_refused(tmp_path: Path) -> None:
    proc = snakemake(_workdir(tmp_path), "-n", "--config", "recipes={globs: [recipes/none/*.yaml]}")
    assert "recipeval workflow: no recipe files selected" in refused(proc)


def test_duplicate_recipe_names_are_refused(tmp_path: Path) -> None:
    work = _workdir(tmp_path, TINY)
    shutil.copy(TINY, work / "recipes/local/again.yaml")
    assert "name 'tiny-grpo-cpu' is also used by" in refused(snakemake(work, "-n"))


def test_install_profiles_links_into_the_user_config_folder(tmp_path: Path) -> None:
    xdg = tmp_path / "xdg"
    script = REPO / "scripts/install-profiles.sh"
    proc = subprocess.run(
        [str(script)],
        env=_env(XDG_CONFIG_HOME=str(xdg)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    link = xdg / "snakemake/slurm-amd"
    assert link.is_symlink() and link.resolve() == (REPO / "profiles/slurm-amd").resolve()
    assert not (xdg / "snakemake/default").exists()
    # Idempotent; a foreign entry is left alone and reported.
    again = subprocess.run(
        [str(script)],
        env=_env(XDG_CONFIG_HOME=str(xdg)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert again.returncode == 0 and "ok" in again.stdout
    link.unlink()
    link.mkdir()
    clash = subprocess.run(
        [str(script)],
        env=_env(XDG_CONFIG_HOME=str(xdg)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert clash.returncode == 1 and "is not a link" in clash.stderr and link.is_dir()


def _installed_profiles(tmp: Path) -> dict[str, str]:
    xdg = tmp / "xdg"
    subprocess.run(
        [str(REPO / "scripts/install-profiles.sh")],
        env=_env(XDG_CONFIG_HOME=str(xdg)),
        capture_output=True,
        check=True,
    )
    return _env(XDG_CONFIG_HOME=str(xdg))


def test_bare_profile_name_resolves_after_install(tmp_path: Path) -> None:
    env = _installed_profiles(tmp_path)
    work = _workdir(tmp_path / "work", TINY)
    proc = snakemake(work, "--profile", "slurm-amd", "-n", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "slurm_partition=mi355x" in proc.stdout
    missing = snakemake(
        work, "--profile", "slurm-amd", "-n", env=_env(XDG_CONFIG_HOME=str(tmp_path / "none"))
    )
    assert missing.returncode != 0


FAKE_SBATCH = """#!/bin/sh
# Records what the Slurm plugin submits, and refuses the job (nothing runs).
printf '%s\\n' "$*" >> "$FAKE_SBATCH_LOG"
echo "sbatch: error: recorded by the test, not submitted" >&2
exit 1
"""


def _sbatch_calls(tmp: Path, recipes: list[Path], *config: str, **env_extra: str) -> list[str]:
    """Run `snakemake --profile slurm-amd` (installed by name) with `sbatch` replaced by a
    recorder; env_check results (local rule) are pre-made so the GPU stages are submitted."""
    from publish_fixtures import night, stage_result

    from recipeval.result import write_result

    env = _installed_profiles(tmp)
    work = tmp / "work"
    (work / "recipes").mkdir(parents=True)
    for folder in ("amd", "base", "nvidia"):
        shutil.copytree(REPO / "recipes" / folder, work / "recipes" / folder)
    for recipe in recipes:
        res = stage_result("env_check", work / recipe, night(0))
        write_result(res, work / "results" / res.recipe / "env_check.json")
    fake = tmp / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(FAKE_SBATCH)
    (fake / "sbatch").chmod(0o755)
    # The Slurm plugin checks the account with sacctmgr first; without a reachable cluster
    # (no slurm.conf) the real one fails on a DNS lookup before sbatch is ever called.
    (fake / "sacctmgr").write_text("#!/bin/sh\necho proj42\n")
    (fake / "sacctmgr").chmod(0o755)
    log = tmp / "sbatch.log"
    env.update(PATH=f"{fake}{os.pathsep}{env['PATH']}", FAKE_SBATCH_LOG=str(log), **env_extra)
    globs = ", ".join(str(r) for r in recipes)
    proc = snakemake(
        work,
        "--profile",
        "slurm-amd",
        "--config",
        f"recipes={{globs: [{globs}]}}",
        *config,
        env=env,
    )
    assert proc.returncode != 0 and log.is_file(), proc.stdout + proc.stderr  # refused on purpose
    return log.read_text().splitlines()


def test_slurm_amd_sbatch_gets_nodes_gres_time_and_no_ntasks_per_gpu(tmp_path: Path) -> None:
    recipes = [
        Path("recipes/amd/deepseek-v4-flash-4node-mi355x.yaml"),
        Path("recipes/amd/deepseek-v4-flash-4layer-1node.yaml"),
    ]
    calls = _sbatch_calls(tmp_path, recipes)
    print("\n".join(c.split(" --wrap=")[0] for c in calls))  # shown with pytest -s
    by_recipe = {re.search(r"--target-jobs .*?recipe=([\w.-]+)", c).group(1): c for c in calls}
    assert set(by_recipe) == {"deepseek-v4-flash-4node-mi355x", "deepseek-v4-flash-4layer-1node"}
    big = by_recipe["deepseek-v4-flash-4node-mi355x"]
    # One allocation for the three GPU stages (group): 4 nodes x 8 MI355X, partition from the
    # profile, time = sum of the stage limits (90m, 2h, 4h recipe timeouts -> 110+142+274 min).
    assert "--comment rule_gpu_stages_bench_logprob_diff_smoke" in big
    assert " --nodes=4 " in big and big.count("--gres=gpu:mi355x:8") == 1
    assert " -p mi355x " in big and " -t 526 " in big
    assert "--ntasks" not in big.split(" --wrap=")[0]
    assert " -A " not in big.split(" --wrap=")[0]
    assert "--cpus-per-task=16" in big
    small = by_recipe["deepseek-v4-flash-4layer-1node"]
    assert " --nodes=1 " in small and "--gres=gpu:mi355x:8" in small


def test_slurm_settings_from_environment_and_ungrouped_stages(tmp_path: Path) -> None:
    recipes = [Path("recipes/nvidia/deepseek-v4-flash-8node-h200.yaml")]
    calls = _sbatch_calls(
        tmp_path,
        recipes,
        "gpu_group=none",
        RECIPEVAL_SLURM_PARTITION="gpu",
        RECIPEVAL_SLURM_ACCOUNT="proj42",
        RECIPEVAL_SLURM_CPUS="32",
    )
    # Without the group only smoke can be submitted (the others wait for it).
    (call,) = calls
    head = call.split(" --wrap=")[0]
    assert "--comment rule_smoke_wildcards_deepseek-v4-flash-8node-h200" in head
    assert " -p gpu " in head and " -A proj42 " in head and "--cpus-per-task=32" in head
    assert " --nodes=8 " in head and "--gres=gpu:h200:8" in head and " -t 110 " in head


@pytest.mark.slow
def test_full_default_dag_then_nothing_to_do_then_one_recipe_reruns(tmp_path: Path) -> None:
    # The tiny recipe as shipped: its bench runs 8192-token responses (~25 s a step here) and
    # must stop by itself once its intervals are tight enough.
    work = _workdir(tmp_path, TINY)
    # A second recipe that env_check rejects (TP does not divide the 4 heads): its later stages
    # are skipped, the tiny one runs on, and publish shows both.
    broken = _copy_recipe(
        TINY,
        work / "recipes/local/tiny-bad-layout.yaml",
        "tiny-bad-layout",
        **{"parallel: {tp: 1,": "parallel: {tp: 3,"},
    )
    args = ("--config", "runner=local", "--cores", "2")
    first = snakemake(work, *args, timeout=1500)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    results = work / "results"
    status = {
        (r, s): json.loads((results / r / f"{s}.json").read_text())["status"]
        for r in ("tiny-grpo-cpu", "tiny-bad-layout")
        for s in ("env_check", "smoke", "logprob_diff", "bench")
    }
    assert [
        status[("tiny-grpo-cpu", s)] for s in ("env_check", "smoke", "logprob_diff", "bench")
    ] == ["pass"] * 4
    bench = json.loads((results / "tiny-grpo-cpu/bench.json").read_text())["summary"]
    print(
        {
            m: (round(e["estimate"], 2), round(e["rel_width"], 4), e["used"])
            for m, e in bench["metrics"].items()
        },
        bench["steps"],
        bench["stop"],
    )
    # The stopping rule ends the run itself: precise before max_steps, or at max_steps with an
    # honest (correlation-widened) interval for every metric; on 2 shared cores the step times
    # come in load waves, so which of the two happens depends on the machine, not the code.
    assert bench["stop"] in ("precise", "max_steps") and bench["steps"] <= 20, bench
    assert all(
        e["used"] >= bench["min_steps"] and 0 < e["rel_width"] < float("inf")
        for e in bench["metrics"].values()
    ), bench
    lengths = pd.read_parquet(results / "tiny-grpo-cpu/bench.steps.parquet")[
        "rollout/response_len/mean"
    ]
    assert len(lengths.dropna()) >= bench["steps"] and (lengths.dropna() == 8192).all(), lengths
    assert status[("tiny-bad-layout", "env_check")] == "fail"
    assert {status[("tiny-bad-layout", s)] for s in ("smoke", "logprob_diff", "bench")} == {
        "skipped"
    }
    table = (results / "tables/benchmarks.md").read_text()
    assert "tiny-bad-layout" in table and "skipped: gate env_check" in table
    verdict = json.loads((results / "regression.json").read_text())
    assert {r["recipe"]: r["status"] for r in verdict["recipes"]}["tiny-bad-layout"] == "failed"
    assert (results / "junit.xml").is_file() and (results / "history/history.parquet").is_file()

    idle = snakemake(work, "-n", *args)
    assert idle.returncode == 0 and job_counts(idle.stdout) == {}, idle.stdout
    assert "Nothing to be done" in idle.stdout + idle.stderr

    good_mtime = (results / "tiny-grpo-cpu/bench.json").stat().st_mtime
    broken.write_text(broken.read_text().replace("seed: 1234", "seed: 4321"))
    plan = snakemake(work, "-n", *args)
    assert job_counts(plan.stdout) == {
        "env_check": 1,
        "smoke": 1,
        "logprob_diff": 1,
        "bench": 1,
        "publish": 1,
        "all": 1,
    }
    assert set(re.findall(r"wildcards: recipe=(\S+)", plan.stdout)) == {"tiny-bad-layout"}
    second = snakemake(work, *args, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (results / "tiny-grpo-cpu/bench.json").stat().st_mtime == good_mtime
    runs = sorted(p.parent.name for p in (results / "history").glob("*/*.json"))
    assert runs == ["tiny-bad-layout", "tiny-bad-layout", "tiny-grpo-cpu"]

    # `snakemake --report`: the tables and every plot as report items.
    report = snakemake(work, "--report", str(work / "report.zip"), *args)
    assert report.returncode == 0, report.stderr[-3000:]
    with zipfile.ZipFile(work / "report.zip") as archive:
        names = archive.namelist()
    for item in (
        "benchmarks.html",
        "benchmarks.csv",
        "_overview/steady-state-times.png",
        "tiny-grpo-cpu/bench-plot.png",
        "tiny-grpo-cpu/logprob_diff-histogram.png",
        "tiny-grpo-cpu/logprob_diff-by_position.png",
    ):
        assert any(n.endswith(item) for n in names), (item, names)
