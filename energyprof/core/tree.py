"""Ledger -> Profile: the fold's per-stack figures become the attribution tree. Pure."""

from __future__ import annotations

from typing import Any

from ..profile import IDLE_NODE, SELF_NODE, Node, Profile
from ..recording import Recording
from .ledger import DEFAULT_SHARE_WINDOW_NS, POLICIES, Ledger


def attribute(recording: Recording, policy: str = "share", share_window_ns: int = DEFAULT_SHARE_WINDOW_NS,
              cpus: int = 1) -> Profile:
    """The whole pipeline's pure core for a materialised `Recording` on a `cpus`-core machine."""
    ledger = Ledger(recording.sources, recording.stacks, share_window_ns, cpus=cpus)
    events: list[tuple[int, int, Any]] = []
    events.extend((t.t_ns, 1, t) for t in recording.ticks)
    events.extend((s.t1_ns, 0, s) for s in recording.samples)
    events.extend((w.t_ns, 2, w) for w in recording.windows)
    events.sort(key=lambda e: (e[0], e[1]))
    for _, kind, ev in events:
        if kind == 0:
            ledger.add_sample(ev)
        elif kind == 1:
            ledger.add_tick(ev)
        elif ev.kind == "begin":
            ledger.begin_window(ev.t_ns, ev.name, ev.index)
        else:
            ledger.end_window(ev.t_ns, ev.name or None)
    ledger.finish()
    return build_profile(ledger, policy, recording.meta)


def build_profile(ledger: Ledger, policy: str, meta: dict[str, Any]) -> Profile:
    """Turn the fold's per-stack figures into the tree, with totals and timeline."""
    if policy not in POLICIES:
        raise ValueError(f"idle policy must be one of {', '.join(POLICIES)}, not {policy!r}")
    ids = ledger.source_ids
    share = policy == "share"

    def joules(values: list[float]) -> dict[str, float]:
        return {sid: float(v) for sid, v in zip(ids, values)}

    start = ledger.first_ns or 0
    duration_s = ((ledger.last_ns or start) - start) / 1e9
    root = Node(function=str(meta.get("target") or "<program>"), file="", line=0)
    root.self_energy_j = joules(ledger.root_share if share else ledger.root_all)
    frames = ledger.stacks.frames
    # Path-keyed children lookup, only while building.
    index: dict[int, dict[int, Node]] = {}
    for sid, st in ledger.stats.items():
        node = root
        for fid in ledger.stacks.stacks[sid]:
            kids = index.setdefault(id(node), {})
            child = kids.get(fid)
            if child is None:
                fn, file, line = frames[fid]
                child = Node(function=fn, file=file, line=line)
                kids[fid] = child
                node.children.append(child)
            node = child
        node.self_time_s += st.time_ns / 1e9
        node.self_cpu_time_s += st.cpu_ns / 1e9
        node.self_samples += st.samples
        vals = st.share if share else st.all
        for sid_, v in zip(ids, vals):
            node.self_energy_j[sid_] = node.self_energy_j.get(sid_, 0.0) + v
        if st.samples:
            node.peak_rss_bytes = max(node.peak_rss_bytes or 0, st.peak_rss)
        node.self_rss_growth_bytes = int(round((node.self_rss_growth_bytes or 0) + st.rss_growth))
        if st.alloc_bytes:
            node.alloc_bytes = int(round((node.alloc_bytes or 0) + st.alloc_bytes))

    specials = []
    own = ledger.own_share if share else ledger.own_all
    if any(own):
        specials.append(Node(function=SELF_NODE, self_energy_j=joules(own)))
    if share:
        specials.append(Node(function=IDLE_NODE, self_energy_j=joules(ledger.idle)))
    root.children.extend(specials)
    _sum_inclusive(root, ids)
    root.time_s = max(root.time_s, duration_s)
    root.self_time_s = max(0.0, root.time_s - sum(c.time_s for c in root.children if not c.is_special))

    attributed = {sid: root.energy_j.get(sid, 0.0) - sum(c.energy_j.get(sid, 0.0) for c in specials) for sid in ids}
    first, last = ledger.first_tick, ledger.last_tick
    cpu_s = 0.0
    if first is not None and last is not None:
        cpu_s = ((last.process_cpu_ns - first.process_cpu_ns) - (last.own_cpu_ns - first.own_cpu_ns)
                 + (last.children_cpu_ns - first.children_cpu_ns)) / 1e9
    totals = {
        "energy_j": joules(ledger.total),
        "attributed_j": attributed,
        "energyprof_j": joules(own),
        "idle_j": joules(ledger.idle) if share else {sid: 0.0 for sid in ids},
        "duration_s": duration_s,
        "cpu_time_s": max(0.0, cpu_s),
        "energyprof_cpu_time_s": ((last.own_cpu_ns - first.own_cpu_ns) / 1e9) if first and last else 0.0,
    }
    windows = []
    for w in ledger.windows:
        end = w["end_ns"] if w["end_ns"] is not None else (ledger.last_ns or start)
        windows.append({
            "name": w["name"], "index": w["index"], "depth": w.get("depth", 0),
            "start_s": (w["start_ns"] - start) / 1e9, "end_s": (end - start) / 1e9,
            "time_s": (end - w["start_ns"]) / 1e9, "energy_j": joules(w["energy"]),
        })
    notes = [{"kind": "sensor-anomaly", "source": k, "count": v,
              "message": f"{k}: {v} reading(s) went backwards or were not numbers; those intervals were skipped"}
             for k, v in ledger.anomalies.items()]
    full_meta = dict(meta)
    full_meta["idle_policy"] = policy
    full_meta.setdefault("duration_s", duration_s)
    return Profile(meta=full_meta, sources=list(ledger.sources), totals=totals, root=root, windows=windows,
                   timeline=_timeline(ledger, start), notes=notes)


