"""Kernels with launch stacks + a GPU's measured energy -> a Profile of facts. Pure.

The tree: the root, then each launch stack (Python frames, then operators; or a labelled node
when the trace has no Python stack), holding its kernels' joules under the source `gpu:N`; and
`[GPU idle]` holding each device's energy while none of this trace's records was busy. The
process held the GPU all along, so `[GPU idle]` is part of the program's tree, and the tree sums
to the GPU's energy. Node time is GPU busy time (an instant shared by k records counts 1/k).
The per-stack kernel table and error bars are the profile's typed `gpu_kernels` facts
(facts/records.GpuKernels), made while the tree is built: each stack with its own bar and the bar
of every tree node on its path (the node's stacks taken together, core/kernels.attribute's groups).
"""

from __future__ import annotations

import bisect
import itertools
from typing import TYPE_CHECKING, Any, Iterable, NamedTuple, Sequence

from ..agent.kernels.frames import Frame, Path
from ..facts.profile import IDLE_NODE
from ..facts.profile import SELF_NODE
from ..facts.profile import Node
from ..facts.profile import Note
from ..facts.profile import Profile
from ..facts.profile import Source
from ..facts.profile import Totals
from ..facts.records import GpuDevice, GpuKernels, GpuKernelSum, GpuSchedule, GpuStack
from ..record import field, record
from .backward import BackwardFold, same_frame
from .kernels import GPU_IDLE_NODE, Attribution, Interval, attribute, tree_nodes

if TYPE_CHECKING:
    from ..agent.kernels.reduce import Cycle, Kernel

TOP_KERNELS = 10


def source_id(device: int) -> str:
    return f"gpu:{device}"


def build_gpu_profile(kernels: Sequence["Kernel"], power: dict[int, Sequence[Interval]], period_ns: dict[int, float],
                      *, start_ns: int, end_ns: int, meta: dict[str, Any], sources: Iterable[Source] = (),
                      notes: Iterable[Note] = ()) -> Profile:
    """power: device -> (t0, t1, joules) on the trace's clock; period_ns: device -> sensor update period."""
    att = attribute(((k.stack, k.device, k.name, k.start_ns, k.end_ns) for k in kernels), power, period_ns)
    return profile_from(att, start_ns=start_ns, end_ns=end_ns, meta=meta, sources=sources, notes=notes,
                        records=len(kernels))


