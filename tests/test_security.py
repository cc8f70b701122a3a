"""Issue 15: secrets, hostile files and killed runs. Each numbered case of the issue is a test
here, through the real CLI (subprocesses, as users and Snakemake run it)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
from conftest import PR_RECIPE, TINY_RECIPE, clean_env, kill_session, run_cli
from publish_fixtures import night, stage_result, write_run

from recipeval.result import write_result
from recipeval.secrets import (
    fingerprint,
    fingerprint_secrets,
    is_secret_name,
    redact_argv,
    scrub,
    secret_values,
)

# A test corpus of secrets: by name, by shape, as a flag.
HF = "hf_" + "a" * 30
HF_ROTATED = "hf_" + "b" * 30
DB = "hunter2hunter2"
WANDB = "0123456789abcdef0123"
URL_PASS = "pw1234567"
FLAG_KEY = "wk-9f8e7d6c5b4a"
CORPUS = (HF, HF_ROTATED, DB, WANDB, URL_PASS, FLAG_KEY)


def _secret_recipe(path: Path, parent: Path, token: str = HF, name: str = "sec-run") -> Path:
    path.write_text(
        f"extends: {parent}\nname: {name}\n"
        f"env: {{HF_TOKEN: {token}, DB_PASS: {DB}, WANDB_API_KEY: '{WANDB}', "
        f"NOTE_URL: 'https://bob:{URL_PASS}@proxy.example'}}\n"
        f"args: {{wandb-key: {FLAG_KEY}}}\n"
    )
    return path


def _leaks(*roots: Path, texts: tuple[str, ...] = ()) -> list[str]:
    """Every (file or output, secret) pair where a corpus secret shows."""
    found = []
    for root in roots:
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for file in files:
            data = file.read_bytes()
            found += [f"{file}: {s}" for s in CORPUS if s.encode() in data]
    for i, text in enumerate(texts):
        found += [f"output {i}: {s}" for s in CORPUS if s in text]
    return found


# --- one notion of secret ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "DB_PASS",
        "DB_PWD",
        "MY_PASSWORD",
        "PGPASSWORD",
        "PGPASSWD",
        "WANDB_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ACCESS_KEY_ID",
        "OPENAI_APIKEY",
        "GITHUB_PAT",
        "wandb-key",
        "hf-token",
        "openai-api-key",
        "db-password",
        "client-secret",
    ],
)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "PATH",
        "PASSTHROUGH",
        "PASS_THROUGH",
        "PWD",
        "OLDPWD",
        "COMPASS",
        "KEYBOARD",
        "TOKENIZER",
        "AUTHOR",
        "LD_LIBRARY_PATH",
        "SORT_KEY",
        "max-tokens-per-gpu",
        "moe-token-dispatcher-type",
        "label-key",
        "input-key",
        "tokenizer-path",
    ],
)
def test_names_that_are_not_secrets(name):
    assert not is_secret_name(name)


def test_secret_shapes_are_scrubbed_whatever_their_name():
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlX2hlcmU"
    text = (
        f"load https://bob:{URL_PASS}@host/x {HF} ghp_{'c' * 36} sk-{'d' * 40} "
        f"AKIAABCDEFGHIJKLMNOP {jwt} plain words /usr/bin:/bin"
    )
    out = scrub(text)
    for secret in (URL_PASS, HF, "ghp_", "sk-d", "AKIA", jwt):
        assert secret not in out
    assert "plain words /usr/bin:/bin" in out and "https://***@host/x" in out


def test_secret_flag_values_are_found_and_redacted():
    argv = [
        "ray",
        "--wandb-key",
        FLAG_KEY,
        f"--hf-token={HF}",
        "--lr",
        "1e-5",
        "--label-key",
        "label",
    ]
    assert set(secret_values({}, argv)) == {FLAG_KEY, HF}
    assert redact_argv(argv) == [
        "ray",
        "--wandb-key",
        "***",
        "--hf-token=***",
        "--lr",
        "1e-5",
        "--label-key",
        "label",
    ]


def test_fingerprints_keep_change_not_value():
    facts = {
        "env.HF_TOKEN": HF,
        "args.wandb-key": FLAG_KEY,
        "args.lr": 1e-5,
        "args.load": f"https://u:{URL_PASS}@h/x",
        "env.PATH_X": "/opt",
    }
    stored = fingerprint_secrets(facts)
    assert stored["env.HF_TOKEN"] == fingerprint(HF) != fingerprint(HF_ROTATED)
    assert stored["args.lr"] == 1e-5 and stored["env.PATH_X"] == "/opt"
    assert not _leaks(texts=(json.dumps(stored),))
    assert fingerprint_secrets(stored) == stored  # reading an already stored record again


# --- case 1: secrets never reach a file or output of smoke + publish ----------------------


def test_case1_smoke_and_publish_keep_no_secret(tmp_path):
    """A recipe full of secrets (env by name, URL credentials, a key flag): the engine refuses
    the unknown flag, so the log holds the flag's value; nothing written or printed holds it."""
    recipe = _secret_recipe(tmp_path / "sec.yaml", TINY_RECIPE)
    out = tmp_path / "results" / "sec-run"
    smoke = run_cli("smoke", str(recipe), "--runner", "local", "--out", str(out), cwd=tmp_path)
    assert smoke.returncode in (1, 3), smoke.stderr
    assert "--wandb-key ***" in (out / "smoke.log").read_text()
    pub = tmp_path / "pub"
    publish = run_cli(
        "publish",
        str(tmp_path / "results"),
        "--tables",
        str(pub / "tables"),
        "--history",
        str(pub / "history"),
        "--junit",
        str(pub / "junit.xml"),
        "--verdict",
        str(pub / "regression.json"),
        "--no-plots",
        cwd=tmp_path,
    )
    assert publish.returncode == 0, publish.stderr
    assert (pub / "history" / "history.parquet").is_file()
    assert not _leaks(
        tmp_path / "results",
        pub,
        texts=(smoke.stdout, smoke.stderr, publish.stdout, publish.stderr),
    )