def _timeline(ledger: Ledger, start: int) -> dict[str, Any]:
    """The exported timeline plus, per bucket, the functions seen on a stack in it
    (`functions`: [function, file, line]; `active`: indices into it, one list per bucket)."""
    out = ledger.timeline.export(start, ledger.source_ids)
    frames, stacks = ledger.stacks.frames, ledger.stacks.stacks
    index: dict[int, int] = {}
    functions: list[list[Any]] = []
    active: list[list[int]] = []
    for bucket in ledger.timeline.stacks:
        fids: set[int] = set()
        for sid in bucket:
            fids.update(stacks[sid])
        row = []
        for fid in sorted(fids):
            k = index.get(fid)
            if k is None:
                k = index[fid] = len(functions)
                functions.append(list(frames[fid]))
            row.append(k)
        active.append(row)
    out["functions"] = functions
    out["active"] = active
    return out


def _sum_inclusive(root: Node, ids: list[str]) -> None:
    """inclusive = self + children, computed bottom-up without recursion."""
    order = [n for n, _ in root.walk()]
    for node in reversed(order):
        energy = {sid: node.self_energy_j.get(sid, 0.0) for sid in ids}
        node.self_energy_j = dict(energy)
        time_s, cpu_s, samples = node.self_time_s, node.self_cpu_time_s, node.self_samples
        growth = node.self_rss_growth_bytes
        peak = node.peak_rss_bytes
        for c in node.children:
            for sid in ids:
                energy[sid] += c.energy_j.get(sid, 0.0)
            time_s += c.time_s
            cpu_s += c.cpu_time_s
            samples += c.samples
            if c.rss_growth_bytes is not None:
                growth = (growth or 0) + c.rss_growth_bytes
            if c.peak_rss_bytes is not None:
                peak = max(peak or 0, c.peak_rss_bytes)
            if c.alloc_bytes is not None:
                node.alloc_bytes = (node.alloc_bytes or 0) + c.alloc_bytes
        node.energy_j = energy
        node.time_s, node.cpu_time_s, node.samples = time_s, cpu_s, samples
        node.rss_growth_bytes = growth
        node.peak_rss_bytes = peak
