"""Join the profiles of one job (per rank, per node) into one Profile. Pure: Profiles in, a Profile out.

Profiles are grouped by machine (the kernel boot id that measured them, else the host name), and a node's profiles into runs
that overlapped in time. The ranks of a run all read the same machine, so its machine energy
is taken once per source: from the profile whose readings span the longest (the rank elected
reader on a tie), never summed over its ranks. Runs of one node that did not overlap are
added (and a note says so). Windows keep the program's part of them under both policies.
Each rank keeps what it was charged (its CPU share of the machine under `share`), so the
ranks' figures add up; what none of them was charged is the node's idle. Under `all` the
node's program energy (the machine less energyprof's part) is split among its ranks in
proportion to their own `all` figures. The job's totals are the sum over nodes, so
conservation (every node's self energy adds up to the totals, per source) holds by
construction, under both policies.
"""

from __future__ import annotations

import bisect
import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from ..facts.profile import IDLE_NODE, SELF_NODE, Node, Note, Process, Profile, ProfileFormatError, Source, Timeline, \
    Totals, Window
from .ledger import remainder
from ..facts.policy import PolicyError
from ..facts.policy import check_policy
from ..facts.policy import common_policy

NODE_PREFIX = "[node "
RANK_PREFIX = "[rank "


class MergeError(ValueError):
    """Profiles that cannot be joined (one line for the user)."""


@dataclass
class _Member:
    profile: Profile  # under the share policy
    label: str
    rank: int | None
    world_size: int | None
    reader: bool
    start: float | None  # wall-clock start, seconds since the epoch
    own_all: dict[str, float] = field(default_factory=dict)
    attr_all: dict[str, float] = field(default_factory=dict)


def _dist(p: Profile) -> dict[str, Any]:
    d = p.meta.get("distributed")
    return d if isinstance(d, dict) else {}


def machine_of(p: Profile) -> str:
    """The machine a profile's energy was read on: its kernel's boot id where the profile has one
    (ranks, containers and an engine's nodes on one machine share it), else its host (`host_of`)."""
    host = p.meta.get("host")
    if isinstance(host, dict) and host.get("boot_id"):
        return f"boot:{host['boot_id']}"
    return host_of(p)


def host_of(p: Profile) -> str:
    """The node a profile was measured on: the rank's host and node index, or the run's host name."""
    d = _dist(p)
    if d.get("host"):
        node = d.get("node")
        return f"{d['host']}" if node in (None, "", "0") else f"{d['host']}:{node}"
    host = p.meta.get("host")
    if isinstance(host, dict) and host.get("name"):
        return str(host["name"])
    if isinstance(host, str) and host:
        return host
    return "localhost"


def _start(p: Profile) -> float | None:
    raw = p.meta.get("started_at")
    if not isinstance(raw, str):
        return None
    try:
        return _dt.datetime.fromisoformat(raw).timestamp()
    except ValueError:
        return None


def _add(into: dict[str, float], more: dict[str, float], k: float = 1.0) -> None:
    for s, v in more.items():
        into[s] = into.get(s, 0.0) + v * k


def _member(p: Profile, label: str) -> _Member:
    if "share" not in p.policies():
        raise MergeError(f"{label} holds figures for idle policy {p.idle_policy!r} only (written by an older"
                         " energyprof): it cannot be joined")
    p = p.with_policy("share")
    d = _dist(p)
    rank = d.get("rank") if isinstance(d.get("rank"), int) else None
    world = d.get("world_size") if isinstance(d.get("world_size"), int) else None
    m = _Member(p, label, rank, world, bool(d.get("reader")), _start(p))
    for c in p.root.children:
        if c.function == SELF_NODE:
            _add(m.own_all, c.other_policy_self_energy_j or {})
        elif c.function != IDLE_NODE:
            _add(m.attr_all, _inclusive_other(c))
    _add(m.attr_all, p.root.other_policy_self_energy_j or {})
    return m


def _inclusive_other(node: Node) -> dict[str, float]:
    out: dict[str, float] = {}
    for n, _ in node.walk():
        _add(out, n.other_policy_self_energy_j or {})
    return out