def test_case1_rotated_token_shows_as_changed_fingerprint(tmp_path):
    """After the token is rotated, 'what changed' names env.HF_TOKEN with two fingerprints,
    on stdout, in regression.json, the page and the history; never a value."""
    recipes = []
    for i, token in enumerate((HF, HF_ROTATED)):
        folder = tmp_path / f"r{i}"
        folder.mkdir()
        recipes.append(_secret_recipe(folder / "sec.yaml", PR_RECIPE, token))
    pub = tmp_path / "pub"
    outputs = [
        "--tables",
        str(pub / "tables"),
        "--history",
        str(pub / "history"),
        "--junit",
        str(pub / "junit.xml"),
        "--verdict",
        str(pub / "regression.json"),
        "--no-plots",
    ]
    stdouts = []
    for n, recipe in enumerate(recipes):
        # the second night is slower: "what changed" is listed for a regressed run
        write_run(tmp_path / f"night{n}", recipe, night(n), cycle=474.0 * (1 + n))
        proc = run_cli("publish", str(tmp_path / f"night{n}"), *outputs)
        assert proc.returncode == 0, proc.stderr
        stdouts.append(proc.stdout)
    line = f"changed recipe env.HF_TOKEN: {fingerprint(HF)} -> {fingerprint(HF_ROTATED)}"
    assert line in stdouts[1]
    for output in ("regression.json", "tables/benchmarks.html"):
        assert fingerprint(HF_ROTATED) in (pub / output).read_text()
    assert not _leaks(pub, tmp_path / "night0", tmp_path / "night1", texts=tuple(stdouts))


# --- cases 2, 5, 7: hostile and clumsy recipe files ---------------------------------------


def _base() -> str:
    return TINY_RECIPE.read_text()


def _appended_line() -> int:
    """The line a key appended to the tiny recipe lands on."""
    return len(_base().splitlines()) + 1


