"""Import the parts of megatron-core the torch_dist writer uses, not the whole library.

``import megatron.core`` runs ``megatron/core/__init__.py``, which imports nearly everything
(``tensor_parallel``, ``transformer``, the fusions, and through them ``torch._dynamo`` and
``torch._inductor``): about 2.8 s on top of torch on this project's machine, where the modules
the writer needs (``parallel_state``, ``dist_checkpointing``) take 0.8 s.

:func:`enter_megatron_core` registers the ``megatron.core`` package without running its
``__init__``, so that importing a submodule loads only that submodule and what it imports. The
package stays complete for anyone else in the process: the first time a name is asked of it
that is neither defined nor a submodule (one of the names its ``__init__`` defines), the
``__init__`` runs then (PEP 562 module ``__getattr__``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

PACKAGE = "megatron.core"


def enter_megatron_core() -> None:
    """Make ``import megatron.core.X`` load X alone; a no-op once the package is imported."""
    if PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return  # not installed: the real import reports it
    package = importlib.util.module_from_spec(spec)

    def complete(name: str) -> object:
        if not name.startswith("__") and importlib.util.find_spec(f"{PACKAGE}.{name}"):
            return importlib.import_module(f"{PACKAGE}.{name}")
        _run_init(package)
        return package.__dict__[name] if name in package.__dict__ else _missing(name)

    package.__getattr__ = complete  # type: ignore[method-assign]
    sys.modules[PACKAGE] = package
    try:
        # parallel_state first: megatron.core.utils and parallel_state import each other, and
        # the package __init__ imports them in this order
        importlib.import_module(f"{PACKAGE}.parallel_state")
    except BaseException:
        sys.modules.pop(PACKAGE, None)
        raise


def _run_init(package: ModuleType) -> None:
    """Run the package's own ``__init__`` into the module already registered."""
    package.__dict__.pop("__getattr__", None)
    spec = package.__spec__
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(package)


def _missing(name: str) -> object:
    raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}")
