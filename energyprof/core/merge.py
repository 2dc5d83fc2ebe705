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
from typing import Any

from ..record import field, record, replace
from ..facts.profile import IDLE_NODE, SELF_NODE, Node, Note, Process, Profile, ProfileFormatError, Source, Timeline, \
    Totals, Window
from ..facts.records import GpuDevice, GpuKernels, GpuSchedule, GpuStack
from .ledger import remainder
from ..facts.policy import PolicyError
from ..facts.policy import check_policy
from ..facts.policy import common_policy

NODE_PREFIX = "[node "
RANK_PREFIX = "[rank "


class MergeError(ValueError):
    """Profiles that cannot be joined (one line for the user)."""


@record
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
    return p.known_meta.distributed or {}


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
    _refuse_a_run_twice(profiles, labels)
    try:
        chosen = check_policy(policy) if policy is not None else common_policy([p.idle_policy for p in profiles])
    except PolicyError as exc:
        raise MergeError(str(exc)) from None
    return _join_as_share(profiles, labels, world_size, hosts or []).with_policy(chosen)


def run_identity(p: Profile) -> tuple[str, int, str] | None:
    """What tells one run from every other: its machine's boot, its process and its start (to the
    microsecond); None for a profile that lacks one of them (a joined profile has no single run)."""
    host, pid, started = p.meta.get("host"), p.meta.get("pid"), p.meta.get("started_at")
    boot = host.get("boot_id") if isinstance(host, dict) else None
    if not (isinstance(boot, str) and boot and isinstance(pid, int) and isinstance(started, str) and started):
        return None
    return boot, pid, started


def _refuse_a_run_twice(profiles: list[Profile], labels: list[str] | None) -> None:
    """The same run given twice (one file named twice, or a copy of it) would count its energy twice."""
    seen: dict[tuple[str, int, str], str] = {}
    for i, p in enumerate(profiles):
        label = labels[i] if labels and i < len(labels) else f"profile {i + 1}"
        key = run_identity(p)
        if key is None:
            continue
        if key in seen:
            raise MergeError(f"{seen[key]} and {label} are the same run (process {key[1]}, started {key[2]}):"
                             " merging it twice would count its energy twice")
        seen[key] = label


def _join_as_share(profiles: list[Profile], labels: list[str] | None, world_size: int | None,
                   hosts: list[str]) -> Profile:
    """The join itself, its figures under `share` (each member seen under `share`), `all` beside them."""
    labels = list(labels) if labels else [f"profile {i + 1}" for i in range(len(profiles))]
    members = [_member(p, lab) for p, lab in zip(profiles, labels)]
    machines = _group_by_machine(members)
    job = _Job(root=Node(function=str(profiles[0].meta.get("target") or "<job>"), other_policy_self_energy_j={}),
               t0=min((m.start for m in members if m.start is not None), default=None),
               multi=len(machines) > 1, several=len(members) > 1)
    for members_of_machine in machines.values():
        _join_machine(job, members_of_machine)
    return _job_profile(job, profiles[0].meta, members, labels, world_size, hosts)


def _group_by_machine(members: list[_Member]) -> dict[str, list[_Member]]:
    """The members by the machine that measured them; two profiles of one rank of one job are refused."""
    seen_ranks: dict[tuple[str, int], str] = {}
    machines: dict[str, list[_Member]] = {}
    for m in members:
        if m.rank is not None:
            key = (str(_dist(m.profile).get("job", "")), m.rank)
            if key in seen_ranks:
                raise MergeError(f"{m.label} and {seen_ranks[key]} are both rank {m.rank} of the same job")
            seen_ranks[key] = m.label
        machines.setdefault(machine_of(m.profile), []).append(m)
    return machines


@record
class _GpuPart:
    """One member's kernel facts as the job holds them: under the tree nodes its samples went under."""
    kernels: GpuKernels
    prefix: tuple[tuple[str, str, int], ...]  # the frames of `[node host]` and `[rank R]` above its tree, outermost first
    offset_s: float  # where its clock's zero is on the job's
    scale: dict[str, float]  # the factor on its `all` figures, per source (empty: 1)