def _edited(old: str, new: str, count: int = -1) -> str:
    """The tiny recipe with `old` replaced: fails loudly when the shipped recipe no longer has it."""
    base = _base()
    assert old in base, f"{TINY_RECIPE.name} no longer contains {old!r}"
    return base.replace(old, new, count)


def _refused(
    path: Path, *command: str, line: int | None = None, within_s: float = 10, at: str | None = None
) -> str:
    """Run the command on `path`: exit 2, no traceback, the message at `at` (default: the
    file, with `line` when given)."""
    start = time.monotonic()
    proc = run_cli(*(command or ("validate",)), str(path), timeout=60)
    assert time.monotonic() - start < within_s
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    where = at or (f"{path.name}:{line}" if line else path.name)
    assert where in proc.stderr, proc.stderr
    return proc.stderr


def test_case2_alias_bomb_fails_fast_and_small(tmp_path):
    lines = ["x0: &a0 [1,1,1,1,1,1,1,1,1]"]
    lines += [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n" + _base())
    assert bomb.stat().st_size < 1024 + len(_base())
    for command in (("validate",), ("render",), ("env-check", "--static")):
        assert "alias" in _refused(bomb, *command)
    program = (
        "import sys; from recipeval.recipe import load_recipe, InvalidRecipe\n"
        "try: load_recipe(sys.argv[1])\nexcept InvalidRecipe: pass\n"
        # VmHWM, not ru_maxrss: the latter keeps the forking pytest's peak across exec.
        "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')))"
    )
    probe = subprocess.run(
        [sys.executable, "-c", program, str(bomb)],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
        timeout=60,
    )
    assert int(probe.stdout) < 300_000  # KiB: the bomb stalled at 4-5 GB


def test_case2_merge_key_bomb_is_refused(tmp_path):
    lines = ["m0: &m0 {" + ", ".join(f"k{j}: 1" for j in range(9)) + "}"]
    lines += [f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 9)}]}}" for i in range(1, 10)]
    bomb = tmp_path / "merge.yaml"
    bomb.write_text("\n".join(lines) + "\n" + _base())
    assert "merge" in _refused(bomb)