def _copy(node: Node, k_other: float) -> Node:
    """A copy of a subtree (without recursion), its other-policy figures scaled by `k_other`."""
    copies: dict[int, Node] = {}
    order = [n for n, _ in node.walk()]
    for n in order:
        other = None if n.other_policy_self_energy_j is None else \
            {s: v * k_other for s, v in n.other_policy_self_energy_j.items()}
        copies[id(n)] = Node(n.function, n.file, n.line, n.self_time_s, n.self_cpu_time_s, n.self_samples,
                             dict(n.self_energy_j), other, n.peak_rss_bytes, n.self_rss_growth_bytes, n.alloc_bytes)
    for n in order:
        copies[id(n)].children = [copies[id(c)] for c in n.children]
    return copies[id(node)]


def merge(profiles: list[Profile], labels: list[str] | None = None, world_size: int | None = None,
          policy: str | None = None, hosts: list[str] | None = None) -> Profile:
    """One job's Profile from its ranks' or nodes' profiles, under `policy` (default: the one the
    ranks were run under), the other policy's figures beside it. `world_size`: the ranks expected
    (default: what the profiles say); a missing rank is named in a note. `hosts`: the machines the
    job ran on (a cluster's nodes); one that sent no profile is named in a note."""
    if not profiles:
        raise MergeError("nothing to merge")
    try:
        chosen = check_policy(policy) if policy is not None else common_policy([p.idle_policy for p in profiles])
    except PolicyError as exc:
        raise MergeError(str(exc)) from None
    return _join_as_share(profiles, labels, world_size, hosts or []).with_policy(chosen)


