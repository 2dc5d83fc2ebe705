"""Kernels with launch stacks + a GPU's measured energy -> a Profile of facts. Pure.

The tree: the root, then each launch stack (Python frames, then operators; or a labelled node
when the trace has no Python stack), holding its kernels' joules under the source `gpu:N`; and
`[GPU idle]` holding each device's energy while none of this trace's records was busy. The
process held the GPU all along, so `[GPU idle]` is part of the program's tree, and the tree sums
to the GPU's energy. Node time is GPU busy time (an instant shared by k records counts 1/k).
The per-stack kernel table and error bars go under the profile's `gpu_kernels` field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..profile import Node, Note, Profile, Source, Totals
from .kernels import GPU_IDLE_NODE, Attribution, Interval, attribute

if TYPE_CHECKING:  # the reader does I/O; only its record type is named here
    from ..collect.kernels.kineto import Kernel

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

