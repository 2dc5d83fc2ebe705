"""How much of a dataset is in the page cache (mincore, as vmtouch asks it), and evicting it (posix_fadvise).

Residency maps each file read-only and asks the kernel which of its pages are resident; nothing is
read, so asking does not warm the cache. A large tree costs one mmap per file: past MAX_FILES files a
fixed-seed sample of them is asked instead, and the result says how many were (`sampled`).
Eviction is POSIX_FADV_DONTNEED on every file: no root needed, but dirty pages stay until written
out, and a file system that ignores the advice (some network or overlay ones) keeps its pages: the
residency measured afterwards says what happened. Linux (and other systems with mincore) only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import random
import sys
from typing import Any

MAX_FILES = 2000  # past this many files, a sample of them is asked (about 10 ms per 1,000 small files)
PAGE = mmap.PAGESIZE
# --watch-cache PATH, handed to the program: energyprof.torch.track() measures it at each pass's start and end
WATCH_ENV = "ENERGYPROF_WATCH_CACHE"
MAP_FAILED = ctypes.c_void_p(-1).value


def _libc() -> Any:
    lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    lib.mincore.restype = ctypes.c_int
    lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    lib.mmap.restype = ctypes.c_void_p
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.munmap.restype = ctypes.c_int
    return lib


def files_under(path: str) -> list[str]:
    """Regular files under path (or path itself), sorted, symlinks not followed."""
    if os.path.isfile(path):
        return [path]
    out: list[str] = []
    for folder, dirs, names in os.walk(path):
        dirs.sort()
        for n in sorted(names):
            p = os.path.join(folder, n)
            if os.path.isfile(p) and not os.path.islink(p):
                out.append(p)
    return out


def file_pages(path: str, lib: Any = None) -> tuple[int, int]:
    """(resident pages, pages) of one file; (0, 0) for an empty or unreadable file."""
    lib = lib or _libc()
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0, 0
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0, 0
        pages = (size + PAGE - 1) // PAGE
        addr = lib.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, MAP_FAILED):
            return 0, 0
        try:
            vec = (ctypes.c_ubyte * pages)()
            if lib.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
            return sum(v & 1 for v in vec), pages
        finally:
            lib.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
    finally:
        os.close(fd)


def residency(path: str, max_files: int = MAX_FILES, seed: int = 0) -> dict[str, Any]:
    """The fraction of the tree's pages in the page cache, measured; sampled past max_files files."""
    files = files_under(path)
    asked = files if len(files) <= max_files else sorted(random.Random(seed).sample(files, max_files))
    lib = _libc()
    resident = total = 0
    for f in asked:
        r, n = file_pages(f, lib)
        resident += r
        total += n
    return {"path": path, "fraction": resident / total if total else None, "resident_bytes": resident * PAGE,
            "bytes": total * PAGE, "files": len(files), "sampled": len(asked) if len(asked) < len(files) else None,
            "method": "measured" if len(asked) == len(files) else f"estimated from {len(asked)} of {len(files)} files"}


def drop(path: str) -> dict[str, int]:
    """POSIX_FADV_DONTNEED on every file under path: {files, failed}."""
    done = failed = 0
    for f in files_under(path):
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            failed += 1
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done += 1
        except OSError:
            failed += 1
        finally:
            os.close(fd)
    return {"files": done, "failed": failed}


def supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "posix_fadvise")
