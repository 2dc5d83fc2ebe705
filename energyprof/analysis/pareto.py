"""The energy-time Pareto front, over runs or over the windows of a sweep. Pure.

A sweep inside one process (batch size x power limit, one window per configuration, as in Zeus's
study) names its windows `NAME:LABEL`, e.g. `config:bs=128,pl=250`: every window of NAME is one
point (its time, its energy), labelled by what follows the colon. A window named plain NAME is a
point too, labelled by its index. Across runs the points of each run are put side by side.
"""

from __future__ import annotations

from typing import Sequence


from ..record import record
from ..facts.profile import Window
from .kinds import is_discarded, split_name, sweep_names  # noqa: F401 - their home is kinds.py; named here as before


def front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For each (time, energy): True when no other point is at least as fast and as frugal and
    better in one (the front is never empty; equal points are all on it)."""
    return [not any(t2 <= t and e2 <= e and (t2 < t or e2 < e) for t2, e2 in points) for t, e in points]


@record(frozen=True)
class WindowPoint:
    """One window of a sweep: which run, its label, its time and energy, whether it is on the front."""

    run: int
    label: str
    time_s: float
    energy_j: float
    pareto: bool = False


def program_energy(w: Window) -> float | None:
    """The program's part of a window, None in files written before windows held it."""
    return w.program_total_j


def window_points(runs: Sequence[Sequence[Window]], name: str, run_labels: Sequence[str] | None = None) -> \
        tuple[list[WindowPoint], bool]:
    """Every window of `name` in every run as a point, the front marked; and whether the energies are
    the program's (True) or, because some window predates that figure, all the machine's (False).
    With several runs a label says its run (`[1] bs=128`)."""
    chosen = [(i, w) for i, ws in enumerate(runs) for w in ws if split_name(w.name)[0] == name and not is_discarded(w)]
    program = all(program_energy(w) is not None for _, w in chosen)
    several = len(runs) > 1
    raw = []
    for i, w in chosen:
        label = split_name(w.name)[1] or (f"#{w.index}" if w.index is not None else "")
        prefix = f"[{i}]" if run_labels is None else run_labels[i]
        energy = program_energy(w) if program else None
        raw.append((i, f"{prefix} {label}".strip() if several else label,
                    w.time_s, energy if energy is not None else w.total_j))
    flags = front([(t, e) for _, _, t, e in raw])
    return [WindowPoint(i, label, t, e, f) for (i, label, t, e), f in zip(raw, flags)], program