def _join_as_share(profiles: list[Profile], labels: list[str] | None, world_size: int | None,
                   hosts: list[str]) -> Profile:
    """The join itself, its figures under `share` (each member seen under `share`), `all` beside them."""
    labels = list(labels) if labels else [f"profile {i + 1}" for i in range(len(profiles))]
    members = [_member(p, lab) for p, lab in zip(profiles, labels)]
    seen_ranks: dict[tuple[str, int], str] = {}
    nodes: dict[str, list[_Member]] = {}
    for m in members:
        machine = machine_of(m.profile)
        if m.rank is not None:
            key = (str(_dist(m.profile).get("job", "")), m.rank)
            if key in seen_ranks:
                raise MergeError(f"{m.label} and {seen_ranks[key]} are both rank {m.rank} of the same job")
            seen_ranks[key] = m.label
        nodes.setdefault(machine, []).append(m)
    t0 = min((m.start for m in members if m.start is not None), default=None)
    multi = len(nodes) > 1
    root = Node(function=str(profiles[0].meta.get("target") or "<job>"), other_policy_self_energy_j={})
    sources: dict[str, Source] = {}
    total: dict[str, float] = {}
    attributed: dict[str, float] = {}
    own: dict[str, float] = {}
    idle: dict[str, float] = {}
    own_o: dict[str, float] = {}
    idle_o: dict[str, float] = {}
    node_rows: list[dict[str, Any]] = []
    notes: list[Note] = []
    windows: list[Window] = []
    processes: list[Process] = []
    durations: list[float] = []
    timelines: list[tuple[float, Timeline]] = []
    cpu_s = own_cpu_s = 0.0
    peaks: list[int] = []
    io_by_node: dict[str, list[dict[str, Any]]] = {}
    for members_of_host in nodes.values():
        host = host_of(members_of_host[0].profile)
        runs = _runs(members_of_host)
        if len(runs) > 1:
            notes.append(Note("runs-added", f"{host}: {len(runs)} runs that did not overlap in time; their machine"
                              " energies are added, each counted once", {"host": host, "runs": len(runs)}))
        holder_parent = root
        if multi:
            holder_parent = Node(function=f"{NODE_PREFIX}{host}]", other_policy_self_energy_j={})
            root.children.append(holder_parent)
        host_duration = 0.0
        for group in runs:
            group.sort(key=lambda m: (m.rank is None, m.rank if m.rank is not None else 0))
            # The node's machine: the readings spanning longest (the elected reader on a tie).
            machine = max(group, key=lambda m: (m.profile.totals.duration_s, m.reader))
            m_energy = dict(machine.profile.totals.energy_j)
            n_attr: dict[str, float] = {}
            n_own: dict[str, float] = {}
            n_own_o: dict[str, float] = {}
            n_attr_o: dict[str, float] = {}
            for m in group:
                _add(n_attr, m.profile.totals.attributed_j)
                _add(n_own, m.profile.totals.energyprof_j)
                _add(n_own_o, m.own_all)
                _add(n_attr_o, m.attr_all)
                for s in m.profile.sources:
                    if s.id not in sources or ("rank" in s.extra and "rank" not in sources[s.id].extra):
                        sources[s.id] = s  # a GPU: the rank that uses it says so
            for s in set(n_attr) | set(n_own):
                charged = n_attr.get(s, 0.0) + n_own.get(s, 0.0)
                if charged > m_energy.get(s, 0.0):
                    m_energy[s] = charged  # shares taken apart can overshoot by rounding: never a negative idle
            n_idle = {s: remainder(e, n_attr.get(s, 0.0) + n_own.get(s, 0.0)) for s, e in m_energy.items()}
            # Under `all` the ranks share the node's program energy; one profile keeps its own figures.
            scale: dict[str, float] = {}
            for s, e in m_energy.items():
                want = max(0.0, e - n_own_o.get(s, 0.0))
                have = n_attr_o.get(s, 0.0)
                scale[s] = 1.0 if len(group) == 1 or have <= 0 else want / have
            n_idle_o = {s: remainder(e, n_own_o.get(s, 0.0) + n_attr_o.get(s, 0.0) * scale.get(s, 1.0))
                        for s, e in m_energy.items()}
            if len(group) == 1:  # one profile: its own figures, to the last bit
                only = group[0].profile
                n_idle = dict(only.totals.idle_j)
                n_idle_o = dict(next((c.other_policy_self_energy_j or {} for c in only.root.children
                                      if c.function == IDLE_NODE), n_idle_o))
            for m in group:
                p = m.profile
                if m.rank is not None and (len(group) > 1 or multi or len(members) > 1):
                    holder = Node(function=f"{RANK_PREFIX}{m.rank}]", other_policy_self_energy_j={})
                    holder_parent.children.append(holder)
                else:
                    holder = holder_parent
                _add(holder.self_energy_j, p.root.self_energy_j)
                other = holder.other_policy_self_energy_j if holder.other_policy_self_energy_j is not None else {}
                for s, v in (p.root.other_policy_self_energy_j or {}).items():
                    other[s] = other.get(s, 0.0) + v * scale.get(s, 1.0)
                holder.other_policy_self_energy_j = other
                holder.self_time_s += p.root.self_time_s
                holder.self_cpu_time_s += p.root.self_cpu_time_s
                holder.self_samples += p.root.self_samples
                for c in p.root.children:
                    if c.function in (SELF_NODE, IDLE_NODE):
                        continue
                    k = scale if len(group) > 1 else {}
                    copy = _copy(c, 1.0)
                    if k:
                        for n, _ in copy.walk():
                            if n.other_policy_self_energy_j is not None:
                                n.other_policy_self_energy_j = {s: v * k.get(s, 1.0)
                                                                for s, v in n.other_policy_self_energy_j.items()}
                    holder.children.append(copy)
                offset = (m.start - t0) if m.start is not None and t0 is not None else 0.0
                for w in p.windows:
                    windows.append(Window(w.name, w.index, w.depth, w.start_s + offset, w.end_s + offset, w.time_s,
                                          dict(w.energy_j), pid=w.pid, rank=w.rank if w.rank is not None else m.rank,
                                          node=host, program_energy_j=dict(w.program_energy_j),
                                          other_policy_program_energy_j={
                                              s: v * scale.get(s, 1.0) if len(group) > 1 else v
                                              for s, v in w.other_policy_program_energy_j.items()},
                                          loop=dict(w.loop)))
                for proc in p.processes:
                    rank = proc.rank if proc.rank is not None else (m.rank if proc.role == "main" else None)
                    role = "rank" if proc.role == "main" and m.rank is not None else proc.role
                    processes.append(Process(proc.pid, proc.parent_pid, proc.command, role, rank, proc.local_rank,
                                             proc.cpu_time_s, dict(proc.energy_j), proc.peak_rss_bytes, proc.exit,
                                             host=host))
                who = f"rank {m.rank}" if m.rank is not None else host
                for n in p.notes:
                    if not any(x.message == n.message for x in notes):
                        notes.append(Note(n.kind, n.message, {**n.extra, "from": who}))
                cpu_s += p.totals.cpu_time_s
                own_cpu_s += p.totals.energyprof_cpu_time_s
            node_peak = sum(m.profile.totals.peak_rss_bytes or 0 for m in group)
            if node_peak:
                peaks.append(node_peak)
            host_duration += machine.profile.totals.duration_s
            offset = (machine.start - t0) if machine.start is not None and t0 is not None else 0.0
            timelines.append((offset, machine.profile.timeline))
            io = machine.profile.extra.get("io")
            if isinstance(io, dict):  # the node's I/O, as its machine's profile read it, on the job's clock
                io_by_node.setdefault(host, []).append(_shift_io(io, offset))
            _add(total, m_energy)
            _add(attributed, n_attr)
            _add(own, n_own)
            _add(idle, n_idle)
            _add(own_o, n_own_o)
            _add(idle_o, n_idle_o)
            node_rows.append({"host": host, "ranks": [m.rank for m in group if m.rank is not None],
                              "reader_rank": machine.rank, "duration_s": machine.profile.totals.duration_s,
                              "energy_j": m_energy, "attributed_j": n_attr, "energyprof_j": n_own, "idle_j": n_idle})
        durations.append(host_duration)
    root.children.append(Node(function=SELF_NODE, self_energy_j=own, other_policy_self_energy_j=own_o))
    root.children.append(Node(function=IDLE_NODE, self_energy_j=idle, other_policy_self_energy_j=idle_o))
    root.fill_inclusive()
    duration = max(durations, default=0.0)
    root.time_s = max(root.time_s, duration)
    expected = world_size or max((m.world_size or 0 for m in members), default=0)
    present = sorted({m.rank for m in members if m.rank is not None})
    missing = [r for r in range(expected) if r not in present]
    if missing:
        names = ", ".join(str(r) for r in missing)
        notes.append(Note("missing-rank", f"rank{'s' if len(missing) > 1 else ''} {names} left no profile:"
                          " {} energy is in the node's idle, not in any rank".format(
                              "their" if len(missing) > 1 else "its"), {"ranks": missing}))
    sent = {host_of(m.profile) for m in members} | {str(m.profile.meta.get("host", {}).get("name", ""))
                                                     for m in members if isinstance(m.profile.meta.get("host"), dict)}
    silent = [h for h in hosts if h not in sent]
    if silent:
        notes.append(Note("missing-machine", f"machine{'s' if len(silent) > 1 else ''} {', '.join(silent)} sent no"
                          " profile: {} energy is in no figure of this job".format("their" if len(silent) > 1 else "its"),
                          {"hosts": silent}))
    meta = dict(profiles[0].meta)
    meta["idle_policy"] = "share"  # merge() turns the join to the chosen policy
    meta["duration_s"] = duration
    meta["distributed"] = {"mode": "merged", "world_size": expected or None, "ranks": present,
                           "missing_ranks": missing, "nodes": node_rows, "merged_from": labels}
    totals = Totals(energy_j=total, attributed_j=attributed, energyprof_j=own, idle_j=idle, duration_s=duration,
                    cpu_time_s=cpu_s, energyprof_cpu_time_s=own_cpu_s,
                    peak_rss_bytes=max(peaks) if peaks else None)
    try:
        return Profile(meta=meta, sources=list(sources.values()), totals=totals, root=root, windows=windows,
                       timeline=_timeline(timelines), notes=notes, processes=processes, extra=_merged_io(io_by_node))
    except ProfileFormatError as exc:
        raise MergeError(str(exc)) from None


