"""Bindings deliver the same events over different transports: SSE, WebSocket, NATS.

This package holds transports only; the stores that keep streams for resuming (Redis,
JetStream) are in :mod:`essessey.stores`. Each binding is a subpackage; those that need a
third-party library import it only when the binding is used, so the core keeps its two
dependencies.
"""

__all__: list[str] = []
