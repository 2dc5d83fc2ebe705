"""Ledger -> Profile: the fold's per-stack figures become the Profile of facts. Pure."""

from __future__ import annotations

from typing import Any, Iterable


from ..facts.profile import (IDLE_NODE, SELF_NODE, THREAD_PREFIX, UNSAMPLED_CPU_NODE, UNSAMPLED_CPU_SHOWN, Node, Note, Process,
                       Profile, Source, Timeline, Totals, Window)
from .recording import Recording
from .ledger import DEFAULT_SHARE_WINDOW_NS, Ledger
from .processes import process_table
from ..facts.policy import IdlePolicy, WindowAccount, check_policy
from ..facts.policy import other as other_policy
from ..facts.load import MachineLoad
from ..facts.records import field_names
from ..record import replace


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


def build_profile(ledger: Ledger, policy: str, meta: dict[str, Any], *, notes: Iterable[Note | dict[str, Any]] = (),
                  peak_rss_exact_bytes: int | None = None,
                  child_processes: Iterable[dict[str, Any]] = (), gpu: Any = None,
                  io: dict[str, Any] | None = None) -> Profile:
    """The fold's per-stack figures as a Profile of facts: the tree (under `policy`, with the other
    policy's self figures beside them), totals, windows, timeline, processes and notes. `gpu`: the
    kernels' split of the GPU's energy (core/gpu_tree.KernelSplit), grafted while the tree is built;
    `io`: the I/O counters' fact (collect/io.py), kept as read."""
    policy = check_policy(policy)
    ids = ledger.source_ids
    share = policy == "share"
    start = ledger.first_ns or 0
    duration_s = ((ledger.last_ns or start) - start) / 1e9
    root = Node(function=str(meta.get("target") or "<program>"), file="", line=0)
    root.self_energy_j, root.other_policy_self_energy_j = _both(ids, share, ledger.root.share, ledger.root.all)
    alloc = _grow_tree(root, ledger, share)
    own, own_other = _both(ids, share, ledger.own.share, ledger.own.all)
    idle, idle_other = _both(ids, share, ledger.idle.share, ledger.idle.all)
    cpu_s = _headline_cpu_s(ledger)
    root.children.extend(_special_nodes(root, ledger, cpu_s, (own, own_other), (idle, idle_other)))
    gpu_notes: list[Note] = []
    gpu_facts = None
    if gpu is not None:
        from .gpu_tree import graft

        gpu_notes, gpu_facts = graft(root, gpu)
    _close_tree(root, ledger, alloc, duration_s, peak_rss_exact_bytes)
    timeline = Timeline(**_timeline(ledger, start))
    totals = _totals(ledger, root, timeline, own, idle, duration_s, cpu_s, peak_rss_exact_bytes)
    children = [dict(c) for c in child_processes]
    processes = _processes(ledger, policy, children, cpu_s)
    full_meta = dict(meta)
    full_meta["idle_policy"] = policy
    full_meta.setdefault("duration_s", duration_s)
    return Profile(meta=full_meta, sources=[Source(**_source_fields(s)) for s in ledger.sources], totals=totals,
                   root=root, windows=_windows(ledger, start, policy, {p.pid: p.rank for p in processes}), timeline=timeline,
                   notes=_ledger_notes(ledger) + [_note(n) for n in notes] + gpu_notes, processes=processes,
                   extra={**({"child_processes": children} if children else {}),
                          **({"io": io} if io is not None else {})},  # child_processes: the /1 field
                   gpu_kernels=gpu_facts, load=_machine_load(ledger, duration_s, cpu_s))


def _joules(ids: list[str], values: list[float]) -> dict[str, float]:
    return {sid: float(v) for sid, v in zip(ids, values)}


def _both(ids: list[str], share: bool, share_values: list[float],
          all_values: list[float]) -> tuple[dict[str, float], dict[str, float]]:
    """(the chosen policy's figures, the other's) by source id."""
    a, b = _joules(ids, share_values), _joules(ids, all_values)
    return (a, b) if share else (b, a)


def _grow_tree(root: Node, ledger: Ledger, share: bool) -> dict[int, int]:
    """Every stack's figures on its node under `root`; returns the exact-memory bytes allocated per node (by id)."""
    frames = ledger.stacks.frames
    index: dict[int, dict[int, Node]] = {}  # path-keyed children lookup, only while building
    alloc: dict[int, int] = {}
    for sid, st in ledger.stats.items():
        node = root
        for fid in ledger.stacks.stacks[sid]:
            kids = index.setdefault(id(node), {})
            child = kids.get(fid)
            if child is None:
                fn, file, line = frames[fid]
                child = Node(function=fn, file=file, line=line, other_policy_self_energy_j={})
                kids[fid] = child
                node.children.append(child)
            node = child
        _add_stack_figures(node, st, ledger.source_ids, share)
        allocated = st.alloc_bytes  # exact-memory mode: tracemalloc bytes per stack
        if allocated:
            alloc[id(node)] = alloc.get(id(node), 0) + int(allocated)
    return alloc


