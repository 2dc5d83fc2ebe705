"""Kernels with launch stacks + a GPU's measured energy -> a Profile of facts. Pure.

The tree: the root, then each launch stack (Python frames, then operators; or a labelled node
when the trace has no Python stack), holding its kernels' joules under the source `gpu:N`; and
`[GPU idle]` holding each device's energy while none of this trace's records was busy. The
process held the GPU all along, so `[GPU idle]` is part of the program's tree, and the tree sums
to the GPU's energy. Node time is GPU busy time (an instant shared by k records counts 1/k).
The per-stack kernel table and error bars go under the profile's `gpu_kernels` field.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from ..facts.profile import IDLE_NODE
from ..facts.profile import SELF_NODE
from ..facts.profile import Node
from ..facts.profile import Note
from ..facts.profile import Profile
from ..facts.profile import Source
from ..facts.profile import Totals
from .kernels import GPU_IDLE_NODE, Attribution, Interval, Kernel, attribute


Frame = tuple[str, str, int]

TOP_KERNELS = 10
GPU_FIELD = "gpu_kernels"


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
    stacks_out: list[dict[str, Any]] = []
    for stack in sorted(att.stacks, key=lambda s: tuple(map(str, s))):
        node = _node_at(index, stack)
        for dev, fig in sorted(att.stacks[stack].items()):
            sid = source_id(dev)
            node.self_energy_j[sid] = node.self_energy_j.get(sid, 0.0) + fig.joules
            node.self_time_s += fig.time_s
            top = sorted(fig.kernels.values(), key=lambda k: -k.joules)
            stacks_out.append({"path": [list(f) for f in stack], "device": dev, "joules": fig.joules,
                               "error_j": fig.error_j, "busy_s": fig.time_s, "kernel_names": len(top),
                               "kernels": [{"name": k.name, "count": k.count, "time_s": k.time_s, "joules": k.joules}
                                           for k in top[:TOP_KERNELS]]})
    idle = Node(function=GPU_IDLE_NODE, self_energy_j={source_id(d): e.idle_j for d, e in sorted(att.devices.items())})
    root.children.append(idle)
    root.fill_inclusive()
    root.time_s = max(root.time_s, duration_s)
    root.self_time_s = max(0.0, root.time_s - sum(c.time_s for c in root.children))
    energy = {source_id(d): e.total_j for d, e in att.devices.items()}
    totals = Totals(energy_j=energy, attributed_j=dict(energy), energyprof_j={s: 0.0 for s in ids},
                    idle_j={s: 0.0 for s in ids}, duration_s=duration_s)
    devices = {str(d): {"source": source_id(d), "energy_j": e.total_j, "idle_j": e.idle_j, "busy_s": e.busy_s,
                        "update_period_s": e.period_s, "short_j": e.short_j, "short_share": e.short_share,
                        "unmeasured_busy_s": e.unmeasured_busy_s}
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
    gpu = {"method": "energy split among busy device records by busy time; overlapping records share; "
                     "time with none busy is [GPU idle]", "records": records, "devices": devices, "stacks": stacks_out}
    return Profile(meta=full_meta, sources=list(sources) or [Source(id=s, component=s) for s in ids], totals=totals,
                   root=root, notes=all_notes, extra={GPU_FIELD: gpu})


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



# ---------------------------------------------------------------- a live run: kernels into the sampled tree

WALL_TIME_NOTE = ("GPU energy is charged by wall time on the sampled stacks (no kernel trace: run with --gpu-kernels"
                  " under PyTorch to put it on the lines that launched the kernels)")
_SKIP_FILES = ("runpy", "<frozen runpy>")


def python_path(kernel: "Kernel", package_dir: str = "") -> tuple[Frame, ...]:
    """A kernel's tree path for a live run: its stack less the frames the sampler cuts (runpy's,
    energyprof's own, by full path or as the profiler trims it), so that it meets the sampled tree's frames."""
    out = []
    for f in kernel.stack:
        file = f[1]
        if (file in _SKIP_FILES or file.endswith("/runpy.py") or file.startswith("energyprof/")
                or (package_dir and file.startswith(package_dir))):
            continue
        out.append(f)
    return tuple(out)


def regraft(profile: Profile, kernels: Sequence["Kernel"], power: dict[int, Sequence[Interval]], period_ns: float,
            *, package_dir: str = "", clock_error_ns: int = 0, spans: Sequence[tuple[int, int]] | None = None) -> Profile:
    """The profile with each GPU source's program joules moved from the wall-time rule onto the
    kernels' launch stacks (in place; returns it).

    What the tree held for `gpu:N` (the program's share of the GPU, under each idle policy) is
    kept as the total: it is split in proportion to the energy the kernel split gives each stack
    and `[GPU idle]` from the device's power intervals (the timeline's, on the run's clock). The
    program's share of the GPU is so taken as even over the run. Kernel frames meet the sampled
    tree's by (function, file, line); a module's frame by (function, file), since the profiler
    names it by its current line.

    `spans` (a scheduled profiler's windows, on the power's clock): only the part of each device's
    energy measured inside them is split among the kernels; the rest stays where the wall-time rule
    put it, each node keeping that share of its GPU joules."""
    root = profile.root
    ids = {s.id for s in profile.sources}
    devices = {d: f"gpu:{d}" for d in power if f"gpu:{d}" in ids}
    if not devices:
        profile.notes.append(Note("gpu-wall-time", WALL_TIME_NOTE + "; no GPU source matched the trace's devices"))
        return profile
    inside = {d: 1.0 for d in devices}  # the share of each device's energy measured inside the profiled spans
    if spans is not None:
        clipped = {d: clip_intervals(power[d], spans) for d in devices}
        for d in devices:
            whole = sum(e for _, _, e in power[d])
            inside[d] = sum(e for _, _, e in clipped[d]) / whole if whole > 0 else 0.0
        power = clipped
    att = attribute(((python_path(k, package_dir), k.device, k.name, k.start_ns, k.end_ns) for k in kernels
                     if k.device in devices), {d: power[d] for d in devices}, {d: period_ns for d in devices})
    # What the tree holds per source and policy, then emptied from the program's nodes.
    special = {IDLE_NODE, SELF_NODE}  # not the program's: their GPU joules stay ([child processes] is the program's)
    held: dict[str, list[float]] = {sid: [0.0, 0.0] for sid in devices.values()}
    program_nodes = []
    stack = [(root, False)]
    while stack:
        node, out = stack.pop()
        out = out or (node is not root and node.function in special)
        if not out:
            program_nodes.append(node)
        stack.extend((c, out) for c in node.children)
    keep = {f"gpu:{d}": 1.0 - inside[d] for d in devices}  # outside the spans: stays on the wall-time rule
    for node in program_nodes:  # emptied, not removed: a node keeps the sources it had
        for sid in held:
            if sid in node.self_energy_j:
                held[sid][0] += node.self_energy_j[sid] * (1.0 - keep[sid])
                node.self_energy_j[sid] *= keep[sid]
            other = node.other_policy_self_energy_j
            if other is not None and sid in other:
                held[sid][1] += other[sid] * (1.0 - keep[sid])
                other[sid] *= keep[sid]
    index: dict[tuple[Frame, ...], Node] = {}
    stacks_out = []
    for d, sid in devices.items():
        dev = att.devices[d]
        scale = [held[sid][0] / dev.total_j if dev.total_j > 0 else 0.0, held[sid][1] / dev.total_j if dev.total_j > 0 else 0.0]
        for path in sorted(att.stacks, key=lambda s: tuple(map(str, s))):
            fig = att.stacks[path].get(d)
            if fig is None:
                continue
            node = _meet(root, index, _anchored(root, path))
            _add(node, sid, fig.joules * scale[0], fig.joules * scale[1])
            top = sorted(fig.kernels.values(), key=lambda k: -k.joules)
            stacks_out.append({"path": [list(f) for f in path], "device": d, "joules": fig.joules * scale[0],
                               "error_j": fig.error_j * scale[0], "busy_s": fig.time_s, "kernel_names": len(top),
                               "kernels": [{"name": k.name, "count": k.count, "time_s": k.time_s, "joules": k.joules * scale[0]}
                                           for k in top[:TOP_KERNELS]]})
        idle = _meet(root, index, ((GPU_IDLE_NODE, "", 0),))
        _add(idle, sid, dev.idle_j * scale[0], dev.idle_j * scale[1])
        if dev.total_j <= 0 and (held[sid][0] or held[sid][1]):
            _add(idle, sid, held[sid][0], held[sid][1])  # no power seen in the intervals: nothing to split by
    root.fill_inclusive()
    devices_out = {str(d): {"source": sid, "energy_j": held[sid][0], "idle_j": att.devices[d].idle_j * (
        held[sid][0] / att.devices[d].total_j if att.devices[d].total_j > 0 else 1.0), "busy_s": att.devices[d].busy_s,
        "update_period_s": att.devices[d].period_s, "short_j": att.devices[d].short_j, "short_share": att.devices[d].short_share,
        "unmeasured_busy_s": att.devices[d].unmeasured_busy_s} for d, sid in devices.items()}
    profile.extra[GPU_FIELD] = {"method": "the program's GPU energy split among its kernels by busy time, from the "
                                "PyTorch profiler's trace; time with none busy is [GPU idle]", "records": len(kernels),
                                "clock_error_ns": clock_error_ns, "devices": devices_out, "stacks": stacks_out}
    if spans is not None:
        profiled_s = sum(b - a for a, b in spans) / 1e9
        profile.extra[GPU_FIELD]["schedule"] = {"spans_ns": [[a, b] for a, b in spans], "profiled_s": profiled_s,
                                                "profiled_share": {str(d): inside[d] for d in devices}}
        for d, sid in devices.items():
            outside = held[sid][0] / inside[d] * (1.0 - inside[d]) if inside[d] > 0 else 0.0
            profile.notes.append(Note("gpu-kernels-schedule", (
                f"{sid}: the profiler ran in {len(spans)} window(s), {profiled_s:.3f} s in all; {inside[d]:.1%} of the"
                f" device's measured energy fell inside them and is split among the kernels; the rest"
                f" ({outside:.3f} J of the program's share) stays charged by wall time on the sampled stacks"),
                {"device": d, "windows": len(spans), "profiled_s": profiled_s, "inside_share": inside[d]}))
    return profile


def clip_intervals(intervals: Sequence[Interval], spans: Sequence[tuple[int, int]]) -> list[Interval]:
    """The parts of power intervals inside the spans, each with its time share of the interval's
    joules (power taken as even within an interval, as the split itself takes it)."""
    out: list[Interval] = []
    for a, b, e in intervals:
        for s, t in spans:
            lo, hi = max(a, s), min(b, t)
            if hi > lo and b > a:
                out.append((lo, hi, e * (hi - lo) / (b - a)))
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


def same_frame(node: Node, frame: Frame) -> bool:
    """Whether a sampled node and a profiler frame are one frame. The sampler names a frame by its
    qualified name and full path; the profiler by its code name and the path less its sys.path
    entry; both by its first line, but a module frame by its current line in the profiler."""
    fn, file, line = frame
    if node.function != fn and not node.function.endswith("." + fn):
        return False
    if node.file != file and not (file and node.file.endswith(("/" + file, "\\" + file))):
        return False
    return node.line == line or fn == "<module>"


def _meet(root: Node, index: dict[tuple[Frame, ...], Node], path: tuple[Frame, ...]) -> Node:
    """The node at `path` under the root, an existing child where one matches, else a new one."""
    node = root
    for depth in range(1, len(path) + 1):
        key = path[:depth]
        found = index.get(key)
        if found is None:
            fn, file, line = path[depth - 1]
            for c in node.children:
                if same_frame(c, (fn, file, line)):
                    found = c
                    break
            if found is None:
                found = Node(function=fn, file=file, line=line, other_policy_self_energy_j={})
                node.children.insert(len([c for c in node.children if not c.is_special]), found)
            index[key] = found
        node = found
    return node


def timeline_intervals(t0: Sequence[int], t1: Sequence[int], energy: Sequence[Sequence[float]], column: int) -> list[Interval]:
    """One source's (t0, t1, joules) from a ledger timeline's buckets (core/timeline.py)."""
    return [(int(a), int(b), float(row[column])) for a, b, row in zip(t0, t1, energy) if b > a]


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
