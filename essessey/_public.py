"""Public names say where to import them from: the one rule for ``__module__``.

A class or function re-exported by a public module (the top-level package, or a binding's
package) gets that module as its ``__module__``, as httpx does for its own, so its
``repr``, a traceback and ``help()`` name the import path the docs give
(``essessey.StreamHub``), never the private module behind it
(``essessey.bindings.sse._response``).

A package whose names need an extra's library (Starlette for the ASGI bindings) imports
them on first use, from its ``__getattr__`` (:func:`import_lazily`). They are in its
``__all__`` all the same, and its ``__dir__`` (:func:`public_dir`) lists them, so
``help()``, ``dir()``, an editor's completion and the public-API tests see the whole
surface; ``from package import *`` imports them, and so needs the extra.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["import_lazily", "missing_extra", "public_dir", "set_public_module"]


def set_public_module(module: str, namespace: Mapping[str, Any], names: Iterable[str]) -> None:
    """Set ``__module__`` to ``module`` on each class and function of ``names`` in
    ``namespace`` that essessey defines (type aliases and constants have none to set).
    Names not in ``namespace`` (a package's lazy ones, not imported yet) are skipped:
    :func:`import_lazily` sets theirs when they are."""
    for name in names:
        value = namespace.get(name)
        if (isinstance(value, type) or inspect.isfunction(value)) and value.__module__.startswith(
            "essessey"
        ):
            value.__module__ = module


def import_lazily(package: str, modules: Mapping[str, str], name: str, *, extra: str) -> Any:
    """``package.name`` imported on first use from the private module ``modules[name]``
    (for a package's ``__getattr__``: names that need the library of the extra ``extra``,
    imported only when asked for).

    The first use imports every module of ``modules`` (they need the same extra, and one
    imports another: the SSE routes build the SSE response) and puts all their names in
    the package, each ``__module__`` set as for the package's other names: a name reached
    through another (the response a route returns) says its public path too, and the
    next use finds it in the package. AttributeError for a name the package does not
    have; ModuleNotFoundError naming the missing library and the extra that installs it.
    """
    if name not in modules:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    target = sys.modules[package]
    for module in sorted(set(modules.values())):
        try:
            namespace = vars(importlib.import_module(f"{package}.{module}"))
        except ModuleNotFoundError as exc:
            error = missing_extra(f"{package}.{name}", exc, extra=extra)
            if error is exc:
                raise
            raise error from exc
        names = [lazy for lazy, home in modules.items() if home == module]
        set_public_module(package, namespace, names)
        for lazy in names:
            setattr(target, lazy, namespace[lazy])
    return getattr(target, name)


def missing_extra(what: str, exc: ModuleNotFoundError, *, extra: str) -> ModuleNotFoundError:
    """The error for ``what`` (a module or name of essessey's) whose import failed with
    ``exc``: one naming the missing library and the extra that installs it, or ``exc``
    itself when what is missing is essessey's own (a bug, not an extra)."""
    missing = (exc.name or "essessey").partition(".")[0]
    if missing == "essessey":
        return exc
    return ModuleNotFoundError(
        f"{what} needs {missing}, which is not installed: pip install 'essessey[{extra}]'",
        name=missing,
    )


def public_dir(namespace: Mapping[str, Any], names: Iterable[str]) -> list[str]:
    """What a package's ``__dir__`` lists: its public ``names`` (its ``__all__``, lazy
    ones included, imported or not) and its dunder attributes (``__doc__``,
    ``__version__``, ...); not its private modules or the helpers it imported."""
    return sorted({*names, *(key for key in namespace if key.startswith("__"))})