def _add_stack_figures(node: Node, st: Any, ids: list[str], share: bool) -> None:
    """One stack's time, CPU, samples, energy (both policies) and memory on its node."""
    node.self_time_s += st.time_ns / 1e9
    node.self_cpu_time_s += st.cpu_ns / 1e9
    node.self_samples += st.samples
    mine, other = (st.share, st.all) if share else (st.all, st.share)
    other_j = node.other_policy_self_energy_j if node.other_policy_self_energy_j is not None else {}
    for sid_, v, w in zip(ids, mine, other):
        node.self_energy_j[sid_] = node.self_energy_j.get(sid_, 0.0) + v
        other_j[sid_] = other_j.get(sid_, 0.0) + w
    node.other_policy_self_energy_j = other_j
    if st.samples:
        node.peak_rss_bytes = max(node.peak_rss_bytes or 0, st.peak_rss)
    node.self_rss_growth_bytes = int(round((node.self_rss_growth_bytes or 0) + st.rss_growth))


def _headline_cpu_s(ledger: Ledger) -> float:
    """The program's CPU between the first and last tick, energyprof's own taken out, its children's in."""
    first, last = ledger.first_tick, ledger.last_tick
    if first is None or last is None:
        return 0.0
    return ((last.process_cpu_ns - first.process_cpu_ns) - (last.own_cpu_ns - first.own_cpu_ns)
            + (last.children_cpu_ns - first.children_cpu_ns)) / 1e9


def _machine_load(ledger: Ledger, duration_s: float, cpu_s: float) -> MachineLoad | None:
    """The machine's busy CPU over the run beside the program's and energyprof's (None: the busy clock
    never moved, so it was not read)."""
    first, last = ledger.first_tick, ledger.last_tick
    if first is None or last is None or last.busy_cpu_ns <= first.busy_cpu_ns or duration_s <= 0:
        return None
    return MachineLoad(cpus=ledger.cpus, span_s=duration_s, busy_cpu_s=(last.busy_cpu_ns - first.busy_cpu_ns) / 1e9,
                       program_cpu_s=max(0.0, cpu_s), energyprof_cpu_s=max(0, last.own_cpu_ns - first.own_cpu_ns) / 1e9)


def _special_nodes(root: Node, ledger: Ledger, cpu_s: float, own: tuple[dict[str, float], dict[str, float]],
                   idle: tuple[dict[str, float], dict[str, float]]) -> list[Node]:
    """energyprof's own node (when it was charged anything), the idle node, and the unsampled CPU's node."""
    specials = []
    if any(ledger.own.share) or any(ledger.own.all):
        specials.append(Node(function=SELF_NODE, self_energy_j=own[0], other_policy_self_energy_j=own[1]))
    # Under `all` the idle node holds nothing (but a rank's peers' part), and keeps the share policy's figure.
    specials.append(Node(function=IDLE_NODE, self_energy_j=idle[0], other_policy_self_energy_j=idle[1]))
    unsampled = _unsampled_cpu(root, cpu_s, ledger.source_ids)
    if unsampled is not None:
        specials.append(unsampled)
    return specials


def _close_tree(root: Node, ledger: Ledger, alloc: dict[int, int], duration_s: float,
                peak_rss_exact_bytes: int | None) -> None:
    """The inclusive figures, group counts, allocated bytes, and the root's own time and peak."""
    _count_threads(root, ledger)  # first: it finds its nodes by the names the stacks gave them
    _count_groups(root, getattr(ledger, "process_info", {}))
    root.fill_inclusive()
    if alloc:
        _sum_alloc(root, alloc)
    root.time_s = max(root.time_s, duration_s)
    root.self_time_s = max(0.0, root.time_s - sum(c.time_s for c in root.children if not c.is_special))
    if peak_rss_exact_bytes is not None:
        root.peak_rss_bytes = max(root.peak_rss_bytes or 0, peak_rss_exact_bytes)


