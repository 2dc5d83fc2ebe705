"""Split a GPU's measured energy among the kernels busy on it, by busy time, with error bars. Pure.

Each power interval [t0, t1) holds J joules (a counter's delta, or watts x seconds of a power
log). Inside it the power is taken as flat: every instant carries J / (t1 - t0) watts. An
instant with k device records busy gives each 1/k of that power; an instant with none goes to
`[GPU idle]`. Summed over an interval the parts are J again, so the kernels' joules plus the
idle joules equal the GPU's energy (to float rounding, ~1e-12 relative).

Error bars. Records are grouped by stack (a line, with `[GPU idle]` as one more). Let w_s(t) be
stack s's share of the instant t (its busy records / all busy records; 1 for idle when none is
busy; the shares sum to 1). Over an interval of length T the estimate is J * w̄_s, w̄_s the mean
of w_s; the truth is ∫ p(t) w_s(t) dt for the unknown power p inside the interval, with
∫ p = J. If w_s is constant over the interval (the stack holds all of it, or none), the two are
equal whatever p does: an interval is uncertain between stacks only where their shares change
inside it. The bar is the worst case over every power with 0 <= p(t) <= P (P the device's peak
power): the truth is largest when p fills the instants where w_s is highest first, at P, until
J is spent, and smallest when it fills those where w_s is lowest first; the bar is the larger
distance of those two from the estimate (a linear programme solved by that greedy fill, exact).
It is 0 in an interval one stack holds whole, small when another stack holds a small part of it
(a kernel stream's launch gaps: P x gap), and up to the interval's joules when a stack holds a
sliver of a hot interval. A stack's bar sums its intervals' (worst cases do not cancel), plus
the sensor's own error: `sensor_error` x its joules (a relative figure; NVML documents its power
reading as within ±5% of the draw, which is the default, `DEFAULT_SENSOR_ERROR`).

A group of stacks (a tree node: every stack beneath it; a line) gets the same bar computed on
its stacks taken together (w_group = the sum of their shares): samples they share only among
themselves move nothing out of the group, so a function whose operators take turns inside every
sample has the sensor's error alone, while each operator's stack has a large bar. The group's
bar is never more than the sum of its stacks' (the worst case of a sum is at most the sum of the
worst cases), and sums over its intervals the same way.

P: the caller's figure for the device (a card's power limit), else the highest mean power of
any of its intervals, and never below an interval's own mean. With that default the bars assume
that the power inside a sample does not exceed the hottest sample's mean: true when some sample
holds one kernel stream whole, not when every sample mixes a hot and a cold one; the caller
should then give P.

`short_share` still says how much of the GPU's energy came from records shorter than the
sensor's update period (their own power is unresolved: their figures are the interval's mean).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable, Hashable, Iterable, Sequence

from ..facts.records import GpuKernelSum
from ..record import field, record

GPU_IDLE_NODE = "[GPU idle]"

Interval = tuple[int, int, float]  # (t0_ns, t1_ns, joules)
Span = tuple[int, int]  # (start_ns, end_ns)


DEFAULT_SENSOR_ERROR = 0.05  # NVML: power "accurate to within +/- 5% of current power draw"
IDLE_KEY = GPU_IDLE_NODE  # the bars' key for time with no record busy


@record
class Split:
    """One device's energy over its intervals: per span (in input order) joules and shared busy ns."""

    joules: list[float]
    busy_ns: list[float]  # each span's busy time, an instant shared by k spans counting 1/k
    idle_j: float
    total_j: float
    busy_union_ns: int  # time with at least one span busy, inside measured intervals
    unmeasured_busy_ns: int  # busy time outside every interval (no power read there: no joules)
    bars: dict[Hashable, float] = field(default_factory=dict)  # key -> sharing error bar (J); IDLE_KEY: idle's
    peak_w: float = 0.0  # the power bound the bars assumed
    group_bars: dict[Hashable, float] = field(default_factory=dict)  # group -> the sharing bar of all its keys together


