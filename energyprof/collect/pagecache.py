"""How much of a dataset is in the page cache (mincore, as vmtouch asks it), and evicting it (posix_fadvise).

Residency maps each file read-only and asks the kernel which of its pages are resident; nothing is
read, so asking does not warm the cache. Only a file's data is asked about: its allocated extents
(SEEK_DATA/SEEK_HOLE), a window of at most CHUNK bytes at a time, so the cost follows the data, never a
sparse file's apparent size (a 1 TiB file with 1 MiB written is 1 MiB of work). A hole holds no data
(reading it costs no I/O), so it is left out of the figures and said. A large tree costs one mmap per
file: past MAX_FILES files a fixed-seed sample of them is asked instead; the result says how many were
(`sampled`), and the tree's size comes from every file's stat (`bytes`), the sample's from mincore
(`sample_bytes`).
Eviction is POSIX_FADV_DONTNEED on every file: no root needed, but dirty pages (written, not yet on
disk) stay until written out, and a file system that ignores the advice (some network or overlay ones)
keeps its pages: the residency measured afterwards says what happened, and the drop counts the dirty
pages left (cachestat, Linux 6.5+; else the files written in the last dirty-expiry period).
Linux (and other systems with mincore) only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import random
import stat
import sys
import time
from typing import Any, Iterator

MAX_FILES = 2000  # past this many files, a sample of them is asked (about 10 ms per 1,000 small files)
PAGE = mmap.PAGESIZE
CHUNK = 1 << 30  # mincore asks about at most 1 GiB at a time: a 256 KiB vector, whatever the file's size
# --watch-cache PATH, handed to the program: energyprof.torch.track() measures it at each pass's start and end
WATCH_ENV = "ENERGYPROF_WATCH_CACHE"
MAP_FAILED = ctypes.c_void_p(-1).value
_RESIDENT = bytes(b & 1 for b in range(256))  # mincore's byte per page: bit 0 is "resident", the rest reserved
_CACHESTAT = {"x86_64": 451, "aarch64": 451, "riscv64": 451, "ppc64le": 451, "s390x": 451}  # one number everywhere


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [("nr_cache", ctypes.c_uint64), ("nr_dirty", ctypes.c_uint64), ("nr_writeback", ctypes.c_uint64),
                ("nr_evicted", ctypes.c_uint64), ("nr_recently_evicted", ctypes.c_uint64)]


def _libc() -> Any:
    lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    lib.mincore.restype = ctypes.c_int
    lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    lib.mmap.restype = ctypes.c_void_p
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.munmap.restype = ctypes.c_int
    lib.syscall.restype = ctypes.c_long
    return lib


def _walk(path: str) -> Iterator[tuple[str, os.stat_result]]:
    """(path, lstat) of every regular file under path (or path itself), sorted, symlinks not followed."""
    if os.path.isfile(path):
        yield path, os.stat(path)
        return
    for folder, dirs, names in os.walk(path):
        dirs.sort()
        for n in sorted(names):
            p = os.path.join(folder, n)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield p, st


def files_under(path: str) -> list[str]:
    """Regular files under path (or path itself), sorted, symlinks not followed."""
    return [p for p, _ in _walk(path)]


def data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """The file's allocated byte ranges [start, end), from SEEK_DATA/SEEK_HOLE; the whole file where the
    system cannot say (a file system without them answers with the whole file itself)."""
    seek_data = getattr(os, "SEEK_DATA", None)
    seek_hole = getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        yield 0, size
        return
    off = 0
    while off < size:
        try:
            start = os.lseek(fd, off, seek_data)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no data past off
                yield off, size
            return
        if start >= size:
            return
        try:
            end = min(os.lseek(fd, start, seek_hole), size)
        except OSError:
            end = size
        if end <= start:
            return
        yield start, end
        off = end


def _page_ranges(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """The data extents widened to whole pages, never overlapping (two extents may share a page)."""
    done = 0
    for start, end in data_extents(fd, size):
        first = max(start // PAGE * PAGE, done)
        last = (end + PAGE - 1) // PAGE * PAGE
        if last > first:
            yield first, last
            done = last


def file_pages(path: str, lib: Any = None) -> tuple[int, int]:
    """(resident pages, data pages) of one file, holes left out; (0, 0) for an empty or unreadable file."""
    resident, pages, _ = _file_pages(path, lib or _libc())
    return resident, pages


def _file_pages(path: str, lib: Any) -> tuple[int, int, int]:
    """(resident pages, data pages, apparent pages) of one file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO swapped in never blocks
    except OSError:
        return 0, 0, 0
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return 0, 0, 0
        size = st.st_size
        resident = pages = 0
        vec = None
        for first, last in _page_ranges(fd, size):
            for off in range(first, last, CHUNK):
                length = min(CHUNK, last - off)
                n = length // PAGE
                if vec is None:
                    vec = (ctypes.c_ubyte * (min(CHUNK, last - first) // PAGE))()
                elif len(vec) < n:
                    vec = (ctypes.c_ubyte * n)()
                resident += _resident_in(lib, fd, off, length, vec)
                pages += n
        return resident, pages, (size + PAGE - 1) // PAGE
    finally:
        os.close(fd)


def _resident_in(lib: Any, fd: int, off: int, length: int, vec: Any) -> int:
    addr = lib.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, off)
    if addr in (None, MAP_FAILED):
        return 0
    try:
        if lib.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(length), vec) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return ctypes.string_at(vec, length // PAGE).translate(_RESIDENT).count(1)
    finally:
        lib.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(length))