def _shift_io(io: dict[str, Any], offset: float) -> dict[str, Any]:
    if "t_s" not in io:
        return dict(io)  # {"absent": why}
    return {**io, "t_s": [t + offset for t in io["t_s"]]}


def _merged_io(io_by_node: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The profile's `io`: one node's one run as it was (its windows' figures still read from it); with more
    (nodes, or runs that did not overlap), each node's runs under `nodes`, kept as facts, not added (a
    node's counters are its own disks')."""
    if not io_by_node:
        return {}
    if len(io_by_node) == 1 and len(next(iter(io_by_node.values()))) == 1:
        return {"io": next(iter(io_by_node.values()))[0]}
    return {"io": {"nodes": io_by_node}}


def _runs(group: list[_Member]) -> list[list[_Member]]:
    """A node's profiles in runs that overlapped in time (by wall-clock start and duration): the
    node's machine is counted once per run, and runs that did not overlap are added."""
    timed = sorted((m for m in group if m.start is not None), key=lambda m: m.start or 0.0)
    runs: list[list[_Member]] = []
    end = 0.0
    for m in timed:
        assert m.start is not None
        stop = m.start + m.profile.totals.duration_s
        if runs and m.start < end:
            runs[-1].append(m)
            end = max(end, stop)
        else:
            runs.append([m])
            end = stop
    untimed = [m for m in group if m.start is None]  # no start recorded: taken as the first run's
    if untimed:
        if runs:
            runs[0].extend(untimed)
        else:
            runs.append(untimed)
    return runs


def _timeline(parts: list[tuple[float, Timeline]]) -> Timeline:
    """The nodes' power over the job: the longest node's buckets, each other node's power added
    where its own bucket covers the bucket's middle."""
    parts = [(o, t) for o, t in parts if t]
    if not parts:
        return Timeline()
    base_off, base = max(parts, key=lambda p: (p[1].end_s[-1] if p[1].end_s else 0.0) + p[0])
    t_s = [t + base_off for t in base.t_s]
    start_s = [t + base_off for t in base.start_s] if base.start_s else []
    end_s = [t + base_off for t in base.end_s] if base.end_s else []
    power = {s: list(v) for s, v in base.power_w.items()}
    rss = list(base.rss_bytes)
    functions = [list(f) for f in base.functions]
    index = {tuple(f): i for i, f in enumerate(functions)}
    active = [list(a) for a in base.active]
    for off, tl in parts:
        if tl is base:
            continue
        for i in range(len(t_s)):
            mid = (start_s[i] + end_s[i]) / 2 if start_s and end_s else t_s[i]
            j = _bucket(tl, mid - off)
            if j is None:
                continue
            for s, values in tl.power_w.items():
                row = power.setdefault(s, [0.0] * len(t_s))
                if j < len(values):
                    row[i] += values[j]
            if i < len(rss) and j < len(tl.rss_bytes):
                rss[i] += tl.rss_bytes[j]
            if i < len(active) and j < len(tl.active):
                for k in tl.active[j]:
                    if 0 <= k < len(tl.functions):
                        key = tuple(tl.functions[k])
                        if key not in index:
                            index[key] = len(functions)
                            functions.append(list(key))
                        if index[key] not in active[i]:
                            active[i].append(index[key])
    return Timeline(t_s=t_s, start_s=start_s, end_s=end_s, power_w=power, rss_bytes=rss, functions=functions,
                    active=active)


def _bucket(tl: Timeline, t: float) -> int | None:
    """The index of the bucket of `tl` that holds time `t` (buckets are in time order)."""
    if not tl.start_s or not tl.end_s:
        return None
    j = bisect.bisect_right(tl.start_s, t) - 1
    return j if 0 <= j < len(tl.end_s) and t < tl.end_s[j] else None
