"""Import one module of a large package without running the package's own __init__.

`megatron.core/__init__` imports all of megatron.core (models, optimizers, torch.compile'd
fusions: 5-7 s on a small machine) and `sglang/__init__` imports transformers and the frontend
language (10+ s); the validators env_check needs live in a few leaf modules. Registering the
package as a bare module (found by its real spec, __path__ set, __init__ not executed) lets the
import system load just the leaves and their true dependencies. The leaf code is the package's
own, unchanged.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType


def bare_packages(*names: str) -> None:
    """Register each package (outermost first) without executing its __init__, unless it is
    imported already."""
    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.submodule_search_locations is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.modules[name] = importlib.util.module_from_spec(spec)


def import_leaf(module: str, packages: tuple[str, ...]) -> ModuleType:
    """Import `module` with `packages` registered bare; fall back to the ordinary import (the
    package __init__ included) if a future version needs what its __init__ sets up."""
    added = [name for name in packages if name not in sys.modules]
    bare_packages(*packages)
    try:
        return importlib.import_module(module)
    except (ImportError, AttributeError):
        for name in [m for m in sys.modules if any(m == p or m.startswith(p + ".") for p in added)]:
            del sys.modules[name]
        return importlib.import_module(module)