def _data_bytes(st: os.stat_result) -> int:
    """A file's data from its stat, page-rounded as mincore counts it: the allocated blocks where they are
    fewer than the size (a sparse file), else the size (st_blocks also counts metadata on some systems)."""
    allocated = st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
    data = allocated if 0 < allocated < st.st_size else st.st_size
    return (data + PAGE - 1) // PAGE * PAGE


def residency(path: str, max_files: int = MAX_FILES, seed: int = 0) -> dict[str, Any]:
    """The fraction of the tree's data pages in the page cache, measured; sampled past max_files files.

    `bytes` is the tree's data (measured, or from every file's stat when sampled), `resident_bytes` the
    part of it cached (estimated from the sample's fraction when sampled); `sample_bytes` and
    `sample_resident_bytes` are what was asked; `hole_bytes` the holes of the files asked (left out)."""
    found = list(_walk(path))
    if len(found) <= max_files:
        asked = found
    else:
        asked = sorted(random.Random(seed).sample(found, max_files), key=lambda f: f[0])
    lib = _libc()
    resident = total = apparent = 0
    for f, _ in asked:
        r, n, a = _file_pages(f, lib)
        resident += r
        total += n
        apparent += a
    fraction = resident / total if total else None
    sampled = len(asked) < len(found)
    tree = sum(_data_bytes(st) for _, st in found) if sampled else total * PAGE
    return {"path": path, "fraction": fraction,
            "resident_bytes": (fraction or 0.0) * tree if sampled else resident * PAGE, "bytes": tree,
            "sample_bytes": total * PAGE, "sample_resident_bytes": resident * PAGE,
            "hole_bytes": (apparent - total) * PAGE, "files": len(found), "sampled": len(asked) if sampled else None,
            "method": "measured" if not sampled else f"estimated from {len(asked)} of {len(found)} files"}


def _cachestat(lib: Any, fd: int) -> _Cachestat | None:
    """The kernel's count of a file's cached, dirty and writeback pages (Linux 6.5+); None where it has none."""
    number = _CACHESTAT.get(os.uname().machine) if sys.platform.startswith("linux") else None
    if number is None:
        return None
    rng, out = _CachestatRange(0, 0), _Cachestat()  # len 0: to the file's end
    if lib.syscall(ctypes.c_long(number), ctypes.c_int(fd), ctypes.byref(rng), ctypes.byref(out), ctypes.c_uint(0)) != 0:
        return None
    return out


def dirty_expire_s() -> float:
    """How long the kernel lets a dirty page wait before writing it out (vm.dirty_expire_centisecs)."""
    try:
        with open("/proc/sys/vm/dirty_expire_centisecs") as f:
            return int(f.read().split()[0]) / 100.0
    except (OSError, ValueError, IndexError):
        return 30.0


def meminfo_dirty_bytes() -> int | None:
    """The machine's dirty and writeback pages (/proc/meminfo Dirty + Writeback), None where unreadable."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return sum(int(fields[k].split()[0]) * 1024 for k in ("Dirty", "Writeback") if k in fields)
    except (OSError, ValueError):
        return None


def drop(path: str, use_cachestat: bool = True) -> dict[str, Any]:
    """POSIX_FADV_DONTNEED on every file under path.

    Returns {files, failed, dirty_files, dirty_bytes, recent_files, how}: dirty_* are the files (and bytes)
    whose dirty or writeback pages stayed cached after the advice (`how` "cachestat", measured), or, where
    the kernel cannot say per file (`how` "mtime"), None, and recent_files counts the files written within
    the dirty-expiry period while the machine held dirty pages: those are likely the ones that stayed."""
    lib = _libc()
    done = failed = dirty_files = dirty_pages = recent = 0
    measured = use_cachestat
    now = time.time()
    window = dirty_expire_s() + 5.0  # the flusher wakes every 5 s (dirty_writeback_centisecs) to write expired pages
    for f, st in _walk(path):
        try:
            fd = os.open(f, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            failed += 1
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done += 1
            if now - st.st_mtime <= window:
                recent += 1
            if measured:
                cs = _cachestat(lib, fd)
                if cs is None:
                    measured = False
                elif cs.nr_dirty or cs.nr_writeback:
                    dirty_files += 1
                    dirty_pages += cs.nr_dirty + cs.nr_writeback
        except OSError:
            failed += 1
        finally:
            os.close(fd)
    if not measured and recent:
        machine_dirty = meminfo_dirty_bytes()
        if machine_dirty == 0:
            recent = 0  # nothing on the machine is dirty: the recent files' pages are on disk
    return {"files": done, "failed": failed, "dirty_files": dirty_files if measured else None,
            "dirty_bytes": dirty_pages * PAGE if measured else None, "recent_files": recent,
            "how": "cachestat" if measured else "mtime"}


def supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "posix_fadvise")
