"""A package's names resolved on first use (PEP 562 ``__getattr__``), so that importing
one submodule does not load its siblings (``tether.algos``, ``tether.diagnostics``: the
run config nests their ``settings`` without torch)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_exports(
    package: str, exports: Mapping[str, tuple[str, ...]]
) -> tuple[list[str], Callable[[str], object]]:
    """``(__all__, __getattr__)`` of ``package``, whose ``exports`` map each submodule to
    the names it provides; a name is imported from its submodule when first asked for."""
    module_of = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str):
        if name in module_of:
            return getattr(importlib.import_module(f"{package}.{module_of[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return sorted(module_of), __getattr__