@record
class _Job:
    """The joined job as it is built, machine by machine: its tree and the figures summed over its nodes."""
    root: Node
    t0: float | None  # the earliest member's wall-clock start: the job's clock starts there
    multi: bool  # more than one machine: each gets a `[node host]` node
    several: bool  # more than one profile: each rank gets a `[rank R]` node
    sources: dict[str, Source] = field(default_factory=dict)
    total: dict[str, float] = field(default_factory=dict)
    attributed: dict[str, float] = field(default_factory=dict)
    own: dict[str, float] = field(default_factory=dict)
    idle: dict[str, float] = field(default_factory=dict)
    own_all: dict[str, float] = field(default_factory=dict)
    idle_all: dict[str, float] = field(default_factory=dict)
    node_rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    timelines: list[tuple[float, Timeline]] = field(default_factory=list)
    cpu_s: float = 0.0
    own_cpu_s: float = 0.0
    peaks: list[int] = field(default_factory=list)
    io_by_node: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    gpu: list[_GpuPart] = field(default_factory=list)  # each member's kernel facts, where it has them

    def offset(self, start: float | None) -> float:
        """Where a profile that started at `start` begins on the job's clock."""
        return (start - self.t0) if start is not None and self.t0 is not None else 0.0


@record
class _RunEnergy:
    """One run of one node: its machine's energy, taken once, and how the members' figures split it."""
    machine: dict[str, float]
    attributed: dict[str, float]
    own: dict[str, float]
    idle: dict[str, float]
    own_all: dict[str, float]
    idle_all: dict[str, float]
    scale_all: dict[str, float]  # the factor on the members' `all` figures (1.0 for one profile)


def _join_machine(job: _Job, members: list[_Member]) -> None:
    """One machine's profiles into the job: each run that overlapped in time counts its machine once."""
    host = host_of(members[0].profile)
    runs = _runs(members)
    if len(runs) > 1:
        job.notes.append(Note("runs-added", f"{host}: {len(runs)} runs that did not overlap in time; their machine"
                              " energies are added, each counted once", {"host": host, "runs": len(runs)}))
    parent = job.root
    if job.multi:
        parent = Node(function=f"{NODE_PREFIX}{host}]", other_policy_self_energy_j={})
        job.root.children.append(parent)
    job.durations.append(sum((_join_run(job, group, host, parent) for group in runs), 0.0))


def _join_run(job: _Job, group: list[_Member], host: str, parent: Node) -> float:
    """One run of one node into the job, its members under `parent`; returns the run's duration."""
    group.sort(key=lambda m: (m.rank is None, m.rank if m.rank is not None else 0))
    # The node's machine: the readings spanning longest (the elected reader on a tie).
    machine = max(group, key=lambda m: (m.profile.totals.duration_s, m.reader))
    for m in group:
        _keep_sources(job.sources, m.profile)
    run = _run_energy(group, machine)
    above = () if parent is job.root else ((parent.function, parent.file, parent.line),)
    for m in group:
        holder = _rank_holder(job, m, parent, len(group))
        prefix = above + (() if holder is parent else ((holder.function, holder.file, holder.line),))
        _add_member(job, m, holder, host, run.scale_all if len(group) > 1 else None, prefix)
    node_peak = sum(m.profile.totals.peak_rss_bytes or 0 for m in group)
    if node_peak:
        job.peaks.append(node_peak)
    _add_machine_facts(job, machine, host)
    _add_run_totals(job, run)
    job.node_rows.append({"host": host, "ranks": [m.rank for m in group if m.rank is not None],
                          "reader_rank": machine.rank, "duration_s": machine.profile.totals.duration_s,
                          "energy_j": run.machine, "attributed_j": run.attributed, "energyprof_j": run.own,
                          "idle_j": run.idle})
    return machine.profile.totals.duration_s


def _keep_sources(sources: dict[str, Source], p: Profile) -> None:
    for s in p.sources:
        if s.id not in sources or ("rank" in s.extra and "rank" not in sources[s.id].extra):
            sources[s.id] = s  # a GPU: the rank that uses it says so