def split_energy(intervals: Sequence[Interval], spans: Sequence[Span], keys: Sequence[Hashable] | None = None,
                 peak_w: float | None = None, groups: Callable[[Hashable], Iterable[Hashable]] | None = None) -> Split:
    """Share each interval's joules among the spans busy in it, by busy time; the rest is idle.
    `keys` (one per span: its stack): also each key's sharing error bar, for power inside an
    interval between 0 and `peak_w` (default: the highest interval mean), see the module's note.
    `groups(key)`: the groups a key's joules count towards (a tree path's prefixes, a line); each
    group gets the bar of all its keys together (`group_bars`), which is smaller than the sum of
    theirs where they share samples."""
    ivs = sorted((int(a), int(b), float(j)) for a, b, j in intervals if b > a)
    for (_, b0, _), (a1, _, _) in zip(ivs, ivs[1:]):
        if a1 < b0:
            raise ValueError(f"power intervals overlap at {a1} ns")
    if peak_w is None:
        peak_w = max((j / (b - a) * 1e9 for a, b, j in ivs), default=0.0)
    n = len(spans)
    joules = [0.0] * n
    busy = [0.0] * n
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    points = {t for a, b, _ in ivs for t in (a, b)}
    for i, (s, e) in enumerate(spans):
        if e > s:
            starts.setdefault(int(s), []).append(i)
            ends.setdefault(int(e), []).append(i)
            points.update((int(s), int(e)))
    order = sorted(points)
    active: set[int] = set()
    idle = 0.0
    union = unmeasured = 0
    k = 0  # the interval that may hold the current segment
    bars: dict[Hashable, float] = {}
    group_bars: dict[Hashable, float] = {}
    segments: list[tuple[int, dict[Hashable, int], int]] = []  # the open interval's: (ns, busy records per key, busy records)
    open_k = -1
    group_cache: dict[Hashable, tuple[Hashable, ...]] = {}

    def groups_of(key: Hashable) -> tuple[Hashable, ...]:
        got = group_cache.get(key)
        if got is None:
            got = group_cache[key] = tuple(groups(key)) if groups is not None else ()
        return got

    for a, b in zip(order, order[1:]):
        for i in ends.get(a, ()):
            active.discard(i)
        active.update(starts.get(a, ()))
        while k < len(ivs) and ivs[k][1] <= a:
            k += 1
        inside = k < len(ivs) and ivs[k][0] <= a
        dt = b - a
        if not inside:
            if active:
                unmeasured += dt
            continue
        if k != open_k:
            if open_k >= 0 and keys is not None:
                _interval_bars(segments, ivs[open_k], peak_w, bars, group_bars, groups_of)
            segments.clear()
            open_k = k
        t0, t1, j = ivs[k]
        e = j * dt / (t1 - t0)
        if active:
            union += dt
            share, width = e / len(active), dt / len(active)
            for i in active:
                joules[i] += share
                busy[i] += width
        else:
            idle += e
        if keys is not None:
            count: dict[Hashable, int] = {}
            for i in active:
                count[keys[i]] = count.get(keys[i], 0) + 1
            segments.append((dt, count, len(active)))
    if open_k >= 0 and keys is not None:
        _interval_bars(segments, ivs[open_k], peak_w, bars, group_bars, groups_of)
    return Split(joules, busy, idle, sum(j for _, _, j in ivs), union, unmeasured, bars, peak_w, group_bars)


