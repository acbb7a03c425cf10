"""A response body's gzip and deflate codings undone a bounded piece at a time.

httpx inflates each network read whole: a few hundred bytes of a body compressed twice
become hundreds of megabytes in one chunk before any limit of the SSE decoder applies. The
client asks for ``identity``; the body of a server that compresses anyway is inflated here,
every step at most ``piece`` bytes, so that the decoder's limits bound what is held. Other
codings (``br``, ``zstd``) are left to httpx.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from typing import Final

__all__ = ["Inflater", "inflatable"]

_WBITS: Final = {
    "gzip": 16 + zlib.MAX_WBITS,
    "x-gzip": 16 + zlib.MAX_WBITS,
    "deflate": zlib.MAX_WBITS,
}


_HEADER: Final = 2
"""Bytes of zlib's header, which tell a wrapped deflate stream from a raw one."""


def inflatable(codings: Sequence[str]) -> bool:
    """Whether every coding of ``codings`` (lower case, as applied) is one inflated here."""
    return all(coding in _WBITS for coding in codings)


class _Stage:
    """One coding undone."""

    __slots__ = ("decompressor", "head", "undecided")

    def __init__(self, coding: str) -> None:
        self.decompressor = zlib.decompressobj(_WBITS[coding])
        # "deflate" comes with zlib's wrapper or without it (raw), and is read either way,
        # as httpx reads it: its first two bytes, the wrapper's header, tell which.
        self.undecided = coding == "deflate"
        self.head = b""

    def feed(self, data: bytes, piece: int) -> Iterator[bytes]:
        if self.undecided:
            data = self.head + data
            if len(data) < _HEADER:
                self.head = data
                return
            self._decide(data)
        decompressor = self.decompressor
        while not decompressor.eof:
            out = decompressor.decompress(data, piece)
            if out:
                yield out
            data = decompressor.unconsumed_tail
            if not data and len(out) < piece:
                return

    def flush(self, piece: int) -> Iterator[bytes]:
        if self.undecided and self.head:
            head = self.head
            self._decide(head)
            yield from self.feed(head, piece)
        rest = self.decompressor.flush()
        for start in range(0, len(rest), piece):
            yield rest[start : start + piece]

    def _decide(self, data: bytes) -> None:
        self.undecided = False
        self.head = b""
        try:
            self.decompressor.copy().decompress(data, 1)
        except zlib.error:
            self.decompressor = zlib.decompressobj(-zlib.MAX_WBITS)


class Inflater:
    """Undoes ``codings`` (as the ``Content-Encoding`` header lists them, in the order
    applied) in pieces of at most ``piece`` bytes. Raises :class:`zlib.error` on a body
    that is not what its codings say."""

    __slots__ = ("_piece", "_stages")

    def __init__(self, codings: Sequence[str], piece: int) -> None:
        # The last coding applied is the first undone.
        self._stages = [_Stage(coding) for coding in reversed(codings)]
        self._piece = piece

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The decoded pieces of the next raw bytes."""
        return self._through(0, data)

    def flush(self) -> Iterator[bytes]:
        """What the end of the body completes."""
        for i, stage in enumerate(self._stages):
            for out in stage.flush(self._piece):
                yield from self._through(i + 1, out)

    def _through(self, i: int, data: bytes) -> Iterator[bytes]:
        if i == len(self._stages):
            yield data
            return
        for out in self._stages[i].feed(data, self._piece):
            yield from self._through(i + 1, out)
