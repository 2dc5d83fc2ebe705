"""memory=exact: the bytes still allocated at a process's end, put on the stacks that allocated them. Pure."""

from __future__ import annotations

from collections.abc import Collection

from .recording import StackTable
from .tallies import StackTally


def place_allocations(stats: dict[int, StackTally], table: StackTable, sid_proc: dict[int, int], n: int, proc: int,
                      items: list[tuple[int | None, int]], sids: Collection[int] | None = None) -> int:
    """memory=exact: bytes still allocated at the end, per function (frame id), put on
    the stack of `proc` where that function ran most. Returns the bytes with no place
    (lines of functions never sampled). `sids`: the stacks `proc` reported, where it shares
    them with other processes (a pool's workers run the same stacks under one node)."""
    leaf: dict[int, tuple[int, int]] = {}  # fid -> (samples, sid) of the busiest stack ending in it
    inner: dict[int, tuple[int, int, int]] = {}  # fid -> (samples, sid, depth) of the busiest holding it
    stacks = table.stacks
    for sid, st in stats.items():
        frames = stacks[sid]
        if (sid_proc.get(sid) != proc if sids is None else sid not in sids) or not frames:
            continue
        if st.samples > leaf.get(frames[-1], (-1, 0))[0]:
            leaf[frames[-1]] = (st.samples, sid)
        for depth, fid in enumerate(frames[:-1]):
            if st.samples > inner.get(fid, (-1, 0, 0))[0]:
                inner[fid] = (st.samples, sid, depth)
    best: dict[int, int] = {fid: sid for fid, (_, sid) in leaf.items()}
    unplaced = 0
    for fid, size in items:
        if fid is None or (fid not in best and fid not in inner):
            unplaced += size
            continue
        sid = best.get(fid)
        if sid is None:
            _, holder, depth = inner[fid]
            sid = best[fid] = table.stack_id(stacks[holder][:depth + 1])
        st = stats.get(sid)
        if st is None:
            st = stats[sid] = StackTally(share=[0.0] * n, all=[0.0] * n)
            sid_proc[sid] = proc
        st.alloc_bytes += size
    return unplaced