def _run_energy(group: list[_Member], machine: _Member) -> _RunEnergy:
    """The run's machine energy split between its members' charges, energyprof and the node's idle, under both
    policies."""
    energy = dict(machine.profile.totals.energy_j)
    attributed: dict[str, float] = {}
    own: dict[str, float] = {}
    own_all: dict[str, float] = {}
    attributed_all: dict[str, float] = {}
    for m in group:
        _add(attributed, m.profile.totals.attributed_j)
        _add(own, m.profile.totals.energyprof_j)
        _add(own_all, m.own_all)
        _add(attributed_all, m.attr_all)
    for s in set(attributed) | set(own):
        charged = attributed.get(s, 0.0) + own.get(s, 0.0)
        if charged > energy.get(s, 0.0):
            energy[s] = charged  # shares taken apart can overshoot by rounding: never a negative idle
    idle = {s: remainder(e, attributed.get(s, 0.0) + own.get(s, 0.0)) for s, e in energy.items()}
    scale = _scale_all(energy, own_all, attributed_all, len(group))
    idle_all = {s: remainder(e, own_all.get(s, 0.0) + attributed_all.get(s, 0.0) * scale.get(s, 1.0))
                for s, e in energy.items()}
    if len(group) == 1:  # one profile: its own figures, to the last bit
        only = group[0].profile
        idle = dict(only.totals.idle_j)
        idle_all = dict(next((c.other_policy_self_energy_j or {} for c in only.root.children
                              if c.function == IDLE_NODE), idle_all))
    return _RunEnergy(energy, attributed, own, idle, own_all, idle_all, scale)


def _scale_all(energy: dict[str, float], own_all: dict[str, float], attributed_all: dict[str, float],
               members: int) -> dict[str, float]:
    """Under `all` the ranks share the node's program energy (the machine less energyprof's part) in proportion
    to their own `all` figures; one profile keeps its own figures."""
    scale: dict[str, float] = {}
    for s, e in energy.items():
        want = max(0.0, e - own_all.get(s, 0.0))
        have = attributed_all.get(s, 0.0)
        scale[s] = 1.0 if members == 1 or have <= 0 else want / have
    return scale


def _rank_holder(job: _Job, m: _Member, parent: Node, run_size: int) -> Node:
    """The node a member's tree goes under: its own `[rank R]` node where the job has more than it, else `parent`."""
    if m.rank is not None and (run_size > 1 or job.multi or job.several):
        holder = Node(function=f"{RANK_PREFIX}{m.rank}]", other_policy_self_energy_j={})
        parent.children.append(holder)
        return holder
    return parent


def _add_member(job: _Job, m: _Member, holder: Node, host: str, scale: dict[str, float] | None,
                prefix: tuple[tuple[str, str, int], ...] = ()) -> None:
    """One member's tree, windows, processes, kernel facts, notes and CPU into the job; `scale`: the factor on
    its `all` figures (None: the run's only profile, its figures kept as they are); `prefix`: the frames of
    the nodes above its tree (`holder` and its parent)."""
    p = m.profile
    _add_root_figures(holder, p.root, scale or {})
    for c in p.root.children:
        if c.function not in (SELF_NODE, IDLE_NODE):
            holder.children.append(_scaled_copy(c, scale))
    offset = job.offset(m.start)
    job.windows.extend(_window_on_job_clock(w, offset, m.rank, host, scale) for w in p.windows)
    job.processes.extend(_process_of_job(proc, m.rank, host, scale) for proc in p.processes)
    if p.gpu_kernels is not None:
        job.gpu.append(_GpuPart(p.gpu_kernels, prefix, offset, dict(scale or {})))
    who = f"rank {m.rank}" if m.rank is not None else host
    for n in p.notes:
        if not any(x.message == n.message for x in job.notes):
            job.notes.append(Note(n.kind, n.message, {**n.extra, "from": who}))
    job.cpu_s += p.totals.cpu_time_s
    job.own_cpu_s += p.totals.energyprof_cpu_time_s


def _add_root_figures(holder: Node, root: Node, scale: dict[str, float]) -> None:
    """A member's root figures (the time no function of it held) added to its holder's."""
    _add(holder.self_energy_j, root.self_energy_j)
    other = holder.other_policy_self_energy_j if holder.other_policy_self_energy_j is not None else {}
    for s, v in (root.other_policy_self_energy_j or {}).items():
        other[s] = other.get(s, 0.0) + v * scale.get(s, 1.0)
    holder.other_policy_self_energy_j = other
    holder.self_time_s += root.self_time_s
    holder.self_cpu_time_s += root.self_cpu_time_s
    holder.self_samples += root.self_samples


