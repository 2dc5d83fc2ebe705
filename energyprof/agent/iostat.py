"""I/O counters at one moment: a process's /proc/PID/io and the disks' lines of /proc/diskstats.

Read by the collector at each tick (collect/io.py) and, at each window's edges, inside the profiled
program (agent/supervised.py, drive/profiler.py), so a window's bytes are the counters' differences
at its own edges, not figures interpolated between ticks. Linux only; elsewhere nothing is read.
Standard library only: this module is loaded inside the profiled program, on its first window.
"""

from __future__ import annotations

import os

PROC_FIELDS = ("rchar", "wchar", "syscr", "syscw", "read_bytes", "write_bytes")
# /proc/diskstats columns after major, minor, name (Documentation/admin-guide/iostats.rst)
DISK_FIELDS = ("reads", "read_sectors", "writes", "write_sectors", "busy_ms")
DISK_COLUMNS = (0, 2, 4, 6, 9)
_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


def read_bytes(path: str) -> bytes | None:
    """A /proc file's whole text: one open, reads to its end, close (no descriptor is kept: a program
    that closes every descriptor it did not open must find none of energyprof's). None on any error."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError:
        return None
    try:
        chunks = []
        while True:  # /proc's files fill a read to its size: a short one is the end (no second call)
            chunk = os.read(fd, 1 << 16)
            chunks.append(chunk)
            if len(chunk) < 1 << 16:
                return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


_KEYS = [k.encode() + b":" for k in PROC_FIELDS]


def parse_proc_io(text: bytes | None) -> tuple[int, ...] | None:
    """PROC_FIELDS from /proc/PID/io's text, in that order (a field it lacks: 0); None when it holds none."""
    if not text:
        return None
    parts = text.split()
    if parts[0:12:2] == _KEYS:  # the kernel's own order: one split, no dictionary (a window's edge pays it)
        try:
            return tuple(map(int, parts[1:12:2]))
        except ValueError:
            return None
    values = {}
    for line in text.split(b"\n"):
        key, _, value = line.partition(b":")
        values[key.decode("ascii", "replace")] = value
    if not any(k in values for k in PROC_FIELDS):
        return None
    try:
        return tuple(int(values.get(k, 0)) for k in PROC_FIELDS)
    except ValueError:
        return None


def parse_diskstats(text: bytes | None, names: frozenset[str] | set[str] | None = None) -> dict[str, tuple[int, ...]]:
    """DISK_FIELDS per device named in /proc/diskstats (only `names`, when given); a line that is too
    short or not numbers is left out."""
    out: dict[str, tuple[int, ...]] = {}
    if not text:
        return out
    if names is not None and len(names) <= 8:  # a few disks: found by name, not every line split
        for name in names:
            bname = name.encode()
            key = b" " + bname + b" "
            at = text.find(key)
            while at >= 0:
                begin = text.rfind(b"\n", 0, at) + 1
                stop = text.find(b"\n", at)
                parts = text[begin:stop if stop >= 0 else len(text)].split()
                if len(parts) >= 14 and parts[2] == bname:  # the name's own column, not a match further on
                    try:
                        out[name] = tuple(int(parts[3 + c]) for c in DISK_COLUMNS)
                    except ValueError:
                        pass
                    break
                at = text.find(key, at + 1)
        return out
    for line in text.split(b"\n"):
        parts = line.split()
        if len(parts) < 14:
            continue
        name = parts[2].decode("utf-8", "replace")
        if names is not None and name not in names:
            continue
        try:
            out[name] = tuple(int(parts[3 + c]) for c in DISK_COLUMNS)
        except ValueError:
            continue
    return out


def reading(disks: frozenset[str], pid: int | str = "self",
            proc_root: str = "/proc") -> tuple[tuple[int, ...] | None, dict[str, tuple[int, ...]]]:
    """The process's counters and the named disks' at this moment (the disks read right after)."""
    proc = parse_proc_io(read_bytes(f"{proc_root}/{pid}/io"))
    stats = parse_diskstats(read_bytes(f"{proc_root}/diskstats"), disks) if disks else {}
    return proc, stats