def _interval_bars(segments: list[tuple[int, dict[Hashable, int], int]], interval: Interval, peak_w: float,
                   bars: dict[Hashable, float], group_bars: dict[Hashable, float],
                   groups_of: Callable[[Hashable], tuple[Hashable, ...]]) -> None:
    """Add one interval's worst-case errors (the module's note) to each key's bar, idle's, and each
    group's. A set of keys (one key, or all a group holds here) has a share of each instant; its
    bar comes from how long it held each share. Groups holding the same keys here share one figure."""
    t0, t1, joules = interval
    width = t1 - t0
    if width <= 0 or joules <= 0:
        return
    cap = max(peak_w * 1e-9, joules / width)  # J per ns; the interval's own mean bounds its peak from below
    present: set[Hashable] = set()
    for _, count, _ in segments:
        present.update(count)
    sets: dict[frozenset[Hashable], list[tuple[bool, Hashable]]] = {}  # keys -> (is a group, label)
    for key in present:
        sets.setdefault(frozenset((key,)), []).append((False, key))
    members: dict[Hashable, set[Hashable]] = {}
    for key in present:
        for group in groups_of(key):
            members.setdefault(group, set()).add(key)
    for group, held in members.items():
        sets.setdefault(frozenset(held), []).append((True, group))
    of_key: dict[Hashable, list[frozenset[Hashable]]] = {}
    for g in sets:
        for key in g:
            of_key.setdefault(key, []).append(g)
    shares: dict[frozenset[Hashable], dict[float, int]] = {g: {} for g in sets}
    idle_ns = 0
    for dt, count, busy in segments:
        if not busy:
            idle_ns += dt
            continue
        held_now: dict[frozenset[Hashable], int] = {}
        for key, c in count.items():
            for g in of_key[key]:
                held_now[g] = held_now.get(g, 0) + c
        for g, c in held_now.items():
            per = shares[g]
            w = c / busy
            per[w] = per.get(w, 0) + dt
    for g, per in shares.items():
        bar = _bar(per, width, joules, cap)
        if bar > 0:
            for is_group, label in sets[g]:
                target = group_bars if is_group else bars
                target[label] = target.get(label, 0.0) + bar
    bar = _bar({1.0: idle_ns} if idle_ns else {}, width, joules, cap)
    if bar > 0:
        bars[IDLE_KEY] = bars.get(IDLE_KEY, 0.0) + bar


def _bar(per: dict[float, int], width: int, joules: float, cap: float) -> float:
    """The worst-case error of a group's split in one interval: `per` says how long it held each
    share (the rest of the interval: share 0); its joules poured, at most cap x time, first where
    the share is highest, then first where it is lowest; the larger distance from the estimate."""
    held = sum(per.values())
    buckets = sorted(per.items())
    if held < width:
        buckets.insert(0, (0.0, width - held))
    if len(buckets) < 2:  # one share all interval long: no power inside it moves joules to or from the group
        return 0.0
    estimate = joules * sum(w * d for w, d in buckets) / width
    hi = _pour(reversed(buckets), joules, cap)
    lo = _pour(buckets, joules, cap)
    return max(0.0, hi - estimate, estimate - lo)


def _pour(buckets: Iterable[tuple[float, int]], joules: float, cap: float) -> float:
    """The key's joules when the interval's joules fill the buckets in this order, each at most cap x its time."""
    left, got = joules, 0.0
    for w, d in buckets:
        put = min(left, cap * d)
        got += w * put
        left -= put
        if left <= 0:
            break
    return got


@record
class StackEnergy:
    joules: float = 0.0
    error_j: float = 0.0  # sharing_j + sensor_j
    sharing_j: float = 0.0  # uncertain between this stack and others sharing its power samples
    sensor_j: float = 0.0  # the sensor's own relative error x joules
    time_s: float = 0.0  # busy time, shared instants counted 1/k
    kernels: dict[str, GpuKernelSum] = field(default_factory=dict)


@record
class DeviceEnergy:
    total_j: float
    idle_j: float
    busy_s: float  # time with at least one record busy
    short_j: float  # joules of records shorter than the update period
    unmeasured_busy_s: float
    period_s: float
    idle_error_j: float = 0.0  # [GPU idle]'s bar, as a stack's
    peak_w: float = 0.0  # the power bound the bars assumed (see the module's note)
    sensor_error: float = DEFAULT_SENSOR_ERROR  # relative

    @property
    def short_share(self) -> float:
        return self.short_j / self.total_j if self.total_j > 0 else 0.0


