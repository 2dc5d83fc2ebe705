"""`energyprof cache drop PATH` / `energyprof cache status PATH`: evict a dataset from the page cache, or
say how much of it is there, for cold- and warm-cache experiments without root's drop_caches."""

from __future__ import annotations

import os
from typing import Any

from .common import PROG, Parser, UsageError


def build_cache_parser() -> Parser:
    p = Parser(prog=f"{PROG} cache", description="The page cache of a dataset: evict its files (posix_fadvise"
               " DONTNEED, no root needed for files you can open) or measure their residency (mincore)."
               " Dirty pages (written, not yet on disk) cannot be evicted: run sync first.")
    p.add_argument("action", choices=("drop", "status"))
    p.add_argument("paths", nargs="+", metavar="PATH", help="a file or a folder (every file under it)")
    return p


def size(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def residency_line(path: str, r: dict[str, Any], after_drop: bool) -> str:
    """One line: the share cached, of how much, and how it was found (measured, or from a sample, said)."""
    verb = "after the drop, " if after_drop else ""
    holes = f"; holes of {size(r['hole_bytes'])} hold no data and are not counted" if r.get("hole_bytes") else ""
    if r["fraction"] is None:
        return f"{path}: {verb}no data to cache ({r['files']:,} files{holes})"
    frac = f"{r['fraction'] * 100:.1f}%"
    if r["sampled"] is None:
        return f"{path}: {verb}{frac} of {size(r['bytes'])} in the page cache ({r['files']:,} files, measured{holes})"
    return (f"{path}: {verb}{frac} in the page cache, estimated from a sample: {r['sampled']:,} of {r['files']:,} files"
            f" sampled, {size(r['sample_bytes'])} of {size(r['bytes'])} (the folder's size from every file's stat;"
            f" about {size(r['resident_bytes'])} of it cached){holes}")


def dirty_line(path: str, done: dict[str, Any], r: dict[str, Any]) -> str | None:
    """Why files stayed cached after the drop, when dirty pages are the likely reason: they are evicted only
    once written out."""
    if not r["fraction"]:
        return None
    if done["how"] == "cachestat":
        if not done["dirty_files"]:
            return None
        return (f"{path}: {done['dirty_files']:,} file(s) kept {size(done['dirty_bytes'])} of dirty pages in the page"
                f" cache (written, not yet on disk: they cannot be dropped); run sync first, then drop again")
    if not done["recent_files"]:
        return None
    from ..collect.pagecache import dirty_expire_s

    return (f"{path}: {done['recent_files']:,} file(s) were written in the last {dirty_expire_s() + 5:.0f} s while the"
            f" machine held dirty pages, which stay cached until written out; run sync first, then drop again")


def cache_cmd(argv: list[str]) -> int:
    from ..collect import pagecache

    ns = build_cache_parser().parse_args(argv)
    if not pagecache.supported():
        raise UsageError("the page cache can be asked and evicted on Linux only")
    for path in ns.paths:
        if not os.path.exists(path):
            raise UsageError(f"{path}: no such file or folder")
    for path in ns.paths:
        done = None
        if ns.action == "drop":
            done = pagecache.drop(path)
            if done["failed"]:
                print(f"{PROG}: {done['failed']} file(s) under {path} could not be opened or advised")
        r = pagecache.residency(path)
        print(residency_line(path, r, done is not None))
        hint = dirty_line(path, done, r) if done is not None else None
        if hint:
            print(hint)
    return 0
