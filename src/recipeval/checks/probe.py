"""Live probe of the machine it runs on: GPUs (torch, plus nvidia-ml-py or amdsmi where
installed), driver / CUDA / ROCm versions, trainer package versions, and the Ray cluster at
RAY_ADDRESS. Standard library only at import time, so it runs standalone anywhere:

    python -m recipeval.checks.probe        # prints the probe as JSON
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata, util
from pathlib import Path
from typing import Any

PACKAGES = (
    "torch",
    "sglang",
    "megatron-core",
    "ray",
    "transformers",
    "transformer-engine",
    "flash-attn",
    "triton",
    "nvidia-ml-py",
    "amdsmi",
)
RAY_TIMEOUT_S = 30


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _git_revision(path: Path) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None


def packages() -> dict[str, str | None]:
    found = {name: _version(name) for name in PACKAGES}
    miles_dir = os.environ.get("MILES_DIR")
    if miles_dir and Path(miles_dir, "train.py").is_file():
        found["miles"] = f"checkout {miles_dir} @ {_git_revision(Path(miles_dir)) or 'unknown'}"
    elif util.find_spec("miles") is not None:
        found["miles"] = _version("miles") or "importable"
    else:
        found["miles"] = None
    return found


def torch_gpus() -> dict[str, Any]:
    try:
        import torch
    except ImportError as err:
        return {"error": f"torch not importable: {err}"}
    info: dict[str, Any] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "devices": [],
    }
    try:
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    except RuntimeError as err:
        info["error"] = f"torch.cuda: {err}"
        return info
    for index in range(count):
        props = torch.cuda.get_device_properties(index)
        info["devices"].append(
            {
                "index": index,
                "name": props.name,
                "memory_bytes": int(props.total_memory),
                "arch": props.gcnArchName if info["hip"] else f"sm_{props.major}{props.minor}",
            }
        )
    return info


def nvml_info() -> dict[str, Any] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
            devices = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                name = pynvml.nvmlDeviceGetName(handle)
                devices.append(
                    {
                        "index": index,
                        "name": name.decode() if isinstance(name, bytes) else name,
                        "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                    }
                )
            driver = pynvml.nvmlSystemGetDriverVersion()
            return {
                "driver": driver.decode() if isinstance(driver, bytes) else driver,
                "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}",
                "devices": devices,
            }
        finally:
            pynvml.nvmlShutdown()
    except Exception as err:  # noqa: BLE001 - NVML errors vary by driver; report, never crash
        return {"error": f"nvml: {type(err).__name__}: {err}"}


def amdsmi_info() -> dict[str, Any] | None:
    try:
        import amdsmi
    except ImportError:
        return None
    try:
        amdsmi.amdsmi_init()
        try:
            devices = []
            driver = None
            for index, handle in enumerate(amdsmi.amdsmi_get_processor_handles()):
                asic = amdsmi.amdsmi_get_gpu_asic_info(handle)
                memory = amdsmi.amdsmi_get_gpu_memory_total(handle, amdsmi.AmdSmiMemoryType.VRAM)
                devices.append(
                    {"index": index, "name": asic.get("market_name"), "memory_bytes": int(memory)}
                )
                driver = driver or amdsmi.amdsmi_get_gpu_driver_info(handle).get("driver_version")
            return {"driver": driver, "devices": devices}
        finally:
            amdsmi.amdsmi_shut_down()
    except Exception as err:  # noqa: BLE001 - amdsmi errors vary by driver; report, never crash
        return {"error": f"amdsmi: {type(err).__name__}: {err}"}


def rocm_version() -> str | None:
    for path in (Path("/opt/rocm/.info/version"), Path("/opt/rocm/.info/version-dev")):
        if path.is_file():
            return path.read_text().strip()
    return None


_RAY_SCRIPT = """
import json, sys
address = sys.argv[1]
if address.startswith(("http://", "https://")):
    from ray.job_submission import JobSubmissionClient
    client = JobSubmissionClient(address)
    print(json.dumps({"reachable": True, "ray_version": client.get_version(), "gpus": None,
                      "note": "Jobs API address: GPU count not available from it"}))
else:
    import ray
    ray.init(address=address, logging_level="ERROR", log_to_driver=False, include_dashboard=False)
    resources = ray.cluster_resources()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    print(json.dumps({"reachable": True, "ray_version": ray.__version__,
                      "gpus": resources.get("GPU", 0), "nodes": len(nodes)}))
    ray.shutdown()
"""


def _tcp_target(address: str) -> tuple[str, int] | None:
    """host and port of a Ray address (host:port, ray://host:port, http://host:port)."""
    rest = address.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def ray_cluster(address: str | None) -> dict[str, Any] | None:
    """Connect to the cluster at `address` in a child process (ray.init may hang on a dead
    address; the child is killed at the timeout). A closed port is reported at once."""
    if not address:
        return None
    target = _tcp_target(address)
    if target is not None:
        try:
            socket.create_connection(target, timeout=5).close()
        except OSError as err:
            return {
                "address": address,
                "reachable": False,
                "error": f"cannot connect to {target[0]}:{target[1]}: {err.strerror or err}",
            }
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _RAY_SCRIPT, address],
            capture_output=True,
            text=True,
            timeout=RAY_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {
            "address": address,
            "reachable": False,
            "error": f"no answer within {RAY_TIMEOUT_S} s",
        }
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return {"address": address, **json.loads(lines[-1])}
    errors = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return {
        "address": address,
        "reachable": False,
        "error": (errors[-1] if errors else f"exit {proc.returncode}")[:300],
    }


def machine_platform(gpus: dict[str, Any]) -> str:
    if gpus.get("devices"):
        return "rocm" if gpus.get("hip") else "cuda"
    return "cpu"


def probe(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Everything the live checks compare with a recipe, as plain JSON-able data."""
    environ = dict(os.environ) if environ is None else environ
    gpus = torch_gpus()
    return {
        "host": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "platform": machine_platform(gpus),
        "torch": gpus,
        "nvml": nvml_info(),
        "amdsmi": amdsmi_info(),
        "rocm": rocm_version(),
        "packages": packages(),
        "ray": ray_cluster(environ.get("RAY_ADDRESS")),
    }


def main() -> int:
    print(json.dumps(probe(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