def _scaled_copy(node: Node, scale: dict[str, float] | None) -> Node:
    """A copy of a subtree, its `all` figures scaled per source by `scale` (None or empty: as they are)."""
    copy = _copy(node, 1.0)
    if scale:
        for n, _ in copy.walk():
            if n.other_policy_self_energy_j is not None:
                n.other_policy_self_energy_j = {s: v * scale.get(s, 1.0) for s, v in n.other_policy_self_energy_j.items()}
    return copy


def _window_on_job_clock(w: Window, offset: float, rank: int | None, host: str, scale: dict[str, float] | None) -> Window:
    """A member's window on the job's clock, named by its rank and node, its `all` figures scaled."""
    return Window(w.name, w.index, w.depth, w.start_s + offset, w.end_s + offset, w.time_s, dict(w.energy_j), pid=w.pid,
                  rank=w.rank if w.rank is not None else rank, node=host, program_energy_j=dict(w.program_energy_j),
                  other_policy_program_energy_j={s: v * scale.get(s, 1.0) if scale is not None else v
                                                 for s, v in w.other_policy_program_energy_j.items()},
                  loop=dict(w.loop))


def _process_of_job(proc: Process, rank: int | None, host: str, scale: dict[str, float] | None) -> Process:
    """A member's process in the job's processes table: its main process is the rank's. Its `all` figures are
    scaled as its tree's are, so the rows add up to the job's program under either policy."""
    rank_of = proc.rank if proc.rank is not None else (rank if proc.role == "main" else None)
    role = "rank" if proc.role == "main" and rank is not None else proc.role
    other = proc.other_policy_energy_j
    if other is not None and scale:
        other = {s: v * scale.get(s, 1.0) for s, v in other.items()}
    return Process(proc.pid, proc.parent_pid, proc.command, role, rank_of, proc.local_rank, proc.cpu_time_s,
                   dict(proc.energy_j), proc.peak_rss_bytes, proc.exit, host=host,
                   other_policy_energy_j=dict(other) if other is not None else None)


def _add_machine_facts(job: _Job, machine: _Member, host: str) -> None:
    """The run's timeline and I/O, as its machine's profile read them, on the job's clock."""
    offset = job.offset(machine.start)
    job.timelines.append((offset, machine.profile.timeline))
    io = machine.profile.extra.get("io")
    if isinstance(io, dict):
        job.io_by_node.setdefault(host, []).append(_shift_io(io, offset))


def _add_run_totals(job: _Job, run: _RunEnergy) -> None:
    _add(job.total, run.machine)
    _add(job.attributed, run.attributed)
    _add(job.own, run.own)
    _add(job.idle, run.idle)
    _add(job.own_all, run.own_all)
    _add(job.idle_all, run.idle_all)


def _job_profile(job: _Job, meta0: dict[str, Any], members: list[_Member], labels: list[str], world_size: int | None,
                 hosts: list[str]) -> Profile:
    """The joined Profile: the tree closed with energyprof's and the idle nodes, the notes on ranks and machines
    that sent nothing, the job's meta and totals."""
    root = job.root
    root.children.append(Node(function=SELF_NODE, self_energy_j=job.own, other_policy_self_energy_j=job.own_all))
    root.children.append(Node(function=IDLE_NODE, self_energy_j=job.idle, other_policy_self_energy_j=job.idle_all))
    root.fill_inclusive()
    duration = max(job.durations, default=0.0)
    root.time_s = max(root.time_s, duration)
    expected = world_size or max((m.world_size or 0 for m in members), default=0)
    present = sorted({m.rank for m in members if m.rank is not None})
    missing = [r for r in range(expected) if r not in present]
    job.notes.extend(_missing_rank_notes(missing) + _silent_machine_notes(members, hosts))
    meta = dict(meta0)
    meta["idle_policy"] = "share"  # merge() turns the join to the chosen policy
    meta["duration_s"] = duration
    meta["distributed"] = {"mode": "merged", "world_size": expected or None, "ranks": present,
                           "missing_ranks": missing, "nodes": job.node_rows, "merged_from": labels}
    totals = Totals(energy_j=job.total, attributed_j=job.attributed, energyprof_j=job.own, idle_j=job.idle,
                    duration_s=duration, cpu_time_s=job.cpu_s, energyprof_cpu_time_s=job.own_cpu_s,
                    peak_rss_bytes=max(job.peaks) if job.peaks else None)
    try:
        return Profile(meta=meta, sources=list(job.sources.values()), totals=totals, root=root, windows=job.windows,
                       timeline=_timeline(job.timelines), notes=job.notes, processes=job.processes,
                       extra=_merged_io(job.io_by_node), gpu_kernels=_merged_gpu(job.gpu))
    except ProfileFormatError as exc:
        raise MergeError(str(exc)) from None


