"""The budget of the fuzz tests (tests/test_fuzz.py), read from the environment.

No conftest is involved: the fuzz module applies :func:`fuzz` to each target itself.

- ``ESSESSEY_FUZZ_EXAMPLES``: Hypothesis examples per fuzz target (default
  :data:`DEFAULT_EXAMPLES`, small enough for CI). A target with a ``weight`` runs that
  fraction of it (the real-server target sends many frames per example). A long run:
  ``ESSESSEY_FUZZ_EXAMPLES=20000 pytest tests/test_fuzz.py -q``.
- ``ESSESSEY_FUZZ_SEED``: the seed to replay. By default each session draws a fresh one,
  so CI explores new inputs on every run; a failure names the seed (and the example
  count, which changes what is generated) so it can be replayed exactly.

The example database is off: a fuzz run must not depend on what an earlier run found on
the same machine, and the seed is what makes a failure reproducible.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Callable
from typing import Any, Final, TypeVar

from hypothesis import HealthCheck, seed, settings

__all__ = ["DEFAULT_EXAMPLES", "EXAMPLES", "SEED", "examples", "fuzz"]

DEFAULT_EXAMPLES: Final = 60
"""Examples per target when ``ESSESSEY_FUZZ_EXAMPLES`` is not set."""


def _read_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, not {raw!r}") from None


EXAMPLES: Final = max(1, _read_int("ESSESSEY_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))
SEED: Final = _read_int("ESSESSEY_FUZZ_SEED", random.SystemRandom().randrange(2**32))

_F = TypeVar("_F", bound=Callable[..., Any])


def examples(weight: float = 1.0) -> int:
    """The examples a target of this weight runs (at least one)."""
    return max(1, round(EXAMPLES * weight))


def fuzz(weight: float = 1.0) -> Callable[[_F], _F]:
    """Apply the fuzz budget and seed to a ``@given`` test; name the seed on failure."""

    def decorate(test: _F) -> _F:
        configured = settings(
            max_examples=examples(weight),
            deadline=None,
            database=None,
            print_blob=True,
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
                HealthCheck.filter_too_much,
                HealthCheck.large_base_example,
            ],
        )(seed(SEED)(test))

        @functools.wraps(configured)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return configured(*args, **kwargs)
            except Exception as exc:
                exc.add_note(
                    f"fuzz seed {SEED}: replay with ESSESSEY_FUZZ_SEED={SEED} "
                    f"ESSESSEY_FUZZ_EXAMPLES={EXAMPLES}"
                )
                raise

        return run  # type: ignore[return-value]

    return decorate
