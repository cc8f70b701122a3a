"""The local runner: streaming, exit status, crash, timeout without orphans, stop on request,
recipe values that look like shell."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from runner_jobs import (
    BRIEF_HOSTILE,
    CRASH,
    ECHO_ARGV,
    HANG_WITH_CHILDREN,
    HOSTILE_WORDS,
    WAIT_FOR_STOP,
    python_launch,
)

from recipeval.recipe.facts import gpu_model_matches
from recipeval.runners.base import node_gpus
from recipeval.runners.local import LocalRunner
from recipeval.runners.ray import entrypoint_command


def test_streams_lines_passes_env_and_quotes_nothing_through_a_shell(tmp_path):
    words = [w.format(marker=tmp_path / "pwned") for w in HOSTILE_WORDS]
    lines: list[str] = []
    result = LocalRunner().run(
        python_launch(ECHO_ARGV, *words, env={"RECIPEVAL_TEST_VALUE": "from-recipe"}),
        lines.append,
        timeout=60,
    )
    assert result.exit_code == 0 and result.ok and not result.timed_out
    argv_line = next(line for line in lines if line.startswith("ARGV "))
    assert json.loads(argv_line[5:]) == words
    assert "ENV from-recipe" in lines
    assert not list(tmp_path.glob("pwned*"))
    # what the launcher exports for the submit itself (miles: no_proxy) reaches the process too
    launch = replace(python_launch(ECHO_ARGV), client_env={"RECIPEVAL_TEST_VALUE": "for-submit"})
    lines.clear()
    assert LocalRunner().run(launch, lines.append, timeout=60).ok
    assert "ENV for-submit" in lines


def test_entrypoint_for_ray_jobs_quotes_every_word():
    words = ["python3", "train.py", "--note", *BRIEF_HOSTILE, *HOSTILE_WORDS]
    assert shlex.split(entrypoint_command(words)) == words


def test_crash_reports_exit_status_and_keeps_output():
    lines: list[str] = []
    result = LocalRunner().run(python_launch(CRASH), lines.append, timeout=60)
    assert result.exit_code == 1 and not result.ok
    assert "exited with status 1" in result.detail
    assert any("planted crash" in line for line in lines)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out


def test_timeout_kills_the_whole_tree_including_escaped_and_sigterm_deaf_children():
    before: dict[str, list[int]] = {}

    def on_line(line: str) -> None:
        if line.startswith("PIDS "):
            pids = [int(p) for p in line.split()[1:]]
            before["job"] = pids
            before["tree"] = [p.pid for p in _tree(pids[0])]

    result = LocalRunner(grace=1.0).run(python_launch(HANG_WITH_CHILDREN), on_line, timeout=4)
    assert result.timed_out and result.exit_code is None
    assert "timed out after 4 s" in result.detail
    leader, child, _escaped, deaf = before["job"]
    # the listing taken while it ran: the leader's tree (the escaped one left the session)
    assert {leader, child, deaf} <= set(before["tree"])
    assert _alive(before["job"] + before["tree"]) == []


def test_stop_on_request():
    stop = threading.Event()

    def on_line(line: str) -> None:
        if line == "ready":
            stop.set()

    result = LocalRunner(grace=2.0).run(
        python_launch(WAIT_FOR_STOP), on_line, timeout=60, stop=stop
    )
    assert result.stopped and not result.timed_out and result.exit_code is None
    assert result.wall_s < 30


def test_missing_program_is_a_runner_error():
    from recipeval.runners import RunnerError

    launch = python_launch("")
    launch.argv[0] = "/nonexistent/python"
    with pytest.raises(RunnerError, match="cannot start"):
        LocalRunner().run(launch, lambda line: None)


def test_sigterm_to_the_stage_stops_its_local_job(tmp_path):
    """Snakemake or Slurm cancelling a stage sends SIGTERM to recipeval; the job lives in its
    own session, so recipeval must take it down on the way out."""
    script = tmp_path / "stage.py"
    pid_file = tmp_path / "job.pid"
    script.write_text(
        "import sys\n"
        "from runner_jobs import python_launch\n"
        "from recipeval.runners.base import stop_job_on_termination\n"
        "from recipeval.runners.local import LocalRunner\n"
        "program = 'import os, time\\nopen(%r, \"w\").write(str(os.getpid()))\\ntime.sleep(600)\\n'\n"
        "with stop_job_on_termination():\n"
        "    LocalRunner(grace=1.0).run(python_launch(program % sys.argv[1]), print, timeout=300)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        ),
    }
    stage = subprocess.Popen(
        [sys.executable, str(script), str(pid_file)], env=env, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    job_pid = int(pid_file.read_text())
    assert _alive([job_pid]) == [job_pid]
    stage.send_signal(signal.SIGTERM)
    assert stage.wait(timeout=60) == 128 + signal.SIGTERM
    assert "got SIGTERM, stopping the job" in stage.stderr.read()
    assert _alive([job_pid]) == []


# Excerpt of libdrm's amdgpu.ids (device, revision, marketing name).
AMDGPU_IDS = "# comment\n74A1,\t00,\tAMD Instinct MI300X\n75A0,\t00,\tAMD Instinct MI350X\n"
MI350X_BOARD = ("0x75a0", "AMD Instinct MI350 OAM")  # PCI device id; the board's product name
MI300X_BOARD = ("0x74a1", "AMD Instinct MI300X OAM")


def driver_files(
    root: Path, nvidia: list[str], amd: list[tuple[str, str]], amdgpu_ids: str | None = None
) -> Path:
    """The files the GPU drivers put under /proc and /sys, as NVIDIA's and amdgpu's write them
    (an AMD card: its PCI device id and board product name, revision 0), beside a server's BMC
    display (ASPEED, which amdgpu does not drive); `amdgpu_ids`: libdrm's table, if installed."""
    for i, model in enumerate(nvidia):
        info = root / f"proc/driver/nvidia/gpus/0000:{i:02x}:00.0/information"
        info.parent.mkdir(parents=True)
        info.write_text(f"Model: \t\t {model}\nIRQ:   \t\t 62\nGPU UUID: \t GPU-{i}\n")
    bmc = root / "sys/class/drm/card0/device"
    bmc.mkdir(parents=True)
    (bmc / "vendor").write_text("0x1a03\n")
    for i, (device_id, product_name) in enumerate(amd, start=1):
        device = root / f"sys/class/drm/card{i}/device"
        device.mkdir(parents=True)
        for name, value in [
            ("vendor", "0x1002"),
            ("device", device_id),
            ("revision", "0x00"),
            ("product_name", product_name),
        ]:
            (device / name).write_text(value + "\n")
    if amdgpu_ids is not None:
        (root / "usr/share/libdrm").mkdir(parents=True)
        (root / "usr/share/libdrm/amdgpu.ids").write_text(amdgpu_ids)
    return root


