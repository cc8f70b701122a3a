"""Small jobs the runner tests launch: python -c programs that print, crash, hang, or spawn
children that try to outlive them."""

from __future__ import annotations

import sys

from recipeval.engines.launch import Launch, Resources

# Shaped like the classic injections, but harmless if a shell ever ran them: each would
# create a marker file, which the tests look for.
HOSTILE_WORDS = [
    '"; touch {marker}1 #',
    "$(touch {marker}2)",
    "`touch {marker}3`",
    "'; touch {marker}4; '",
    "a b\tc\nd",
]
# The values a reviewer named; only quoted and round-tripped, never executed.
BRIEF_HOSTILE = ['"; rm -rf / #', "$(reboot)"]

ECHO_ARGV = "import json, os, sys; print('ARGV ' + json.dumps(sys.argv[1:]), flush=True); print('ENV ' + os.environ.get('RECIPEVAL_TEST_VALUE', '-'), flush=True)"
CRASH = (
    "import sys\n"
    "print(\"[2026-01-01 00:00:00.000 t] x.py:1 - perf 0: {'perf/rollout_time': 1.0}\", flush=True)\n"
    "raise RuntimeError('planted crash in the middle of the run')\n"
)
HANG_WITH_CHILDREN = (
    "import os, signal, subprocess, sys, time\n"
    "sleeper = [sys.executable, '-c', 'import time; time.sleep(600)']\n"
    "stubborn = [sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)']\n"
    "child = subprocess.Popen(sleeper)\n"
    "escaped = subprocess.Popen(sleeper, start_new_session=True)\n"
    "deaf = subprocess.Popen(stubborn)\n"
    "time.sleep(0.5)\n"
    "print('PIDS', os.getpid(), child.pid, escaped.pid, deaf.pid, flush=True)\n"
    "time.sleep(600)\n"
)
WAIT_FOR_STOP = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"


def python_launch(program: str, *args: str, env: dict[str, str] | None = None) -> Launch:
    argv = [sys.executable, "-c", program, *args]
    env = dict(env or {})
    return Launch(
        argv=argv, env=env, entrypoint=argv, runtime_env={"env_vars": env},
        resources=Resources(1, 0), recipe_sha256="0" * 64, engine="reference", stage="smoke",
    )