def test_case5_deep_nesting_self_alias_long_extends(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text(_base() + "description: " + "[" * 500 + "]" * 500 + "\n")
    assert "nested deeper" in _refused(deep)
    selfref = tmp_path / "self.yaml"
    selfref.write_text(_edited("args:\n", "args:\n  x: &s [*s]\n", 1))
    assert "self-referencing" in _refused(selfref, line=19)
    for i in range(1500):
        text = f"extends: c{i + 1}.yaml\n" if i < 1499 else _base()
        (tmp_path / f"c{i}.yaml").write_text(text)
    # named where the chain passed its length: the 16th file, line 1
    assert "extends chain longer" in _refused(tmp_path / "c0.yaml", at="c15.yaml:1")


def test_case5_big_integer_and_non_finite_numbers(tmp_path):
    cases = {
        "bigint": (_edited("seed: 1234", "seed: " + "9" * 5000), 30),
        "nodes": (_edited("nodes: 1,", "nodes: 1e20,"), 6),
        "hugecount": (_edited("layers: 2", "layers: " + "9" * 4000), 9),
        "mrl_inf": (
            _edited("rollout-max-response-len: 16", "rollout-max-response-len: .inf"),
            22,
        ),
        "mrl_nan": (
            _edited("rollout-max-response-len: 16", "rollout-max-response-len: .nan"),
            22,
        ),
        "memfrac": (
            _base() + "stages: {smoke: {args: {sglang-mem-fraction-static: .inf}}}\n",
            None,
        ),
        "timeout": (_edited("timeout: 10m\n  logprob", "timeout: .inf\n  logprob"), 41),
        "rel_ci": (_edited("rel_ci: 0.5", "rel_ci: .nan"), None),
    }
    for name, (text, line) in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        _refused(path, line=line)
        _refused(path, "env-check", "--static", line=line)


def test_case5_zero_global_batch_is_a_failed_check_not_a_crash(tmp_path):
    path = tmp_path / "gbs0.yaml"
    path.write_text(_edited("cpu-threads: 1", "cpu-threads: 1\n  global-batch-size: 0"))
    proc = run_cli("env-check", "--static", str(path))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "global-batch-size 0" in proc.stdout


def test_case5_non_regular_files(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for target in (Path("/dev/zero"), fifo, tmp_path):
        proc = run_cli("validate", str(target), timeout=20)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "regular file" in proc.stderr or "directory" in proc.stderr


def test_case7_big_file_refused_at_once(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text(_base() + "description: |\n" + ("  " + "x" * 98 + "\n") * 100_000)
    assert "limited to" in _refused(big, within_s=5)
    assert "limited to" in _refused(big, "env-check", "--static", within_s=5)


@pytest.mark.parametrize("bad", ["/dev/null", "FILE", "", "a" * 300, "FILE/below"])
def test_case5_out_must_be_a_usable_folder(tmp_path, bad):
    target = bad.replace("FILE", str(TINY_RECIPE))
    for command in (("smoke", "--runner", "local"), ("env-check", "--static")):
        proc = run_cli(*command, str(TINY_RECIPE), "--out", target, cwd=tmp_path)
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        assert "--out" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir())  # `--out ''` wrote nothing into the current folder


def test_case7_env_names_values_and_arg_names(tmp_path):
    path = tmp_path / "env.yaml"
    path.write_text(_base() + 'env: {"A=B": "1", "BAD$(x)": "2", "A B": "3", OK: "a\\0b"}\n')
    err = _refused(path, line=_appended_line())
    for name in (
        "env.A=B",
        "env.BAD$(x)",
        "env.A B",
        "env.OK: environment values cannot contain a NUL",
    ):
        assert name in err
    empty = tmp_path / "empty.yaml"
    empty.write_text(_edited("args:\n", 'args:\n  "": 1\n', 1))
    assert "flag names are non-empty" in _refused(empty, line=19)


def test_case7_env_check_of_a_huge_cluster_is_bounded(tmp_path):
    recipe = tmp_path / "huge.yaml"
    recipe.write_text(f"extends: {PR_RECIPE}\ncluster: {{nodes: 100000}}\n")
    start = time.monotonic()
    proc = run_cli("env-check", "--static", str(recipe), timeout=120)
    # The megatron-core import alone takes a few seconds on this machine; the simulation of
    # 800 000 ranks took over 60 s before.
    assert time.monotonic() - start < 30
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr


# --- case 8: recipe env is code ------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["BASH_ENV", "ENV", "LD_PRELOAD", "PYTHONSTARTUP", "PROMPT_COMMAND"]
)
def test_case8_exec_env_refused_unless_allowed(tmp_path, name):
    refused = tmp_path / "x.yaml"
    refused.write_text(_base() + f"env: {{{name}: /tmp/x.sh}}\n")
    assert "allow_exec_env" in _refused(refused, line=_appended_line())
    allowed = tmp_path / "ok.yaml"
    allowed.write_text(_base() + f"env: {{{name}: /tmp/x.sh}}\nallow_exec_env: [{name}]\n")
    assert run_cli("validate", str(allowed)).returncode == 0
    proc = run_cli("env-check", "--static", str(allowed))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"WARNING env.exec_allowed: {name}" in proc.stdout


def test_case8_null_in_an_overlay_removes_without_opt_in(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(_edited("  smoke:\n", "  smoke:\n    env: {LD_PRELOAD: null}\n", 1))
    assert run_cli("validate", str(path)).returncode == 0


# --- case 9: secrets out of argv -----------------------------------------------------------


def test_case9_runtime_env_not_in_argv_and_redact(tmp_path):
    recipe = _secret_recipe(tmp_path / "sec.yaml", PR_RECIPE)
    plain = run_cli("render", str(recipe), "--format", "json")
    assert plain.returncode == 0, plain.stderr
    launch = json.loads(plain.stdout)
    assert not _leaks(texts=(json.dumps(launch["argv"][: launch["argv"].index("--")]),))
    assert launch["runtime_env"]["env_vars"]["HF_TOKEN"] == HF
    for fmt in ("json", "shell"):
        redacted = run_cli("render", str(recipe), "--format", fmt, "--redact")
        assert redacted.returncode == 0 and "***" in redacted.stdout
        assert not _leaks(texts=(redacted.stdout,))


# --- case 3: a killed stage takes its engine down --------------------------------------------


def _engines(stage: subprocess.Popen) -> list[psutil.Process]:
    try:
        children = psutil.Process(stage.pid).children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in children if "recipeval.reference" in " ".join(_cmdline(p))]


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def test_case3_kill_9_of_smoke_leaves_no_engine(tmp_path):
    recipe = tmp_path / "slow.yaml"
    # A long smoke: the engine is still running when the stage is killed.
    recipe.write_text(
        f"extends: {TINY_RECIPE}\nstages: {{smoke: {{args: {{num-rollout: 200}}}}}}\n"
    )
    stage = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "recipeval",
            "smoke",
            str(recipe),
            "--runner",
            "local",
            "--out",
            str(tmp_path / "out"),
        ],
        env=clean_env(),
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    engines: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while not (engines := _engines(stage)):
            assert time.monotonic() < deadline, "the engine never started"
            assert stage.poll() is None, "the stage ended before the engine started"
            time.sleep(0.2)
        stage.kill()
        stage.wait()
        _, alive = psutil.wait_procs(engines, timeout=5)
        assert not alive, "the engine outlived its stage"
    finally:
        kill_session(stage)
        for engine in engines:  # a failed test leaves nothing running either
            with contextlib.suppress(psutil.Error):
                engine.kill()