def _rest(whole: float, *parts: float) -> float:
    """`whole` less `parts`, where the parts may make up all of it: a difference within the sum's round-off
    (-2.2e-16 J when a source's energy all went to energyprof and idle) is 0, not a negative figure that the
    profile's reader refuses; a real shortfall stays as it is."""
    rest = whole - sum(parts)
    return 0.0 if rest < 0 and -rest <= 1e-9 * max(abs(whole), *map(abs, parts)) else rest


def _totals(ledger: Ledger, root: Node, timeline: Timeline, own: dict[str, float], idle: dict[str, float],
            duration_s: float, cpu_s: float, peak_rss_exact_bytes: int | None) -> Totals:
    ids = ledger.source_ids
    first, last = ledger.first_tick, ledger.last_tick
    rss = [r for r in timeline.rss_bytes if r]
    baseline = ledger.baseline_rss(rss)
    if peak_rss_exact_bytes is not None:
        # The kernel's mark is read from per-thread RSS counters that lag by up to 64 pages a
        # thread, so it came out 80-150 KB below a sampled reading in a third of runs: the exact
        # peak is at least what was seen.
        peak_rss_exact_bytes = max([peak_rss_exact_bytes, *rss, root.peak_rss_bytes or 0])
    return Totals(
        energy_j=_joules(ids, ledger.total),
        attributed_j={sid: _rest(root.energy_j.get(sid, 0.0), own.get(sid, 0.0), idle.get(sid, 0.0)) for sid in ids},
        energyprof_j=own, idle_j=idle, duration_s=duration_s, cpu_time_s=max(0.0, cpu_s),
        energyprof_cpu_time_s=((last.own_cpu_ns - first.own_cpu_ns) / 1e9) if first and last else 0.0,
        baseline_rss_bytes=baseline, peak_rss_bytes=max(rss) if rss else baseline,
        peak_rss_exact_bytes=peak_rss_exact_bytes,
    )


def _windows(ledger: Ledger, start: int, policy: IdlePolicy, rank_of: dict[int, int | None]) -> list[Window]:
    """The ledger's windows on the run's clock, each with its process's rank."""
    return [window_record(a, policy, start, rank_of.get(a.pid)) for a in ledger.accounts()]


def _ledger_notes(ledger: Ledger) -> list[Note]:
    """What the fold itself has to say: sensor readings skipped, wait CPU moved."""
    out = [Note("sensor-anomaly", f"{k}: {v} reading(s) went backwards or were not numbers; those intervals "
                "were skipped", {"source": k, "count": v}) for k, v in ledger.anomalies.items()]
    if ledger.wait_cpu_moved_ns:
        moved = ledger.wait_cpu_moved_ns / 1e9
        out.append(Note("wait-cpu", f"{moved:.3g} CPU-s that threads were seen with while sampled in a wait "
                        "(select, a queue, a lock) went, with its energy, to the stacks the same threads "
                        "were seen running: a sample sees a stack only at its end, and a blocked thread "
                        "burns no CPU", {"cpu_s": moved}))
    return out


def _note(n: Note | dict[str, Any]) -> Note:
    return n if isinstance(n, Note) else Note(str(n.get("kind", "note")), str(n.get("message", "")),
                                              {k: v for k, v in n.items() if k not in ("kind", "message")})


def _count_groups(root: Node, process_info: dict[int, dict[str, Any]]) -> None:
    """`[processes: pool worker]` -> `[processes: pool worker x4]`: how many processes the one node holds."""
    counts: dict[str, int] = {}
    for info in process_info.values():
        group = info.get("group")
        if isinstance(group, str):
            counts[group] = counts.get(group, 0) + 1
    if not counts:
        return
    for node, _ in root.walk():
        n = counts.get(node.function)
        if n is not None:
            node.function = f"{node.function[:-1]} x{n}]"


def _count_threads(root: Node, ledger: Ledger) -> None:
    """`[threads: burn_in_thread]` -> `[threads: burn_in_thread x150]`: how many threads ran under the node,
    summed over the processes whose threads share it (a pool's workers)."""
    stacks, frames = ledger.stacks.stacks, ledger.stacks.frames
    found: dict[int, tuple[Node, int]] = {}
    for counts in getattr(ledger, "thread_counts", {}).values():
        for sid, n in counts.items():
            node: Node | None = root
            for fid in stacks[sid] if 0 <= sid < len(stacks) else ():
                fn, file, line = frames[fid]
                node = next((c for c in node.children if (c.function, c.file, c.line) == (fn, file, line)), None)
                if node is None:
                    break  # no sample reached it: no node to name
            if node is not None and node is not root and node.function.startswith(THREAD_PREFIX):
                _, total = found.get(id(node), (node, 0))
                found[id(node)] = (node, total + n)
    for node, n in found.values():
        node.function = f"{node.function[:-1]} x{n}]"


