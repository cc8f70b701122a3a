"""Runs inside the recording subprocess (`python -I record_driver.py REQUEST.json`): imports a
miles launch script from a checkout and invokes its typer app with every process-starting
helper replaced by a recorder. Standard library only: it runs with the checkout on sys.path and
nothing of recipeval importable.

Nothing starts: miles' exec_command* helpers, subprocess, os.system/popen and socket
connections are all replaced. A helper called for its output (a node probe such as
`nvidia-smi topo -m`) gets the request's probe answer; the caller runs the app once per answer,
and what changes between the runs is known to come from a probe.

A third-party package the checkout imports gets a stand-in module when it is not installed
(httpx, ...), and always when it is a GPU or cluster runtime (torch, ray, megatron, ...): a
launch script imports those for their presence only, they take seconds to import, and a
recording must not depend on whether the recording machine has them. A stand-in used for a
value (truth, number, iteration) raises, naming the package, so a script that needs one fails
loudly.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import os
import socket
import subprocess
import sys
import types
from collections.abc import Sequence
from pathlib import Path

# The driver's exit status when the checkout or script cannot be recorded at all (its message
# is one line on stderr); any other failure is the script's own, shown with its traceback.
UNRECORDABLE_EXIT = 3


class Unrecordable(Exception):
    """A checkout or launch script this driver cannot record (not the script failing)."""


# Modules a command-building script needs for real; never replaced by a stand-in.
NEEDED = {"typer", "click", "miles", "miles_plugins"}
RUNTIMES = {
    "torch",
    "ray",
    "megatron",
    "sglang",
    "sgl_kernel",
    "transformers",
    "transformer_engine",
    "triton",
    "flash_attn",
    "deep_ep",
    "deep_gemm",
    "aiter",
    "mbridge",
    "vllm",
    "apex",
    "wandb",
}
HELPER_MODULES = (
    "miles.utils.external_utils.command_utils",
    "miles.utils.external_utils.exec_command",
    "miles.utils.misc",
)
THIS_FILE = __file__
SINGLE_NODE_HELPERS = ("exec_command", "exec_command_cpu", "exec_command_gpu")
MULTI_NODE_HELPERS = ("exec_command_multi_node", "exec_command_all_ray_node")


class Absent:
    """What a stand-in module hands out: callable, attribute-able and subscriptable (enough for
    decorators and annotations at import time); any use as a value raises."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Absent:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Absent(f"{self._name}.{attr}")

    def __call__(self, *args: object, **kwargs: object) -> Absent:
        return Absent(f"{self._name}()")

    def __getitem__(self, key: object) -> Absent:
        return Absent(f"{self._name}[]")

    def __or__(self, other: object) -> Absent:
        return self

    __ror__ = __or__

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)

    def _used(self, *args: object) -> None:
        raise RuntimeError(
            f"the launch script used {self._name} for a value while building its command, but "
            f"{self._name.split('.')[0]} is not installed for this python; install it or pass "
            "script arguments that avoid it"
        )

    __bool__ = __int__ = __float__ = __index__ = __iter__ = __len__ = _used  # type: ignore[assignment]


class StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """First on sys.meta_path; answers only for a third-party import written in the checkout
    (a library's own imports stay real)."""

    def __init__(self, checkout: Path) -> None:
        self.checkout = str(checkout)
        self.stood_in: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        top = fullname.split(".")[0]
        if top in NEEDED or top in sys.stdlib_module_names or not self._imported_by_checkout():
            return None
        real = top not in RUNTIMES and top not in self.stood_in
        if real and importlib.machinery.PathFinder.find_spec(fullname, path) is not None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def _imported_by_checkout(self) -> bool:
        frame = sys._getframe(1)
        while frame is not None:
            file = frame.f_code.co_filename
            if not file.startswith("<frozen") and file != THIS_FILE:
                return file.startswith(self.checkout + os.sep)
            frame = frame.f_back
        return False

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = Absent(spec.name).__getattr__  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        self.stood_in.add(module.__name__.split(".")[0])


class Recorder:
    def __init__(self) -> None:
        self.answer = "0"
        self.commands: list[dict[str, object]] = []
        self.probes: list[str] = []
        self.train_calls: list[dict[str, object]] = []

    def single(self, cmd: str, capture_output: bool = False) -> str | None:
        if capture_output:
            self.probes.append(cmd)
            return self.answer
        self.commands.append({"cmd": cmd})
        return None

    def multi(self, cmd: str, capture_output: bool = False, num_nodes: int | None = None) -> list:
        if capture_output:
            self.probes.append(cmd)
            return [self.answer]
        self.commands.append({"cmd": cmd, "num_nodes": num_nodes})
        return [None]

    def process(self, args: object, *rest: object, **kwargs: object) -> subprocess.CompletedProcess:
        """subprocess.* and os.system stand-in: recorded as a probe, nothing runs."""
        words = args if isinstance(args, str) else " ".join(str(a) for a in args)  # type: ignore[union-attr]
        self.probes.append(words)
        text = kwargs.get("text") or kwargs.get("universal_newlines") or kwargs.get("encoding")
        out = self.answer if text else self.answer.encode()
        return subprocess.CompletedProcess(args, 0, out, "" if text else b"")