# --- cases 4 and 6: publish paths and concurrency --------------------------------------------


@pytest.mark.parametrize("name", ["../../../x", "/tmp/abs-x", "..", ".hidden", "a/b"])
def test_case4_publish_refuses_path_names(tmp_path, name):
    result = stage_result("smoke", TINY_RECIPE, night(0))
    result = result.model_copy(update={"recipe": name})
    results = tmp_path / "deep" / "er" / "results"
    write_result(result, results / "x" / "smoke.json")
    history = tmp_path / "deep" / "er" / "history"
    proc = run_cli(
        "publish",
        str(results),
        "--history",
        str(history),
        "--tables",
        str(tmp_path / "t"),
        "--junit",
        str(tmp_path / "j.xml"),
        "--verdict",
        str(tmp_path / "v.json"),
        "--no-plots",
    )
    assert proc.returncode == 2 and "cannot be a file name" in proc.stderr, proc.stderr
    # the result file holds the name, so the error names it (it named the recipe YAML before)
    assert proc.stderr.startswith(f"recipeval: unreadable stage result {results}/x/smoke.json: ")
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep"]
    assert not history.exists() or not any(history.rglob("*.json"))
    assert not Path("/tmp/abs-x").exists()


def test_case6_concurrent_publishes_lose_nothing(tmp_path):
    history = tmp_path / "history"
    procs = []
    for n in range(5):
        folder = tmp_path / f"night{n}"
        write_run(folder, PR_RECIPE, night(n))
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "recipeval",
                    "publish",
                    str(folder),
                    "--history",
                    str(history),
                    "--tables",
                    str(folder / "tables"),
                    "--junit",
                    str(folder / "j.xml"),
                    "--verdict",
                    str(folder / "v.json"),
                    "--no-plots",
                ],
                env=clean_env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
    table = pd.read_parquet(history / "history.parquet")
    assert table["run_id"].nunique() == 5
    assert len(list(history.glob("*/*.json"))) == 5