def _unsampled_cpu(root: Node, headline_cpu_s: float, source_ids: list[str]) -> Node | None:
    """The headline CPU that no sample carried, as its own node when it is more than UNSAMPLED_CPU_SHOWN
    of the headline (below that the tree adds up closely enough), so the tree's CPU adds up to it."""
    sampled = sum(n.self_cpu_time_s for n, _ in root.walk())
    gap = headline_cpu_s - sampled
    if headline_cpu_s <= 0 or gap <= UNSAMPLED_CPU_SHOWN * headline_cpu_s:
        return None
    return Node(function=UNSAMPLED_CPU_NODE, self_cpu_time_s=gap, self_energy_j={sid: 0.0 for sid in source_ids},
                other_policy_self_energy_j={sid: 0.0 for sid in source_ids})


def _source_fields(raw: dict[str, Any]) -> dict[str, Any]:
    known = {"id", "component", "method", "sensor", "detail", "update_period_s", "tier"}
    out = {k: v for k, v in raw.items() if k in known}
    out["extra"] = {k: v for k, v in raw.items() if k not in known}
    return out


def _processes(ledger: Ledger, policy: str, child_processes: Iterable[dict[str, Any]], cpu_s: float) -> list[Process]:
    """The job's processes: the ledger's table when it keeps one, else the children the collector saw.

    The ledger's rows add up to the headline CPU `cpu_s`: the program's row takes what the whole
    tree's figure (the kernel's, for the waited-for program and the children it waited for) holds
    beyond every row's own, which is its shutdown after the last reading of it, and any child too
    short-lived to have a row."""
    ledger_rows = process_table(ledger, policy)
    # the other policy's figures beside them, as every node keeps them, so the rows add up to the program
    # under either (`report --idle`, a merged job)
    other = {r["pid"]: r["energy_j"] for r in process_table(ledger, other_policy(policy))} if ledger_rows else {}
    rows = ledger_rows or [{**c, "role": c.get("role", "child")} for c in child_processes]
    out = []
    for r in rows:
        if isinstance(r, Process):
            out.append(r)
        else:
            known = {k: v for k, v in dict(r).items() if k in field_names(Process)}
            if known.get("pid") in other:
                known["other_policy_energy_j"] = other[known["pid"]]
            out.append(Process(**known))
    rest = cpu_s - sum(p.cpu_time_s for p in out)
    main = next((i for i, p in enumerate(out) if p.role == "main"), None)
    if ledger_rows and main is not None and rest > 0:
        out[main] = replace(out[main], cpu_time_s=out[main].cpu_time_s + rest)
    return _parents_first(out)


def _parents_first(rows: list[Process]) -> list[Process]:
    """The program first, every process after its parent, siblings by pid. Not by pid alone: pids
    wrap (at 32768 on many machines), and a child then has a smaller pid than its parent."""
    pids = {p.pid for p in rows}
    kids: dict[int | None, list[Process]] = {}
    for p in rows:
        kids.setdefault(p.parent_pid if p.parent_pid in pids else None, []).append(p)
    out: list[Process] = []
    todo = sorted(kids.get(None, []), key=lambda p: (p.role != "main", p.pid), reverse=True)
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(sorted(kids.get(p.pid, []), key=lambda c: c.pid, reverse=True))
    placed = {id(p) for p in out}  # a loop of reused pids reaches no root: listed after the rest
    return out + sorted((p for p in rows if id(p) not in placed), key=lambda p: p.pid)


def _sum_alloc(root: Node, alloc: dict[int, int]) -> None:
    """Inclusive allocated bytes, bottom-up without recursion."""
    total: dict[int, int] = {}
    for node in reversed([n for n, _ in root.walk()]):
        t = alloc.get(id(node), 0) + sum(total[id(c)] for c in node.children)
        total[id(node)] = t
        if not node.is_special:
            node.alloc_bytes = t


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


def window_record(a: WindowAccount, policy: IdlePolicy, start_ns: int, rank: int | None = None) -> Window:
    """The profile's Window of one window's account: times from the run's start, the program's
    part under the run's policy with the other's beside it."""
    return Window(name=a.name, index=a.index, depth=a.depth, start_s=(a.start_ns - start_ns) / 1e9,
                  end_s=(a.end_ns - start_ns) / 1e9, time_s=a.time_s, energy_j=a.machine(),
                  program_energy_j=a.program(policy), other_policy_program_energy_j=a.program(other_policy(policy)),
                  loop=dict(a.loop), pid=a.pid, rank=rank)
