"""`energyprof cache drop PATH` / `energyprof cache status PATH`: evict a dataset from the page cache, or
say how much of it is there, for cold- and warm-cache experiments without root's drop_caches."""

from __future__ import annotations

import os

from .common import PROG, Parser, UsageError


def build_cache_parser() -> Parser:
    p = Parser(prog=f"{PROG} cache", description="The page cache of a dataset: evict its files (posix_fadvise"
               " DONTNEED, no root needed for files you can open) or measure their residency (mincore).")
    p.add_argument("action", choices=("drop", "status"))
    p.add_argument("paths", nargs="+", metavar="PATH", help="a file or a folder (every file under it)")
    return p


def cache_cmd(argv: list[str]) -> int:
    from ..collect import pagecache

    ns = build_cache_parser().parse_args(argv)
    if not pagecache.supported():
        raise UsageError("the page cache can be asked and evicted on Linux only")
    for path in ns.paths:
        if not os.path.exists(path):
            raise UsageError(f"{path}: no such file or folder")
    for path in ns.paths:
        if ns.action == "drop":
            done = pagecache.drop(path)
            if done["failed"]:
                print(f"{PROG}: {done['failed']} file(s) under {path} could not be opened or advised")
        r = pagecache.residency(path)
        frac = "no data" if r["fraction"] is None else f"{r['fraction'] * 100:.1f}%"
        how = "measured" if r["sampled"] is None else r["method"]
        verb = "after the drop, " if ns.action == "drop" else ""
        print(f"{path}: {verb}{frac} of {r['bytes'] / 1e6:.1f} MB in the page cache ({r['files']} files, {how})")
    return 0