@record
class Attribution:
    stacks: dict[Hashable, dict[int, StackEnergy]]  # stack -> device -> figures
    devices: dict[int, DeviceEnergy]
    unpowered: dict[int, int]  # device -> records on a device with no power column
    # group -> device -> the bar of its stacks' joules taken together (what they share among
    # themselves moves nothing out of the group), plus the sensor's; by default the groups are the
    # tree nodes (a tuple stack's prefixes): a node's bar is that of all the joules beneath it
    group_error_j: dict[Hashable, dict[int, float]] = field(default_factory=dict)

    def total_j(self) -> float:
        return sum(d.total_j for d in self.devices.values())


def attribute(records: Iterable[tuple[Hashable, int, str, int, int]], power: dict[int, Sequence[Interval]],
              period_ns: dict[int, float], *, sensor_error: float | Mapping[int, float] = DEFAULT_SENSOR_ERROR,
              peak_w: Mapping[int, float] | None = None,
              groups: Callable[[Hashable], Iterable[Hashable]] | None = None) -> Attribution:
    """records: (stack, device, name, start_ns, end_ns); power: device -> its intervals;
    period_ns: device -> the sensor's update period (for `short_j`); sensor_error: the sensor's
    relative error (one figure, or per device); peak_w: device -> its peak power, for the bars
    (default: its hottest interval's mean); groups(stack): the groups whose bars to give
    (default: the stack's tree nodes). Devices without power keep no joules."""
    by_device: dict[int, list[tuple[Hashable, str, int, int]]] = {}
    unpowered: dict[int, int] = {}
    for stack, dev, name, s, e in records:
        if dev in power:
            by_device.setdefault(dev, []).append((stack, name, s, e))
        else:
            unpowered[dev] = unpowered.get(dev, 0) + 1
    stacks: dict[Hashable, dict[int, StackEnergy]] = {}
    devices: dict[int, DeviceEnergy] = {}
    group_error: dict[Hashable, dict[int, float]] = {}
    group_fn = groups if groups is not None else tree_nodes
    for dev, ivs in power.items():
        recs = by_device.get(dev, [])
        rel = float(sensor_error.get(dev, DEFAULT_SENSOR_ERROR) if isinstance(sensor_error, Mapping) else sensor_error)
        res = split_energy(ivs, [(s, e) for _, _, s, e in recs], keys=[r[0] for r in recs],
                           peak_w=None if peak_w is None or dev not in peak_w else float(peak_w[dev]), groups=group_fn)
        period = float(period_ns.get(dev, 0.0))
        short = 0.0
        for (stack, name, s, e), j, b in zip(recs, res.joules, res.busy_ns):
            fig = stacks.setdefault(stack, {}).setdefault(dev, StackEnergy())
            fig.joules += j
            fig.time_s += b / 1e9
            ks = fig.kernels.setdefault(name, GpuKernelSum(name))
            ks.count += 1
            ks.time_s += (e - s) / 1e9
            ks.joules += j
            if e - s < period:
                short += j
        group_j: dict[Hashable, float] = {}
        for stack in {r[0] for r in recs}:
            fig = stacks[stack][dev]
            fig.sharing_j = res.bars.get(stack, 0.0)
            fig.sensor_j = rel * fig.joules
            fig.error_j = fig.sharing_j + fig.sensor_j
            for group in set(group_fn(stack)):
                group_j[group] = group_j.get(group, 0.0) + fig.joules
        for group, j in group_j.items():
            group_error.setdefault(group, {})[dev] = res.group_bars.get(group, 0.0) + rel * j
        devices[dev] = DeviceEnergy(res.total_j, res.idle_j, res.busy_union_ns / 1e9, short,
                                    res.unmeasured_busy_ns / 1e9, period / 1e9,
                                    res.bars.get(IDLE_KEY, 0.0) + rel * res.idle_j, res.peak_w, rel)
    return Attribution(stacks, devices, unpowered, group_error)


def tree_nodes(stack: Hashable) -> tuple[Hashable, ...]:
    """A tuple stack's tree nodes: its prefixes, outermost first (none for another kind of key)."""
    return tuple(stack[:i] for i in range(1, len(stack) + 1)) if isinstance(stack, tuple) else ()