def profile_from(att: Attribution, *, start_ns: int, end_ns: int, meta: dict[str, Any], sources: Iterable[Source] = (),
                 notes: Iterable[Note] = (), records: int = 0) -> Profile:
    duration_s = max(0, end_ns - start_ns) / 1e9
    ids = [source_id(d) for d in sorted(att.devices)]
    root = Node(function=str(meta.get("target") or "<trace>"))
    index: dict[tuple[Frame, ...], Node] = {(): root}
    stacks_out: list[GpuStack] = []
    for stack in sorted(att.stacks, key=lambda s: tuple(map(str, s))):
        node = _node_at(index, stack)
        for dev, fig in sorted(att.stacks[stack].items()):
            sid = source_id(dev)
            node.self_energy_j[sid] = node.self_energy_j.get(sid, 0.0) + fig.joules
            node.self_time_s += fig.time_s
            top = sorted(fig.kernels.values(), key=lambda k: -k.joules)
            stacks_out.append(GpuStack(list(stack), dev, fig.joules, fig.error_j, fig.time_s, len(top),
                                       top[:TOP_KERNELS],
                                       node_bars(att, stack, dev)))
    idle = Node(function=GPU_IDLE_NODE, self_energy_j={source_id(d): e.idle_j for d, e in sorted(att.devices.items())})
    root.children.append(idle)
    root.fill_inclusive()
    root.time_s = max(root.time_s, duration_s)
    root.self_time_s = max(0.0, root.time_s - sum(c.time_s for c in root.children))
    energy = {source_id(d): e.total_j for d, e in att.devices.items()}
    totals = Totals(energy_j=energy, attributed_j=dict(energy), energyprof_j={s: 0.0 for s in ids},
                    idle_j={s: 0.0 for s in ids}, duration_s=duration_s)
    devices = {str(d): GpuDevice(source_id(d), e.total_j, e.idle_j, e.busy_s, e.period_s, e.short_j, e.short_share,
                                 e.unmeasured_busy_s, idle_error_j=e.idle_error_j)
               for d, e in sorted(att.devices.items())}
    all_notes = list(notes)
    for d, n in sorted(att.unpowered.items()):
        all_notes.append(Note("gpu-unpowered", f"device {d}: {n} record(s) but no gpu:{d} power column; they hold no joules",
                              {"device": d, "records": n}))
    for d, e in sorted(att.devices.items()):
        if e.short_j > 0:
            all_notes.append(Note("gpu-resolution", f"gpu:{d}: {100 * e.short_share:.1f}% of the GPU's energy went to "
                                  f"records shorter than the sensor's update period ({1e3 * e.period_s:.3g} ms): those "
                                  "figures are estimated from their interval's mean power", {"device": d}))
        if e.unmeasured_busy_s > 0:
            all_notes.append(Note("gpu-unmeasured", f"gpu:{d}: {e.unmeasured_busy_s:.3g} s of busy time lies outside the "
                                  "power log; no joules were given to it", {"device": d}))
    full_meta = dict(meta)
    full_meta.setdefault("duration_s", duration_s)
    full_meta["idle_policy"] = "share"
    gpu = GpuKernels(method="energy split among busy device records by busy time; overlapping records share; "
                            "time with none busy is [GPU idle]", devices=devices, stacks=stacks_out, records=records)
    return Profile(meta=full_meta, sources=list(sources) or [Source(id=s, component=s) for s in ids], totals=totals,
                   root=root, notes=all_notes, gpu_kernels=gpu)


def node_bars(att: Attribution, path: tuple[Frame, ...], device: int, scale: float = 1.0) -> list[float] | None:
    """The bar of each tree node on a launch path (its prefixes, outermost first) on one device: the
    attribution's group bar of every stack beneath the node; None when the attribution was made
    without tree-node groups (then a node's bar can only be the sum of its stacks')."""
    out = []
    for depth in range(1, len(path) + 1):
        bar = att.group_error_j.get(path[:depth], {}).get(device)
        if bar is None:
            return None
        out.append(bar * scale)
    return out


def _node_at(index: dict[tuple[Frame, ...], Node], stack: tuple[Frame, ...]) -> Node:
    for depth in range(1, len(stack) + 1):
        path = stack[:depth]
        node = index.get(path)
        if node is None:
            fn, file, line = path[-1]
            node = Node(function=fn, file=file, line=line)
            index[path[:-1]].children.append(node)
            index[path] = node
    return index[stack]


# ---------------------------------------------------------------- a live run: kernels and samples, one tree

WALL_TIME_NOTE = ("GPU figures are where Python waited: the GPU's energy is charged by wall time on the sampled stacks,"
                  " not to the lines that launched its kernels")
MAX_CELLS = 200_000  # (path, device, cell) entries a run's kernel fold holds at most: past it, its cells double
MAX_SPANS = 4_096  # profiled spans kept: past it, the spans with the shorter half of the gaps between them are joined