def _missing_rank_notes(missing: list[int]) -> list[Note]:
    if not missing:
        return []
    names = ", ".join(str(r) for r in missing)
    return [Note("missing-rank", f"rank{'s' if len(missing) > 1 else ''} {names} left no profile:"
                 " {} energy is in the node's idle, not in any rank".format("their" if len(missing) > 1 else "its"),
                 {"ranks": missing})]


def _silent_machine_notes(members: list[_Member], hosts: list[str]) -> list[Note]:
    """The cluster's machines (`hosts`) that sent no profile."""
    sent = {host_of(m.profile) for m in members} | {str(m.profile.meta.get("host", {}).get("name", ""))
                                                     for m in members if isinstance(m.profile.meta.get("host"), dict)}
    silent = [h for h in hosts if h not in sent]
    if not silent:
        return []
    return [Note("missing-machine", f"machine{'s' if len(silent) > 1 else ''} {', '.join(silent)} sent no"
                 " profile: {} energy is in no figure of this job".format("their" if len(silent) > 1 else "its"),
                 {"hosts": silent})]


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


# ---------------------------------------------------------------- GPU kernels


def _merged_gpu(parts: list[_GpuPart]) -> GpuKernels | None:
    """The members' kernel facts as one (facts/records.GpuKernels), as the tree joins their samples: each
    launch stack under the `[node host]` and `[rank R]` nodes its member's tree went under, so ranks and
    nodes stay apart; a device's figures summed over the members that used it, as the sources' are.

    Bars: a node above a member's tree holds, on a device, every stack of the members beneath it; its bar is
    the sum of their outermost nodes' bars (a bound: worst cases are not taken to cancel). A member with a
    stack that has no node bars (an older file) gives its stacks none, and each then counts its own bar.
    The other policy: a device's `other_policy_energy_j` sums the members' (each scaled as its tree's `all`
    figures are); where members of one device were split at different ratios, its total under `all` is
    exact and each stack's is its part of it."""
    if not parts:
        return None
    top_bars: dict[tuple[int, int], dict[Any, float] | None] = {}  # (part, device) -> outermost node -> its bar
    for i, part in enumerate(parts):
        for st in part.kernels.stacks:
            key = (i, st.device)
            tops = top_bars.setdefault(key, {})
            if tops is None:
                continue
            if st.node_error_j is None or not st.path:
                top_bars[key] = None
            else:
                tops[tuple(st.path[0])] = st.node_error_j[0]
    above: dict[tuple[int, Any], float] = {}  # (device, prefix) -> the bar of the node at that prefix
    for (i, device), tops in top_bars.items():
        if tops is None:
            continue
        prefix = parts[i].prefix
        for depth in range(1, len(prefix) + 1):
            key = (device, prefix[:depth])
            above[key] = above.get(key, 0.0) + sum(tops.values())
    stacks: list[GpuStack] = []
    for i, part in enumerate(parts):
        prefix = part.prefix
        for st in part.kernels.stacks:
            bars = None
            if top_bars.get((i, st.device)) is not None and st.node_error_j is not None:
                bars = [above[(st.device, prefix[:d])] for d in range(1, len(prefix) + 1)] + list(st.node_error_j)
            stacks.append(replace(st, path=[*prefix, *(tuple(f) for f in st.path)], node_error_j=bars,
                                  kernels=list(st.kernels)))
    devices: dict[str, list[tuple[_GpuPart, GpuDevice]]] = {}
    for part in parts:
        for d, dev in part.kernels.devices.items():
            devices.setdefault(d, []).append((part, dev))
    cycles = [p.kernels.cycles for p in parts if p.kernels.cycles is not None]
    clock = [p.kernels.clock_error_ns for p in parts if p.kernels.clock_error_ns is not None]
    extra: dict[str, Any] = {}
    for p in parts:
        extra.update(p.kernels.extra)
    return GpuKernels(method="; ".join(dict.fromkeys(p.kernels.method for p in parts)),
                      devices={d: _merged_device(v) for d, v in sorted(devices.items())}, stacks=stacks,
                      records=sum(p.kernels.records for p in parts), cycles=sum(cycles) if cycles else None,
                      clock_error_ns=max(clock) if clock else None, unplaced=_summed(p.kernels.unplaced for p in parts),
                      fold=_summed(p.kernels.fold for p in parts), schedule=_merged_schedule(parts), extra=extra)


