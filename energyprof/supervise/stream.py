"""Reading one process's spool as it grows (the records themselves are `agent/wire.py`'s)."""

from __future__ import annotations

import os

from ..agent import wire

unescape = wire.unesc


class StreamReader:
    """Reads the complete lines added to one process's spool since the last call, following
    it from file to file and deleting each file once read to its end."""

    def __init__(self, path: str) -> None:
        self.path = path  # the stream's first file: its name
        self._current = path
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._rest = b""
        self._next: str | None = None  # the file the stream moved on to, not opened yet
        self._said = False

    def read(self) -> list[list[str]]:
        out: list[list[str]] = []
        while True:
            if self._next is not None and not self._move_on(out):
                return out
            chunks = []
            while True:
                try:
                    b = os.read(self.fd, 1 << 20)
                except OSError:
                    break
                if not b:
                    break
                chunks.append(b)
            if not chunks:
                return out
            data = self._rest + b"".join(chunks)
            end = data.rfind(b"\n") + 1
            # what follows the last newline is a line still being written (or cut by a SIGKILL)
            records, self._rest = wire.decode(data[:end]), data[end:]
            if not (records and records[-1][0] == wire.NEXT and len(records[-1]) > 1):
                out.extend(records)
                return out
            out.extend(records[:-1])
            self._next = os.path.join(os.path.dirname(self._current), wire.unesc(records[-1][1]))

    def _move_on(self, out: list[list[str]]) -> bool:
        """Open the file the stream moved on to, and leave the one read to its end. One that
        cannot be opened now (too many open files) is tried again at the next read, and said
        once: before, the stream ended there for the rest of the run, without a word."""
        assert self._next is not None
        try:
            fd = os.open(self._next, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            if not self._said:
                self._said = True
                out.append([wire.NOTE, f"a process's stream could not be followed into its next file for a while"
                                       f" ({exc.strerror or exc}); it is tried again at each read until it opens"])
            return False
        self.close()
        try:
            os.unlink(self._current)
        except OSError:
            pass
        self.fd, self._current, self._rest, self._next = fd, self._next, b"", None
        return True

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