RACE = """
import sys, time
from pathlib import Path
from recipeval.publish import history
from recipeval.publish.records import RunRecord
folder, n, signals = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
record = RunRecord(run_id=f"{n:016x}", recipe="r", recipe_sha256="0" * 64,
                   date=f"2026-11-0{n + 1}T00:00:00+00:00", metrics={"bench.x": float(n)})


def wait_for(*names, limit=60.0):
    end = time.monotonic() + limit
    while not all((signals / name).exists() for name in names) and time.monotonic() < end:
        time.sleep(0.01)


real_load = history.load


def slow_load(folder, **options):
    # publish 0 has read the runs, then draws plots while the others publish
    runs = real_load(folder, **options)
    (signals / "loaded").touch()
    wait_for(*(f"appended-{k}" for k in range(1, 5)))
    wait_for(*(f"rebuilt-{k}" for k in range(1, 5)), limit=3.0)  # blocked behind a lock
    return runs


if n == 0:
    history.load = slow_load
else:
    wait_for("loaded")
history.append(folder, record)
(signals / f"appended-{n}").touch()
history.rebuild_parquet(folder)
(signals / f"rebuilt-{n}").touch()
"""


def test_case6_parquet_rebuild_keeps_runs_added_meanwhile(tmp_path):
    """Publish 0 reads the runs, then is slow; publishes 1-4 add theirs and rebuild meanwhile.
    Without the lock publish 0 wrote the table last, from its stale read (runs lost); with it,
    the others wait and the final table holds all five."""
    signals = tmp_path / "signals"
    signals.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, str(tmp_path / "h"), str(n), str(signals)],
            env=clean_env(),
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(5)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert sorted(pd.read_parquet(tmp_path / "h" / "history.parquet")["run_id"]) == [
        f"{n:016x}" for n in range(5)
    ]


def test_fifos_and_links_in_the_history_are_named_never_waited_on(tmp_path):
    """A FIFO named like a run file, or as the history's lock, hung publish and acknowledge
    (the lock's open waited for a reader); a recipe folder linked elsewhere was a traceback."""
    results = tmp_path / "results"
    write_result(stage_result("smoke", TINY_RECIPE, night(0)), results / "x" / "smoke.json")
    name = stage_result("smoke", TINY_RECIPE, night(0)).recipe

    def publish_into(history: Path) -> subprocess.CompletedProcess[str]:
        outputs = ["--tables", str(history / "t"), "--junit", str(history / "j.xml")]
        outputs += ["--verdict", str(history / "v.json"), "--no-plots"]
        return run_cli(
            "publish", str(results), "--history", str(history / "h"), *outputs, timeout=60
        )

    fifo_run = tmp_path / "fifo-run"
    (fifo_run / "h" / name).mkdir(parents=True)
    os.mkfifo(fifo_run / "h" / name / "20260101T000000Z-abc.json")
    proc = publish_into(fifo_run)
    assert proc.returncode == 0, proc.stderr
    assert "skipping history file" in proc.stderr and "not a regular file" in proc.stderr
    proc = run_cli("acknowledge", name, "abc", "--history", str(fifo_run / "h"), timeout=60)
    assert proc.returncode == 2 and "20260101T000000Z-abc.json: not a regular file" in proc.stderr

    fifo_lock = tmp_path / "fifo-lock"
    (fifo_lock / "h").mkdir(parents=True)
    os.mkfifo(fifo_lock / "h" / ".lock")
    proc = publish_into(fifo_lock)
    assert proc.returncode == 2 and ".lock: not a regular file" in proc.stderr, proc.stderr

    linked = tmp_path / "linked"
    (linked / "h").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (linked / "h" / name).symlink_to(tmp_path / "elsewhere")
    proc = publish_into(linked)
    assert proc.returncode == 2 and "would lie outside" in proc.stderr, proc.stderr
    assert not any((tmp_path / "elsewhere").iterdir())
    for proc in (publish_into(fifo_lock), publish_into(linked)):
        assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
