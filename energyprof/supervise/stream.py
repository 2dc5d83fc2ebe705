"""The spool's wire format, reader side (the writer is `stacks.sampler.Spool`).

One append-only file per process, tab-separated text lines, strings escaped (backslash,
tab, newline):

    H pid ppid t_ns forked rank local_rank label command   header, first line
    F fid function file line                               a new frame (local id)
    K sid fid,fid,...                                      a new stack (local id)
    T t0 t1 process_cpu_ns own_cpu_ns rss_bytes alloc      one sampler tick ...
    s sid cpu_ns main                                      ... and one line per thread
    W b|e t_ns name index                                  a window begins / ends
    A function file line bytes                             memory=exact: bytes still allocated at the end
    E t_ns text                                            the program's uncaught exception
    N text                                                 a note for the profile
    G t_ns                                                 this process uses CUDA (its GPU energy share)
    Z t_ns                                                 the process ended its stream
    R name                                                 the stream goes on in this file (same folder)

Times are `time.perf_counter_ns()` (CLOCK_MONOTONIC, one clock for every process).
"""

from __future__ import annotations

import os

_ESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}


def unescape(s: str) -> str:
    if "\\" not in s:
        return s
    out = []
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            out.append(_ESCAPES.get(s[i + 1], s[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


class StreamReader:
    """Reads the complete lines added to one process's spool since the last call, following
    it from file to file and deleting each file once read to its end."""

    def __init__(self, path: str) -> None:
        self.path = path  # the stream's first file: its name
        self._current = path
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._rest = b""

    def read(self) -> list[list[str]]:
        out: list[list[str]] = []
        while True:
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
            lines = data.split(b"\n")
            self._rest = lines.pop()  # a line still being written (or cut by a SIGKILL)
            records = [ln.decode("utf-8", "surrogateescape").split("\t") for ln in lines if ln]
            if not (records and records[-1][0] == "R" and len(records[-1]) > 1):
                out.extend(records)
                return out
            out.extend(records[:-1])
            nxt = os.path.join(os.path.dirname(self._current), records[-1][1])
            try:
                fd = os.open(nxt, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                return out
            self.close()
            try:
                os.unlink(self._current)
            except OSError:
                pass
            self.fd, self._current, self._rest = fd, nxt, b""

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
