"""What every feed does between the collector's readings and the ledger: hold ticks, then
interpolate the clock.

A sensor reading becomes a `Tick` only once the samples of the span before it are in; its
CPU figures are the program's clocks as its sampler read them, interpolated to the reading's
time (the collector reads the clocks at other moments). The in-process Profiler's feed holds
a reading until its one sampler has read past it; the supervised run's feed until every live
stream has. Both keep one `Clock` per sampler and one `HeldTicks` of readings.

Pure: no I/O, no clock of its own; every time is handed in (perf_counter_ns).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

#: A reading waits no longer than this for a sampler to read past it (a C call holding the GIL).
MAX_HOLD_NS = 2_000_000_000

T = TypeVar("T")


class Clock:
    """One sampler's readings of its process's clocks: points (t, counters..., levels...).

    Counters (CPU ns) are interpolated linearly between the two points around a time, and held
    flat after the last; levels (RSS) are not interpolated: a level is the one last read.
    Before the first point the clock reads `before` (None: flat at the first point).
    """

    def __init__(self, counters: int, levels: int = 0, before: tuple[int, ...] | None = None) -> None:
        self.counters = counters
        self.levels = levels
        self.before = before
        self.points: deque[tuple[int, ...]] = deque()

    def add(self, t: int, *values: int) -> None:
        if len(values) != self.counters + self.levels:
            raise ValueError(f"a clock point holds {self.counters + self.levels} values, not {len(values)}")
        self.points.append((t, *values))

    def __len__(self) -> int:
        return len(self.points)

    @property
    def last(self) -> tuple[int, ...] | None:
        """The newest point (t, values...), or None before the first."""
        return self.points[-1] if self.points else None

    @property
    def last_t(self) -> int | None:
        return self.points[-1][0] if self.points else None

    def at(self, t: int) -> tuple[int, ...]:
        """The clock's values at `t`; raises LookupError on a clock with no point yet."""
        pts = self.points
        if not pts:
            raise LookupError("a clock with no reading has no value")
        a = pts[0]
        if t < a[0] and self.before is not None:
            return self.before
        b = None
        for point in pts:
            if point[0] > t:
                b = point
                break
            a = point
        if b is None or t <= a[0]:
            return a[1:]
        f = (t - a[0]) / (b[0] - a[0])
        n = self.counters
        counted = tuple(int(a[1 + k] + f * (b[1 + k] - a[1 + k])) for k in range(n))
        return counted + a[1 + n:]

    def forget_before(self, t: int) -> None:
        """Drop the points no time at or after `t` needs: all but the last at or before it."""
        pts = self.points
        while len(pts) >= 2 and pts[1][0] <= t:
            pts.popleft()


class HeldTicks(Generic[T]):
    """Readings waiting for the samples of the span before them.

    A reading is released once its time is at or below the bound its feed hands in (every
    sampler that matters has read past it), or once a reading MAX_HOLD_NS newer has arrived
    behind it (`max_hold_ns`; None: held for as long as the bound says); all are released at
    the end. Released in the order they came, each once.
    """

    def __init__(self, time_of: Callable[[T], int], max_hold_ns: int | None = MAX_HOLD_NS) -> None:
        self._time_of = time_of
        self.max_hold_ns = max_hold_ns
        self._held: deque[T] = deque()

    def add(self, item: T) -> None:
        self._held.append(item)

    def __len__(self) -> int:
        return len(self._held)

    def __bool__(self) -> bool:
        return bool(self._held)

    def release(self, bound: int | None, final: bool = False) -> Iterator[T]:
        """The readings free to go, oldest first; `bound` None: none by the bound."""
        held, time_of, limit = self._held, self._time_of, self.max_hold_ns
        while held:
            t = time_of(held[0])
            if not (final or (bound is not None and t <= bound)
                    or (limit is not None and time_of(held[-1]) - t >= limit)):
                return
            yield held.popleft()
