"""The writer's end of a process's stream: records (`wire`) appended to a spool file.

Lines are buffered and written with one `os.write` per flush, so a SIGKILL loses only the
unflushed tail (the reader ignores a half-written last line). Past SEGMENT_BYTES the stream
goes on in `PATH.1`, `PATH.2`, ... (a NEXT record names the next file), so the reader can
delete what it has read and a long run holds little on disk.

The descriptor is checked (device and inode) before every write: a program that closes
every descriptor (daemonising code, `os.closerange`) and opens a file of its own under the
same number must never find energyprof's records in it, nor its file closed by energyprof.

A write that fails (a full disk, a quota) keeps the records that later lines refer to
(frames, stacks, windows, notes) and drops the samples; the first write that succeeds again
says which span was lost (a LOST record), so the profile states it rather than going quiet.
"""

from __future__ import annotations

import _thread
import os
import time

# Names, never `from . import wire`: in a package the bootstrap loaded by path, a fromlist
# on the package goes through __import__, which would import energyprof's top package.
from .wire import (
    KBUSY, KCOUNTS, KCYCLE, KNAMES, LOST, SAMPLE, TICK, UNIT_SAMPLE, encode, frame as frame_line, lost as lost_line,
    next_file, sample as sample_line, unit_sample as unit_sample_line,
    stack as stack_line, threads as threads_line, tick as tick_line
)

SEGMENT_BYTES = 8 << 20
# A failed write drops these (a LOST record then says the span): samples, and the kernel capture's per-cycle
# figures; definitions that later lines refer to (frames, stacks, kernel paths) are kept and written again.
_DROPPABLE = (TICK + "\t", SAMPLE + "\t", UNIT_SAMPLE + "\t", KCYCLE + "\t", KBUSY + "\t", KNAMES + "\t", KCOUNTS + "\t")
_perf = time.perf_counter_ns


class Spool:
    """A sink for `Sampler`: frames, stacks, ticks and samples, plus the agent's events."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = self._open(path)
        self._file = self._identity(self.fd)
        self.buf: list[str] = []
        self._lock = _thread.allocate_lock()  # events come from program threads
        self._size = 0
        self._segment = 0
        self._held: list[str] = []  # what a failed write could not drop
        self._lost = 0  # bytes of samples dropped since the last good write
        self._lost_from = self._lost_to = 0
        self._ok_at = _perf()
        self._cut = False  # a failed write left a partial line
        self._written = 0

    @staticmethod
    def _open(path: str) -> int:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)

    @staticmethod
    def _identity(fd: int) -> tuple[int, int]:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino

    def _ours(self) -> bool:
        try:
            return self._identity(self.fd) == self._file
        except OSError:
            return False

    # -- the sink ------------------------------------------------------------------------
    def write(self, line: str) -> None:
        self.buf.append(line)

    def frame(self, fid: int, fr: tuple[str, str, int]) -> None:
        self.buf.append(frame_line(fid, fr[0], fr[1], fr[2]))

    def stack(self, sid: int, fids: tuple[int, ...]) -> None:
        self.buf.append(stack_line(sid, fids))

    def tick(self, t0: int, t1: int, proc: int, own: int, rss: int) -> None:
        self.buf.append(tick_line(t0, t1, proc, own, rss))

    def sample(self, sid: int, cpu: int, main: bool, unit: int = -1) -> None:
        self.buf.append(sample_line(sid, cpu, main) if unit < 0 else unit_sample_line(sid, cpu, main, unit))

    def threads(self, sid: int, count: int) -> None:
        self.buf.append(threads_line(sid, count))

    def event(self, line: str) -> None:
        with self._lock:
            self.buf.append(line)

    # -- writing -------------------------------------------------------------------------
    def flush(self) -> None:
        with self._lock:
            buf, self.buf = self.buf, []
        if self._held:
            buf, self._held = self._held + buf, []
        if not buf and not self._lost:
            return  # (a loss is said as soon as a write goes through, even with nothing new)
        lines = [lost_line(self._lost_from, self._lost_to, self._lost)] if self._lost else []
        if self._cut:
            lines.insert(0, "\n")  # ends the line a failed write cut (a damaged line: a definition in it comes again)
        lines += buf
        data = encode("".join(lines))
        self._written = 0
        try:
            self._size += len(data)
            if self._size >= SEGMENT_BYTES:
                name = f"{self.path}.{self._segment + 1}"
                fd = self._open(name)
                try:
                    self._write(data + encode(next_file(os.path.basename(name))))
                except OSError:
                    os.close(fd)  # the next flush tries the move again
                    raise
                self._close()
                self._segment += 1
                self.fd, self._size, self._file = fd, 0, self._identity(fd)
            else:
                self._write(data)
        except OSError:
            self._failed(lines, data)
            return
        self._lost = 0
        self._cut = False
        self._ok_at = _perf()

    def _failed(self, lines: list[str], data: bytes) -> None:
        """Keep what later records refer to, count the samples dropped, note the span lost.

        A definition cut in the middle is written again whole: frames and stacks carry their
        own ids, so the reader's later copy replaces the damaged one."""
        done = data[:self._written]
        self._size += len(done) - len(data)
        if done:  # else the line cut before (if any) is still open
            self._cut = not done.endswith(b"\n")
        rest = lines[done.count(b"\n"):]
        if not self._lost:
            self._lost_from = self._ok_at
        self._lost_to = _perf()
        self._held = [ln for ln in rest if not ln.startswith(_DROPPABLE) and not ln.startswith(LOST + "\t")
                      and ln != "\n"]
        self._lost += max(1, len(data) - len(done) - sum(len(ln) for ln in self._held))

    def _write(self, data: bytes) -> None:
        if not self._ours():
            # The program closed our descriptor: never write into whatever file now has its
            # number; open the spool again by name.
            current = f"{self.path}.{self._segment}" if self._segment else self.path
            self.fd = self._open(current)
            self._file = self._identity(self.fd)
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            self._written += n
            view = view[n:]

    def _close(self) -> None:
        if self._ours():
            try:
                os.close(self.fd)
            except OSError:
                pass

    def close(self) -> None:
        self._close()
