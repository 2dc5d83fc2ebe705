"""CPU that energyprof burns on the program's own threads (the kernel capture's reduction), charged to energyprof.

The work says how much it burnt (`charge_own`) on which thread; each sampler takes that off the
thread's CPU at its next ticks (`OwnCharge`) and adds it to energyprof's own figure, so it leaves
the program's samples for `[energyprof]`.
"""

from __future__ import annotations

import _thread
import os

_charged = [0]  # CPU ns energyprof burnt on the program's threads (the kernel capture's reduction): its own
# The same, by the kernel id of the thread that burnt it (cumulative): a sampler takes each charge off
# that thread's CPU, not off the main thread's (a capture stepped on a training thread while the main
# thread waits in `join` burnt nothing there to take it from).
_charged_by: dict[int, int] = {}


def charge_own(ns: int) -> None:
    """Count `ns` of CPU, burnt on the calling program thread for energyprof, as energyprof's own: the
    samplers take it off that thread's CPU (at the next tick, or the next ones that hold enough of it)
    and add it to their own, so it leaves the program's figure for `[energyprof]`."""
    nid = _thread.get_native_id()
    _charged_by[nid] = _charged_by.get(nid, 0) + ns
    _charged[0] += ns


def _forget_after_fork() -> None:
    _charged[0] = 0  # the parent's work charged to energyprof is the parent's, not this child's
    _charged_by.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


class OwnCharge:
    """The sampler's side of the charges (the attributes are the sampler's, set in its `__init__`)."""

    native_id: int | None
    _charges_seen: dict[int, int]
    _owed: dict[int, int]
    _taken: int
    _charged_in: int
    _charged_seen: int

    def _forget_charges(self, departed: list[tuple[int, str, int]]) -> None:
        """An ended thread's charges, all read, are forgotten: a server that starts a thread per request
        would otherwise pile up one entry per thread id, copied at every tick that charges. Kept where
        the id charged again since it was read (a new thread reusing it): read at the next tick."""
        seen = self._charges_seen
        for nid, _name, _cpu in departed:
            if nid in seen and _charged_by.get(nid) == seen[nid]:
                _charged_by.pop(nid, None)
                del seen[nid]

    def _take_charges(self, deltas: dict[int, int], nids: dict[int, int], departed: list[tuple[int, str, int]],
                      native: int) -> tuple[int, list[tuple[int, str, int]]]:
        """Take the CPU charged to energyprof (`charge_own`) off the thread that burnt it: a thread with its
        own clock here loses it from its delta, the main thread (and a `_thread` thread, whose CPU is the
        main thread's here) from `native`; the tick's own figure holds the charge as it is read.

        A charge comes after the work, which may have spanned ticks that already gave that CPU to the
        thread's samples (they cannot be taken back): what a tick's CPU cannot cover stays owed and is
        taken from the same thread's next CPU, never more than it burns. Taken off another thread, or
        dropped at zero, it was counted twice: in energyprof's figure and in the program's samples. What
        a thread still owes as it ends, or at the end of the run, stays counted twice (the charge says
        how much, not when: the work's own ticks would need it as it runs). Edits `deltas` in place."""
        owed = self._owed
        seen = self._charges_seen
        self._charged_seen = _charged[0]  # read first: a charge made from here on is read again next tick
        now = dict(_charged_by)  # one copy (atomic)
        for nid, total in now.items():
            new = total - seen.get(nid, 0)
            if new > 0 and nid != self.native_id:  # the sampler's own thread: its clock holds it already
                owed[nid] = owed.get(nid, 0) + new
                self._charged_in += new
        self._charges_seen = now
        taken = 0
        if owed:
            for ident, nid in nids.items():
                debt = owed.get(nid)
                if debt and ident in deltas:
                    take = min(debt, max(0, deltas[ident]))
                    deltas[ident] -= take
                    taken += take
                    owed[nid] = debt - take
            if departed:
                kept = []
                for nid, name, cpu in departed:
                    take = min(owed.pop(nid, 0), max(0, cpu))
                    taken += take
                    kept.append((nid, name, cpu - take))
                departed = kept
            clocked = set(nids.values())
            for nid in [n for n in owed if n not in clocked]:
                if native <= 0:
                    break
                take = min(owed[nid], native)  # the main thread's, or a thread with no clock here
                native -= take
                taken += take
                owed[nid] -= take
            for nid in [n for n, debt in owed.items() if debt <= 0]:
                del owed[nid]
        self._taken += taken
        return native, departed
