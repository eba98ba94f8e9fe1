"""A response body read within a size cap: raw and decoded bytes both count, and gzip or deflate is decompressed
with a bound on each step's output, so a decompression bomb stops at the cap instead of filling the memory."""

from __future__ import annotations

import zlib

from core.constants import WEB_READ_CHUNK_BYTES


class CappedBody:
    """The body as it streams in, decompressed here with a bound on each step's output, so neither the bytes read nor
    the bytes decoded ever pass `cap` (+1) in memory: a decompression bomb stops at the cap."""

    CODINGS = frozenset({"identity", "gzip", "x-gzip", "deflate"})

    def __init__(self, coding: str, cap: int) -> None:
        """`coding` is one of CODINGS."""
        self._cap = cap
        self._read = 0
        self._size = 0
        self._parts: list[bytes] = []
        wbits = zlib.MAX_WBITS | 16 if coding in ("gzip", "x-gzip") else zlib.MAX_WBITS
        self._inflate = None if coding == "identity" else zlib.decompressobj(wbits)

    def feed(self, chunk: bytes) -> bool:
        """Take the next raw chunk; False once the body (raw or decoded) is over the cap."""
        self._read += len(chunk)
        if self._read > self._cap:
            return False
        if self._inflate is None:
            return self._keep(chunk)
        data = chunk
        while data:
            step = min(WEB_READ_CHUNK_BYTES, self._cap - self._size + 1)  # small steps: no large transient copy
            if not self._keep(self._inflate.decompress(data, step)):
                return False
            data = self._inflate.unconsumed_tail
        return True

    def finish(self) -> bool:
        """The end of the body: what the decompressor still holds; False if that passes the cap."""
        return self._inflate is None or self._keep(self._inflate.flush(self._cap - self._size + 1))

    def data(self) -> bytes:
        """The decoded body."""
        return b"".join(self._parts)

    def _keep(self, out: bytes) -> bool:
        """Keep decoded bytes; False if they pass the cap."""
        self._size += len(out)
        if self._size > self._cap:
            self._parts.clear()
            return False
        self._parts.append(out)
        return True
