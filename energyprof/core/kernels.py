"""Split a GPU's measured energy among the kernels busy on it, by busy time. Pure.

Each power interval [t0, t1) holds J joules (a counter's delta, or watts x seconds of a power
log). Inside it the power is taken as flat: every instant carries J / (t1 - t0) watts. An
instant with k device records busy gives each 1/k of that power; an instant with none goes to
`[GPU idle]`. Summed over an interval the parts are J again, so the kernels' joules plus the
idle joules equal the GPU's energy (to float rounding, ~1e-12 relative).

Resolution: the sensor sees one mean power per update period P. A kernel of duration d is given
that mean; its own power is unresolved when d is shorter than P. Its error bar is taken as
J x P / (d + P): about J for a kernel far shorter than P (its share of the interval is known,
its own power is not), tending to 0 for one spanning many periods. This is a stated estimate,
not a measured bound; `short_share` says how much of the GPU's energy came from kernels
shorter than P.
"""

from __future__ import annotations

from typing import Hashable, Iterable, Sequence

from ..record import field, record

GPU_IDLE_NODE = "[GPU idle]"
OPERATOR_NODE = "[GPU kernels by operator]"  # no Python stack in the trace: kernels under their operator chain
UNLAUNCHED_NODE = "[launch not in trace]"  # a device record whose runtime call the trace does not hold
Frame = tuple[str, str, int]  # (function, file, first line), as core/recording.py

Interval = tuple[int, int, float]  # (t0_ns, t1_ns, joules)
Span = tuple[int, int]  # (start_ns, end_ns)


@record
class Split:
    """One device's energy over its intervals: per span (in input order) joules and shared busy ns."""

    joules: list[float]
    busy_ns: list[float]  # each span's busy time, an instant shared by k spans counting 1/k
    idle_j: float
    total_j: float
    busy_union_ns: int  # time with at least one span busy, inside measured intervals
    unmeasured_busy_ns: int  # busy time outside every interval (no power read there: no joules)


def split_energy(intervals: Sequence[Interval], spans: Sequence[Span]) -> Split:
    """Share each interval's joules among the spans busy in it, by busy time; the rest is idle."""
    ivs = sorted((int(a), int(b), float(j)) for a, b, j in intervals if b > a)
    for (_, b0, _), (a1, _, _) in zip(ivs, ivs[1:]):
        if a1 < b0:
            raise ValueError(f"power intervals overlap at {a1} ns")
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
    return Split(joules, busy, idle, sum(j for _, _, j in ivs), union, unmeasured)


def error_j(joules: float, duration_ns: float, period_ns: float) -> float:
    """The error bar of one kernel's joules from the sensor's update period (see the module's note)."""
    if period_ns <= 0:
        return 0.0
    return joules * period_ns / (max(0.0, duration_ns) + period_ns)


@record
class KernelSum:
    """The kernels of one name on one launch stack."""

    name: str
    count: int = 0
    time_s: float = 0.0
    joules: float = 0.0


@record
class StackEnergy:
    joules: float = 0.0
    error_j: float = 0.0
    time_s: float = 0.0  # busy time, shared instants counted 1/k
    kernels: dict[str, KernelSum] = field(default_factory=dict)


@record
class DeviceEnergy:
    total_j: float
    idle_j: float
    busy_s: float  # time with at least one record busy
    short_j: float  # joules of records shorter than the update period
    unmeasured_busy_s: float
    period_s: float

    @property
    def short_share(self) -> float:
        return self.short_j / self.total_j if self.total_j > 0 else 0.0


@record
class Attribution:
    stacks: dict[Hashable, dict[int, StackEnergy]]  # stack -> device -> figures
    devices: dict[int, DeviceEnergy]
    unpowered: dict[int, int]  # device -> records on a device with no power column

    def total_j(self) -> float:
        return sum(d.total_j for d in self.devices.values())


def attribute(records: Iterable[tuple[Hashable, int, str, int, int]], power: dict[int, Sequence[Interval]],
              period_ns: dict[int, float]) -> Attribution:
    """records: (stack, device, name, start_ns, end_ns); power: device -> its intervals;
    period_ns: device -> the sensor's update period. Devices without power keep no joules."""
    by_device: dict[int, list[tuple[Hashable, str, int, int]]] = {}
    unpowered: dict[int, int] = {}
    for stack, dev, name, s, e in records:
        if dev in power:
            by_device.setdefault(dev, []).append((stack, name, s, e))
        else:
            unpowered[dev] = unpowered.get(dev, 0) + 1
    stacks: dict[Hashable, dict[int, StackEnergy]] = {}
    devices: dict[int, DeviceEnergy] = {}
    for dev, ivs in power.items():
        recs = by_device.get(dev, [])
        res = split_energy(ivs, [(s, e) for _, _, s, e in recs])
        period = float(period_ns.get(dev, 0.0))
        short = 0.0
        for (stack, name, s, e), j, b in zip(recs, res.joules, res.busy_ns):
            fig = stacks.setdefault(stack, {}).setdefault(dev, StackEnergy())
            fig.joules += j
            fig.error_j += error_j(j, e - s, period)
            fig.time_s += b / 1e9
            ks = fig.kernels.setdefault(name, KernelSum(name))
            ks.count += 1
            ks.time_s += (e - s) / 1e9
            ks.joules += j
            if e - s < period:
                short += j
        devices[dev] = DeviceEnergy(res.total_j, res.idle_j, res.busy_union_ns / 1e9, short,
                                    res.unmeasured_busy_ns / 1e9, period / 1e9)
    return Attribution(stacks, devices, unpowered)


@record(frozen=True)
class Kernel:
    """One device record on the trace's clock (ns) with its launch stack, outermost frame first."""

    device: int
    stream: int
    name: str
    kind: str  # kernel | memcpy | memset
    start_ns: int
    end_ns: int
    correlation: int | None
    runtime: str | None  # the launching runtime call (cudaLaunchKernel, hipMemcpyWithStream, ...)
    python: tuple[Frame, ...] = ()  # python_function frames holding the runtime call
    operators: tuple[str, ...] = ()  # cpu_op names holding it, outermost first
    thread: int | None = None

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def stack(self) -> tuple[Frame, ...]:
        """The tree path this kernel's joules go to: its Python frames, then its operators; with no
        Python frame, a labelled node then its operators (or its runtime call, or that none was found)."""
        ops = tuple((op, "", 0) for op in self.operators)
        if self.python:
            return self.python + ops
        if ops:
            return ((OPERATOR_NODE, "", 0),) + ops
        if self.runtime:
            return ((OPERATOR_NODE, "", 0), (self.runtime, "", 0))
        return ((UNLAUNCHED_NODE, "", 0),)