def _no_network(*args: object, **kwargs: object) -> None:
    raise OSError("network access is disabled while recording a miles launch")


def _no_process(*args: object, **kwargs: object) -> None:
    raise OSError(f"starting a process is disabled while recording a miles launch: {args}")


class SealedPopen(subprocess.Popen):
    """Stays a class (libraries subclass Popen at import time); starting one raises."""

    def __init__(self, args: object, *rest: object, **kwargs: object) -> None:
        _no_process(args)


def _seal(recorder: Recorder) -> None:
    subprocess.run = recorder.process  # type: ignore[assignment]
    subprocess.check_output = lambda *a, **k: recorder.process(*a, **k).stdout  # type: ignore[assignment]
    subprocess.call = subprocess.check_call = lambda *a, **k: recorder.process(*a, **k).returncode  # type: ignore[assignment]
    subprocess.Popen = SealedPopen  # type: ignore[misc]
    os.system = lambda cmd: recorder.process(cmd).returncode  # type: ignore[assignment]
    for name in (
        "popen",
        "fork",
        "forkpty",
        "execv",
        "execve",
        "execvp",
        "execvpe",
        "execl",
        "execlp",
        "execle",
        "execlpe",
        "spawnv",
        "spawnve",
        "spawnvp",
        "spawnvpe",
        "posix_spawn",
        "posix_spawnp",
    ):
        if hasattr(os, name):
            setattr(os, name, _no_process)
    socket.create_connection = _no_network  # type: ignore[assignment]
    socket.socket.connect = _no_network  # type: ignore[assignment,method-assign]
    socket.socket.connect_ex = _no_network  # type: ignore[assignment,method-assign]


def _patch_helpers(recorder: Recorder) -> list[str]:
    patched = []
    for module_name in HELPER_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name in SINGLE_NODE_HELPERS + MULTI_NODE_HELPERS:
            if hasattr(module, name):
                setattr(
                    module, name, recorder.multi if name in MULTI_NODE_HELPERS else recorder.single
                )
                patched.append(f"{module_name}.{name}")
    return patched


def _watch_execute_train(recorder: Recorder) -> None:
    """Note which model type and train args the script hands miles' launcher, so the launch's
    model-shape words can be told from its training words."""
    module = importlib.import_module(HELPER_MODULES[0])
    original = getattr(module, "execute_train", None)
    if original is None:
        return

    def execute_train(*args: object, **kwargs: object) -> object:
        bound = inspect.signature(original).bind(*args, **kwargs)
        bound.apply_defaults()
        recorder.train_calls.append(
            {
                "megatron_model_type": bound.arguments.get("megatron_model_type"),
                "train_args": bound.arguments.get("train_args"),
            }
        )
        return original(*args, **kwargs)

    module.execute_train = execute_train


def _load_script(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"miles_launch_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise Unrecordable(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _typer_app(module: types.ModuleType) -> object:
    import typer

    apps = [v for v in vars(module).values() if isinstance(v, typer.Typer)]
    if not apps:
        raise Unrecordable(f"{module.__file__} defines no typer app")
    return getattr(module, "app", apps[0])


def main(request_path: str) -> int:
    request = json.loads(Path(request_path).read_text())
    miles_dir = Path(request["miles_dir"])
    sys.path.insert(0, str(miles_dir))
    finder = StandInFinder(miles_dir)
    sys.meta_path.insert(0, finder)
    recorder = Recorder()
    _seal(recorder)
    patched = _patch_helpers(recorder)
    if not patched:
        raise Unrecordable(
            f"no exec_command helper found in {', '.join(HELPER_MODULES)}: not a miles checkout "
            "whose launch scripts recipeval can record"
        )
    module = _load_script(miles_dir / request["script"])
    patched += _patch_helpers(recorder)
    _watch_execute_train(recorder)
    app = _typer_app(module)
    runs = []
    for answer in request["probe_answers"]:
        recorder.answer = answer
        recorder.commands, recorder.probes, recorder.train_calls = [], [], []
        app(args=list(request["args"]), prog_name=request["script"], standalone_mode=False)
        runs.append(
            {
                "answer": answer,
                "commands": recorder.commands,
                "probes": recorder.probes,
                "train_calls": recorder.train_calls,
            }
        )
    result = {"runs": runs, "stand_ins": sorted(finder.stood_in), "patched": sorted(set(patched))}
    Path(request["out"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1]))
    except Unrecordable as err:  # the checkout or script, not the launch: one line
        print(err, file=sys.stderr)
        sys.exit(UNRECORDABLE_EXIT)
