"""Public names say where to import them from: the one rule for ``__module__``.

A class or function re-exported by a public module (the top-level package, or a binding's
package) gets that module as its ``__module__``, as httpx does for its own, so its
``repr``, a traceback and ``help()`` name the import path the docs give
(``essessey.StreamHub``), never the private module behind it
(``essessey.bindings.sse._response``).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["import_lazily", "set_public_module"]


def set_public_module(module: str, namespace: Mapping[str, Any], names: Iterable[str]) -> None:
    """Set ``__module__`` to ``module`` on each class and function of ``names`` in
    ``namespace`` that essessey defines (type aliases and constants have none to set)."""
    for name in names:
        value = namespace[name]
        if (isinstance(value, type) or inspect.isfunction(value)) and value.__module__.startswith(
            "essessey"
        ):
            value.__module__ = module


def import_lazily(package: str, modules: Mapping[str, str], name: str) -> Any:
    """``package.name`` imported on first use from the private module ``modules[name]``
    (for a package's ``__getattr__``: names that need an extra's library, imported only
    when asked for), its ``__module__`` set as for the package's other names."""
    module = modules.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    namespace = vars(importlib.import_module(f"{package}.{module}"))
    set_public_module(package, namespace, [name])
    return namespace[name]