class KernelFold:
    """The program's reduced kernel cycles (agent/kernels/reduce.py) folded over the run: per (launch
    path, device) the shared busy ns per cell, the kernels' names, and the profiled spans. Memory
    follows paths x cells, never kernels: past MAX_CELLS entries the cells double in width (power
    inside a cell is then taken as even, as it is inside a sensor's interval)."""

    def __init__(self, max_cells: int = MAX_CELLS, max_spans: int = MAX_SPANS) -> None:
        self.max_cells = max_cells
        self.max_spans = max_spans
        self.joined_gap_ns = 0  # the longest gap between cycles taken as profiled (MAX_SPANS)
        self.cell_ns = 0  # set by the first busy record (the program's bucket width)
        self.busy: dict[tuple[Path, int], dict[int, float]] = {}
        self.names: dict[tuple[Path, int], dict[str, list[float]]] = {}
        self.spans: list[tuple[int, int]] = []  # profiled cycles on energyprof's clock, merged, in order
        self.counts: dict[str, int] = {}
        self.cycles = 0
        self.records = 0  # device records the cycles held
        self.cost_ns = 0  # the capture's own CPU, as the program last said (charged to [energyprof] there)
        self.entries = 0
        self.backward = BackwardFold()

    # the sink the program's cycles (or the spool's records of them) arrive through
    def add_cycle(self, t0: int, t1: int, records: int = 0, cost_ns: int = 0) -> None:
        self.cycles += 1
        self.records += records
        self.cost_ns = max(self.cost_ns, int(cost_ns))
        if t1 <= t0:
            return
        spans = self.spans
        if spans and t0 >= spans[-1][0]:
            a, b = spans[-1]
            if t0 <= b:
                spans[-1] = (a, max(b, t1))
                return
            spans.append((t0, t1))
            self._bound_spans()
            return
        spans.append((t0, t1))
        spans.sort()
        self.spans = _merged(spans)

    def _bound_spans(self) -> None:
        """Past MAX_SPANS (a long run profiled in back-to-back cycles), the gaps shorter than the median
        are taken as profiled: the spans' number stays bounded, at the cost of those short gaps'
        energy going to the split (as [GPU idle] where nothing was busy) rather than the wall-time rule."""
        spans = self.spans
        if len(spans) <= self.max_spans:
            return
        gaps = sorted(b[0] - a[1] for a, b in zip(spans, spans[1:]))
        cut = gaps[len(gaps) // 2]
        out = [spans[0]]
        for a, b in spans[1:]:
            if a - out[-1][1] <= cut:
                out[-1] = (out[-1][0], max(out[-1][1], b))
            else:
                out.append((a, b))
        self.spans = out
        self.joined_gap_ns = max(self.joined_gap_ns, cut)

    def add_busy(self, path: Path, device: int, bucket_ns: int, buckets: dict[int, float]) -> None:
        if device < 0:  # backward's CPU figures (agent/kernels/reduce.BACKWARD_DEVICE, SAMPLE_DEVICE): its own fold
            if device == -1:
                self.backward.add(tuple(path), sum(float(ns) for ns in buckets.values()))
            else:
                self.backward.sample(-2 - device, tuple(path), sum(float(w) for w in buckets.values()))
            return
        if not self.cell_ns:
            self.cell_ns = max(1, int(bucket_ns))
        cells = self.busy.setdefault((tuple(path), int(device)), {})
        width = self.cell_ns
        for b, ns in buckets.items():
            c = (int(b) * bucket_ns) // width
            if c not in cells:
                self.entries += 1
            cells[c] = cells.get(c, 0.0) + float(ns)
        while self.entries > self.max_cells:
            self._coarsen()

    def add_names(self, path: Path, device: int, names: dict[str, Sequence[float]], keep: int = 4 * TOP_KERNELS) -> None:
        if device < 0:
            if device == -1:  # a backward or forward path's runs and fastest run in the cycle
                self.backward.runs(tuple(path), names)
            return
        into = self.names.setdefault((tuple(path), int(device)), {})
        for name, (count, time_ns) in names.items():
            cur = into.setdefault(name, [0, 0.0])
            cur[0] += count
            cur[1] += time_ns
        if len(into) > keep:  # bounded by lines: the longest names kept
            for name, _ in sorted(into.items(), key=lambda kv: kv[1][1])[: len(into) - keep]:
                del into[name]

    def add_counts(self, counts: dict[str, int]) -> None:
        for k, n in counts.items():
            self.counts[k] = self.counts.get(k, 0) + int(n)

    def add(self, cycle: Cycle) -> None:
        """A reduced cycle, for a fold in the program's own process."""
        self.add_cycle(cycle.t0, cycle.t1, cycle.records, cycle.cost_ns)
        for (path, dev), fig in cycle.figures.items():
            self.add_busy(path, dev, cycle.bucket_ns, fig.busy)
            self.add_names(path, dev, fig.names)
        self.add_counts(cycle.counts)

    def _coarsen(self) -> None:
        self.cell_ns *= 2
        self.entries = 0
        for key, cells in self.busy.items():
            out: dict[int, float] = {}
            for c, ns in cells.items():
                out[c // 2] = out.get(c // 2, 0.0) + ns
            self.busy[key] = out
            self.entries += len(out)

    def __bool__(self) -> bool:
        return bool(self.busy)


@record
class KernelSplit:
    """The program's GPU energy inside the profiled cycles split among the kernels' launch paths,
    made before the tree is built, and grafted into it while it is built (`graft`)."""

    att: Attribution | None  # stacks keyed by path (None: no GPU split, backward's CPU split only)
    devices: dict[int, str]  # device -> its source id
    inside: dict[int, float]  # device -> share of its measured energy inside the profiled cycles
    names: dict[tuple[Path, int], dict[str, list[float]]]
    spans: list[tuple[int, int]]
    cycles: int
    records: int
    counts: dict[str, int]
    clock_error_ns: int = 0
    unmeasured_busy_s: dict[int, float] = field(default_factory=dict)
    lanes: dict[int, list[list[float | None]]] = field(default_factory=dict)  # device -> the timeline's busy lane
    fold: dict[str, int] = field(default_factory=dict)  # the fold's size: paths, entries, cell width
    backward: BackwardFold | None = None  # backward's CPU time per path, for the training split (core/backward.py)


class DevicePower(NamedTuple):
    """One GPU source's measured energy over the run, as the kernel split takes it."""

    device: int
    source_id: str  # `gpu:N`
    intervals: Sequence[Interval]  # (t0, t1, joules) on energyprof's clock
    period_ns: float  # the power's resolution: records shorter than it have their interval's mean power


def split_run(fold: KernelFold, power: Sequence[DevicePower], *, clock_error_ns: int = 0) -> KernelSplit | None:
    """The fold's busy time against each device's power, through core/kernels.attribute: each path's
    busy ns in a cell is laid out in the cell's measured part, spread over the power intervals there by
    their length (busy taken as even within a cell), so a cell's paths never overlap and each gets the
    power of the instants it was given. None: no power for a device, or no profiled span."""
    devices = {p.device: p.source_id for p in power}
    period_ns = {p.device: float(p.period_ns) for p in power}
    intervals = {p.device: p.intervals for p in power}
    if not devices or not fold.spans:
        return None
    spans = fold.spans
    inside: dict[int, float] = {}
    clipped: dict[int, list[Interval]] = {}
    for d in devices:
        clipped[d] = clip_intervals(intervals[d], spans)
        whole = sum(e for _, _, e in intervals[d])
        inside[d] = sum(e for _, _, e in clipped[d]) / whole if whole > 0 else 0.0
    order = sorted(fold.busy, key=lambda k: (k[1], tuple(map(str, k[0]))))
    index = {key[0]: i for i, key in enumerate(order)}
    paths = {i: key[0] for i, key in enumerate(order)}
    records: list[tuple[int, int, str, int, int]] = []
    unmeasured: dict[int, float] = {}
    width = fold.cell_ns
    for d in devices:
        ivs = sorted(clipped[d])
        starts = [a for a, _, _ in ivs]
        by_cell: dict[int, list[tuple[int, float]]] = {}
        for key in order:
            if key[1] != d:
                continue
            for c, ns in fold.busy[key].items():
                if ns > 0:
                    by_cell.setdefault(c, []).append((index[key[0]], ns))
        for c in sorted(by_cell):
            lo, hi = c * width, (c + 1) * width
            k = max(0, bisect.bisect_right(starts, lo) - 1)
            pieces = []
            while k < len(ivs) and ivs[k][0] < hi:
                a, b = max(lo, ivs[k][0]), min(hi, ivs[k][1])
                if b > a:
                    pieces.append((a, b))
                k += 1
            length = sum(b - a for a, b in pieces)
            busy = sum(ns for _, ns in by_cell[c])
            if length <= 0:
                unmeasured[d] = unmeasured.get(d, 0.0) + busy
                continue
            scale = min(1.0, length / busy)
            if scale < 1.0:
                unmeasured[d] = unmeasured.get(d, 0.0) + busy - length
            for a, b in pieces:
                pos = float(a)
                for p, ns in by_cell[c]:
                    part = ns * scale * (b - a) / length
                    s, e = round(pos), round(pos + part)
                    pos += part
                    if e > s:
                        records.append((p, d, "", s, min(e, b)))
    # records are keyed by the path's index; the bars' groups are the path's tree nodes (its prefixes)
    att = attribute(records, {d: clipped[d] for d in devices}, period_ns, groups=lambda p: tree_nodes(paths[p]))
    att = Attribution({paths[p]: figs for p, figs in att.stacks.items()}, att.devices, att.unpowered, att.group_error_j)
    names = {k: v for k, v in fold.names.items() if k[1] in devices}
    return KernelSplit(att, devices, inside, names, list(spans), fold.cycles, fold.records, dict(fold.counts),
                       clock_error_ns, {d: ns / 1e9 for d, ns in unmeasured.items()},
                       fold={"paths": len(fold.busy), "entries": fold.entries, "cell_ns": fold.cell_ns,
                             "capture_cpu_ns": fold.cost_ns})


def graft(root: Node, split: KernelSplit) -> tuple[list[Note], GpuKernels | None]:
    """The kernels' joules into a tree being built (core/tree.build_profile calls this before the
    Profile exists; nothing edits a built Profile): (notes, the profile's `gpu_kernels` facts).

    What the sampled tree holds for `gpu:N` inside the profiled cycles (the program's share of the
    GPU, under each idle policy) is kept as the total: it is split in proportion to the energy the
    kernel split gives each path and `[GPU idle]`. Outside the cycles it stays where the wall-time
    rule put it, each node keeping that share of its GPU joules. Kernel frames meet the sampled
    frames by (function, file, first line): the sampler names a frame by its qualified name and full
    path, the profiler by its code name and the path less its sys.path entry."""
    notes: list[Note] = []
    if split.backward:
        from .backward import graft_backward, graft_forward

        notes.extend(graft_backward(root, split.backward))
        if split.att is None:  # on the CPU only: a GPU run's module frames also hold GPU joules the kernels split
            notes.extend(graft_forward(root, split.backward))
    if split.att is None:
        return notes, None
    gpu_notes, gpu = _graft_gpu(root, split)
    return notes + gpu_notes, gpu


def _graft_gpu(root: Node, split: KernelSplit) -> tuple[list[Note], GpuKernels]:
    att, devices, inside = split.att, split.devices, split.inside
    assert att is not None
    special = {IDLE_NODE, SELF_NODE}  # not the program's: their GPU joules stay
    held: dict[str, list[float]] = {sid: [0.0, 0.0] for sid in devices.values()}
    program_nodes = []
    todo = [(root, False)]
    while todo:
        node, out = todo.pop()
        out = out or (node is not root and node.function in special)
        if not out:
            program_nodes.append(node)
        todo.extend((c, out) for c in node.children)
    keep = {sid: 1.0 - inside[d] for d, sid in devices.items()}
    for node in program_nodes:  # emptied by the profiled share, not removed: a node keeps the sources it had
        for sid in held:
            if sid in node.self_energy_j:
                held[sid][0] += node.self_energy_j[sid] * (1.0 - keep[sid])
                node.self_energy_j[sid] *= keep[sid]
            other = node.other_policy_self_energy_j
            if other is not None and sid in other:
                held[sid][1] += other[sid] * (1.0 - keep[sid])
                other[sid] *= keep[sid]
    index: dict[tuple[Frame, ...], Node] = {}
    stacks_out: list[GpuStack] = []
    devices_out: dict[str, GpuDevice] = {}
    for d, sid in devices.items():
        dev = att.devices[d]
        scale = [h / dev.total_j if dev.total_j > 0 else 0.0 for h in held[sid]]
        for path in sorted(att.stacks, key=lambda s: tuple(map(str, s))):
            fig = att.stacks[path].get(d)
            if fig is None:
                continue
            node = _meet(root, index, _anchored(root, path))
            _add(node, sid, fig.joules * scale[0], fig.joules * scale[1])
            names = split.names.get((path, d), {})
            time_ns = sum(v[1] for v in names.values()) or 1.0
            top = sorted(names.items(), key=lambda kv: -kv[1][1])
            # the figures are the program's share (scale): the bars, linear in the joules, scale with them
            stacks_out.append(GpuStack(list(path), d, fig.joules * scale[0], fig.error_j * scale[0], fig.time_s, len(top),
                                       [GpuKernelSum(n, int(v[0]), v[1] / 1e9, fig.joules * scale[0] * v[1] / time_ns)
                                        for n, v in top[:TOP_KERNELS]],
                                       node_bars(att, path, d, scale[0])))
        idle = _meet(root, index, ((GPU_IDLE_NODE, "", 0),))
        _add(idle, sid, dev.idle_j * scale[0], dev.idle_j * scale[1])
        if dev.total_j <= 0 and (held[sid][0] or held[sid][1]):
            _add(idle, sid, held[sid][0], held[sid][1])  # no power seen in the cycles: nothing to split by
        idle_scale = scale[0] if dev.total_j > 0 else 1.0
        devices_out[str(d)] = GpuDevice(sid, held[sid][0], dev.idle_j * idle_scale, dev.busy_s, dev.period_s, dev.short_j,
                                        dev.short_share, dev.unmeasured_busy_s + split.unmeasured_busy_s.get(d, 0.0),
                                        idle_error_j=dev.idle_error_j * scale[0] if dev.total_j > 0 else None,
                                        split_share=inside[d], other_policy_energy_j=held[sid][1],
                                        busy_lane=list(split.lanes.get(d, [])))
    profiled_s = sum(b - a for a, b in split.spans) / 1e9
    gpu = GpuKernels(method="the program's GPU energy inside the profiled cycles split among its kernels by busy time"
                            " (reduced in the program from the PyTorch profiler's events); time with none busy is"
                            " [GPU idle]; outside the cycles, by wall time on the sampled stacks",
                     devices=devices_out, stacks=stacks_out, records=split.records, cycles=split.cycles,
                     clock_error_ns=split.clock_error_ns, unplaced=dict(split.counts), fold=dict(split.fold),
                     schedule=GpuSchedule([[a, b] for a, b in split.spans[:1000]], len(split.spans), profiled_s,
                                          {str(d): inside[d] for d in devices}))
    notes = []
    for d, sid in devices.items():
        share = inside[d]
        outside = held[sid][0] / share * (1.0 - share) if share > 0 else 0.0
        notes.append(Note("gpu-kernels-split", (
            f"{sid}: {share:.1%} of the GPU's measured energy fell inside the {split.cycles} profiled cycle(s)"
            f" ({profiled_s:.3f} s, {len(split.spans)} window(s) of steps) and was split by kernels onto the lines that"
            f" launched them; the rest ({outside:.3f} J of the program's share) stays charged by wall time on the"
            " sampled stacks: there the GPU figures are where Python waited"),
            {"device": d, "windows": len(split.spans), "profiled_s": profiled_s, "inside_share": share,
             "cycles": split.cycles}))
    for reason, n in sorted(split.counts.items()):
        notes.append(Note("gpu-kernels-unplaced", f"--gpu-kernels: {n} {reason}", {"reason": reason, "count": n}))
    return notes, gpu


def clip_intervals(intervals: Sequence[Interval], spans: Sequence[tuple[int, int]]) -> list[Interval]:
    """The parts of power intervals inside the spans, each with its time share of the interval's
    joules (power taken as even within an interval, as the split itself takes it)."""
    out: list[Interval] = []
    order = sorted(spans)
    starts = [s for s, _ in order]
    ends = list(itertools.accumulate((t for _, t in order), max))  # a span may hold later ones: the running max
    for a, b, e in intervals:
        if b <= a:
            continue
        k = bisect.bisect_right(ends, a)  # the first span that may end after a
        while k < len(order) and starts[k] < b:
            s, t = order[k]
            lo, hi = max(a, s), min(b, t)
            if hi > lo:
                out.append((lo, hi, e * (hi - lo) / (b - a)))
            k += 1
    return out


def _add(node: Node, sid: str, mine: float, other: float) -> None:
    node.self_energy_j[sid] = node.self_energy_j.get(sid, 0.0) + mine
    if node.other_policy_self_energy_j is None:
        node.other_policy_self_energy_j = {}
    node.other_policy_self_energy_j[sid] = node.other_policy_self_energy_j.get(sid, 0.0) + other


def _anchored(root: Node, path: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """The path from its first frame that is one of the root's children: a profile of a region
    (a `with` block, a decorated function) has its outer frames cut, the profiler's stacks do not."""
    tops = [c for c in root.children if not c.is_special]
    for i, frame in enumerate(path):
        if same_frame(root, frame):  # a decorated function's profile: the function is the root
            return path[i + 1:]
        if any(same_frame(c, frame) for c in tops):
            return path[i:]
    return path


def _enclosing(children: Sequence[Node], frame: Frame) -> Node | None:
    """A sampled function the profiler named by a line inside it (a frame already running when a cycle
    began, named by its current line): the same function and file whose first line is the nearest at
    or before that line."""
    fn, file, line = frame
    best = None
    for c in children:
        if c.line < line and same_frame(c, (fn, file, c.line)) and (best is None or c.line > best.line):
            best = c
    return best


def _meet(root: Node, index: dict[tuple[Frame, ...], Node], path: tuple[Frame, ...]) -> Node:
    """The node at `path` under the root, an existing child where one matches, else a new one."""
    node = root
    for depth in range(1, len(path) + 1):
        key = path[:depth]
        found = index.get(key)
        if found is None:
            fn, file, line = path[depth - 1]
            found = next((c for c in node.children if same_frame(c, (fn, file, line))), None)
            if found is None and file:
                found = _enclosing(node.children, (fn, file, line))
            if found is None:
                found = Node(function=fn, file=file, line=line, other_policy_self_energy_j={})
                node.children.insert(len([c for c in node.children if not c.is_special]), found)
            index[key] = found
        node = found
    return node


def timeline_intervals(t0: Sequence[int], t1: Sequence[int], energy: Sequence[Sequence[float]], column: int) -> list[Interval]:
    """One source's (t0, t1, joules) from a ledger timeline's buckets (core/timeline.py)."""
    return [(int(a), int(b), float(row[column])) for a, b, row in zip(t0, t1, energy) if b > a]


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def busy_cells(fold: KernelFold, device: int, cells: Sequence[tuple[int, int]]) -> list[float]:
    """Seconds of each cell during which the device was busy, from the fold's shared busy time (whose
    sum over paths is the busy union), each fold cell spread evenly over the cells it overlaps."""
    width = fold.cell_ns or 1
    total: dict[int, float] = {}
    for (_, dev), busy in fold.busy.items():
        if dev == device:
            for c, ns in busy.items():
                total[c] = total.get(c, 0.0) + ns
    out = [0.0] * len(cells)
    starts = [a for a, _ in cells]
    for c, ns in total.items():
        lo, hi = c * width, (c + 1) * width
        k = max(0, bisect.bisect_right(starts, lo) - 1)
        while k < len(cells) and cells[k][0] < hi:
            a, b = max(lo, cells[k][0]), min(hi, cells[k][1])
            if b > a:
                out[k] += ns * (b - a) / width / 1e9
            k += 1
    return out


def busy_per_cell(spans: Sequence[tuple[int, int]], cells: Sequence[tuple[int, int]]) -> list[float]:
    """Seconds of each cell during which at least one span (a kernel) ran: the union, not the sum,
    so overlapping kernels on two streams count once."""
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        elif b > a:
            merged.append([a, b])
    out, j = [], 0
    for c0, c1 in cells:
        while j < len(merged) and merged[j][1] <= c0:
            j += 1
        busy, k = 0, j
        while k < len(merged) and merged[k][0] < c1:
            busy += max(0, min(c1, merged[k][1]) - max(c0, merged[k][0]))
            k += 1
        out.append(busy / 1e9)
    return out
