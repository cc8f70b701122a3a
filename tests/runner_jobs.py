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
# A job that pins one actor to each node (STRICT_SPREAD) and says where each one ran.
SPREAD_ACTORS = """\
import json, os, ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
ray.init()
group = placement_group([{"GPU": 1}, {"GPU": 1}], strategy="STRICT_SPREAD")
ray.get(group.ready(), timeout=120)
@ray.remote(num_gpus=1, num_cpus=0)
class Where:
    def where(self):
        return {"node_id": ray.get_runtime_context().get_node_id(),
                "slurm_node": os.environ.get("SLURMD_NODENAME")}
actors = [Where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, i)).remote()
          for i in range(2)]
print("ACTORS " + json.dumps(ray.get([a.where.remote() for a in actors])), flush=True)
"""

WAIT_FOR_STOP = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"


def python_launch(program: str, *args: str, env: dict[str, str] | None = None) -> Launch:
    argv = [sys.executable, "-c", program, *args]
    env = dict(env or {})
    return Launch(
        argv=argv,
        env=env,
        entrypoint=argv,
        runtime_env={"env_vars": env},
        resources=Resources(1, 0),
        recipe_sha256="0" * 64,
        engine="reference",
        stage="smoke",
    )


def miles_like_program(
    rollouts: int,
    crash_after: int | None = None,
    hang_after: int | None = None,
    ppo_kl0: float = 0.0,
    print_env: str | None = None,
) -> str:
    """A program that logs `rollouts` rollouts in miles' format, then exits 0; or raises after
    `crash_after` rollouts; or hangs after `hang_after`; optionally prints an env var."""
    return (
        "import os, sys, time\n"
        "def log(msg):\n"
        "    stamp = time.strftime('%Y-%m-%d %H:%M:%S') + '.%03d' % (time.time() % 1 * 1000)\n"
        "    print(f'[{stamp} fake] train.py:1 - {msg}', flush=True)\n"
        + (f"print('env says', os.environ.get({print_env!r}), flush=True)\n" if print_env else "")
        + f"for i in range({rollouts}):\n"
        + (
            f"    if i == {crash_after}:\n        raise RuntimeError('NCCL error: planted crash at rollout ' + str(i))\n"
            if crash_after is not None
            else ""
        )
        + (
            f"    if i == {hang_after}:\n        time.sleep(600)\n"
            if hang_after is not None
            else ""
        )
        + "    log(f\"perf {i}: {{'perf/rollout_time': 0.01, 'rollout/raw_reward': 0.5}}\")\n"
        + f"    kl = {ppo_kl0!r} if i == 0 else 0.001\n"
        + "    log(f\"step {i}: {{'train/loss': 0.1, 'train/grad_norm': 0.5, 'train/ppo_kl': {kl}, "
        "'train/pg_clipfrac': 0.0, 'train/train_rollout_logprob_abs_diff': 0.01}}\")\n"
        + "    log(f\"perf {i}: {{'perf/actor_train_time': 0.02, 'perf/step_time': 0.03}}\")\n"
    )