def _merged_device(held: list[tuple[_GpuPart, GpuDevice]]) -> GpuDevice:
    """One device's figures over the members that used it: energies, times and bars summed, shares weighted
    by energy, the busy lanes on the job's clock."""
    devs = [d for _, d in held]
    energy = sum(d.energy_j for d in devs)

    def weighted(values: list[float | None]) -> float | None:
        if any(v is None for v in values):
            return None
        return _weighted_mean(values, [d.energy_j for d in devs])  # type: ignore[arg-type]

    other = [None if d.other_policy_energy_j is None else d.other_policy_energy_j * part.scale.get(d.source, 1.0)
             for part, d in held]
    idle_bars = [d.idle_error_j for d in devs]
    lane = sorted(([c[0] + part.offset_s, c[1] + part.offset_s, c[2]] for part, d in held for c in d.busy_lane),
                  key=lambda c: (c[0], c[1]))
    return GpuDevice(devs[0].source, energy, sum(d.idle_j for d in devs), sum(d.busy_s for d in devs),
                     max(d.update_period_s for d in devs), sum(d.short_j for d in devs),
                     weighted([d.short_share for d in devs]) or 0.0, sum(d.unmeasured_busy_s for d in devs),
                     idle_error_j=None if any(b is None for b in idle_bars) else sum(idle_bars),  # type: ignore[arg-type]
                     split_share=weighted([d.split_share for d in devs]),
                     other_policy_energy_j=None if any(o is None for o in other) else sum(other),  # type: ignore[arg-type]
                     busy_lane=lane)


def _merged_schedule(parts: list[_GpuPart]) -> GpuSchedule | None:
    """The profiled spans of every member that ran its capture on a schedule (each span on its member's
    clock), their count and time added, each device's profiled share weighted by its energy."""
    held = [p.kernels for p in parts if p.kernels.schedule is not None]
    if not held:
        return None
    by_device: dict[str, tuple[list[float], list[float]]] = {}
    for k in held:
        assert k.schedule is not None
        for d, x in k.schedule.profiled_share.items():
            xs, ws = by_device.setdefault(d, ([], []))
            xs.append(x)
            ws.append(k.devices[d].energy_j if d in k.devices else 0.0)
    spans = [list(x) for k in held for x in k.schedule.spans_ns][:1000]  # type: ignore[union-attr]
    return GpuSchedule(spans, sum(k.schedule.windows for k in held),  # type: ignore[union-attr]
                       sum(k.schedule.profiled_s for k in held),  # type: ignore[union-attr]
                       {d: _weighted_mean(xs, ws) for d, (xs, ws) in by_device.items()})


def _weighted_mean(values: list[float], weights: list[float]) -> float:
    """The mean of `values` weighted by `weights` (energies); the plain mean where they hold none."""
    total = sum(weights)
    if total > 0:
        return sum(v * w for v, w in zip(values, weights)) / total
    return sum(values) / len(values) if values else 0.0


def _summed(dicts: Any) -> dict[str, Any]:
    """Counts added over the members; a width (the fold's `cell_ns`) is the widest."""
    out: dict[str, Any] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = max(out.get(k, 0), v) if k.endswith("_ns") and not k.endswith("cpu_ns") else out.get(k, 0) + v
    return out