def test_node_gpus_names_each_model_the_drivers_list_once(tmp_path):
    h100 = "NVIDIA H100 80GB HBM3"
    assert node_gpus(driver_files(tmp_path / "nv", [h100] * 8, [])) == h100
    mixed = driver_files(tmp_path / "mixed", [h100, "NVIDIA H200"], [])
    assert node_gpus(mixed) == "NVIDIA H100 80GB HBM3, NVIDIA H200"
    assert node_gpus(tmp_path / "none") is None


def test_an_amd_card_is_named_by_its_marketing_name_not_its_board_name(tmp_path):
    """The board's product_name can drop the model's suffix (an MI350X's board reads "AMD
    Instinct MI350 OAM"), so a night on the recipe's own card read as a night on another one."""
    mi350x = driver_files(tmp_path / "ids", [], [MI350X_BOARD] * 8, AMDGPU_IDS)
    assert node_gpus(mi350x) == "AMD Instinct MI350X"
    assert gpu_model_matches("MI350X", [node_gpus(mi350x)])
    # without libdrm's table the board name is what there is; a card the table lacks keeps it
    assert node_gpus(driver_files(tmp_path / "no-ids", [], [MI350X_BOARD])) == MI350X_BOARD[1]
    unknown = driver_files(tmp_path / "new", [], [("0x75b9", "AMD Instinct MI4 OAM")], AMDGPU_IDS)
    assert node_gpus(unknown) == "AMD Instinct MI4 OAM"
    both = driver_files(tmp_path / "both", [], [MI300X_BOARD, MI350X_BOARD], AMDGPU_IDS)
    assert node_gpus(both) == "AMD Instinct MI300X, AMD Instinct MI350X"
    assert node_gpus(driver_files(tmp_path / "bmc-only", [], [])) is None


def test_the_local_runner_says_which_card_its_job_ran_on(tmp_path, monkeypatch):
    # The job runs on this node: its cards are what the node's drivers list.
    root = driver_files(tmp_path, ["NVIDIA H200"], [])
    monkeypatch.setattr("recipeval.runners.base.node_gpus", lambda: node_gpus(root))
    assert LocalRunner().describe() == {"runner": "local", "gpu": "NVIDIA H200"}
