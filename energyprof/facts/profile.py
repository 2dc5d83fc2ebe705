"""The Profile: facts of one run (joules, seconds, samples, bytes, sources, processes, windows) and its JSON.

Every view (report, exports, carbon, cost) is computed from these facts by `analysis`; nothing here
is a rendering choice and nothing edits a Profile once it is built. Saved as `energyprof.profile/2`
(a flat node table with parent indices, so any depth is written and read without recursion);
`/1` files (a nested tree) are still read. See docs/profile-format.md.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

from ..record import field, record, replace
from .policy import DEFAULT_POLICY, IDLE_POLICIES
from ..store.files import write_text
from .records import (Note, Process, ProfileFormatError, bounded, Source, Timeline, Totals, Window, energy, get_field,
                      integer, number, optional_bytes, read_note, read_process, read_source, read_timeline,
                      read_totals, read_window, string)
from .forecast import Forecast, read_forecast
from .records import GPU_KERNELS_FIELD, GpuKernels, read_gpu_kernels
from .load import MACHINE_LOAD_FIELD, MachineLoad, read_machine_load
from .blocks import BLOCK_VERSIONS, BLOCKS_FIELD, IoFact, Meta, check_blocks, read_io, read_meta

__all__ = ["Profile", "Node", "Source", "Totals", "Window", "Process", "Note", "Timeline", "ProfileFormatError",
           "load", "read_json", "SCHEMA", "IDLE_NODE", "SELF_NODE", "CHILDREN_NODE", "UNSAMPLED_CPU_NODE", "SPECIAL_NODES",
           "IDLE_POLICIES"]

SCHEMA = "energyprof.profile/2"
SCHEMA_FAMILY = "energyprof.profile/"
SCHEMA_MAJOR = 2
READABLE_MAJORS = (1, 2)

IDLE_NODE = "[other processes and idle]"
SELF_NODE = "[energyprof]"
CHILDREN_NODE = "[child processes]"
# The program's CPU (the headline's) that no sample carried: before the first tick, after the last,
# or in a process's tick with no thread to charge. Shown when it is more than UNSAMPLED_CPU_SHOWN of the
# headline, so the tree's CPU adds up; it holds no energy (the ledger charged none to it).
UNSAMPLED_CPU_NODE = "[CPU no sample saw]"
UNSAMPLED_CPU_SHOWN = 0.02
SPECIAL_NODES = (IDLE_NODE, SELF_NODE, CHILDREN_NODE, UNSAMPLED_CPU_NODE)
# The node of the threads that run one target, as the agent names it (agent/sampler.py, which imports nothing of ours).
THREAD_PREFIX = "[threads: "
PROCESS_GROUP_PREFIX = "[processes: "  # the node of the processes of one role (a pool's workers), as the agent labels them
GROUP_PREFIXES = (THREAD_PREFIX, PROCESS_GROUP_PREFIX)


def group_role(function: str) -> str:
    """A group node's name without its count (`[threads: T x150]` -> `[threads: T]`), so that two runs'
    groups match whatever their counts; any other name as it is."""
    if function.startswith(GROUP_PREFIXES) and function.endswith("]"):
        head, sep, count = function[:-1].rpartition(" x")
        if sep and count.isdigit():
            return head + "]"
    return function

# ---------------------------------------------------------------- records


# ---------------------------------------------------------------- the tree


@record(eq=False)
class Node:
    """One call path. Self figures are facts; inclusive ones (`energy_j`, `time_s`, ...) are their
    sums over the subtree, filled once by `fill_inclusive` when the tree is built or read."""

    function: str
    file: str = ""
    line: int = 0
    self_time_s: float = 0.0
    self_cpu_time_s: float = 0.0
    self_samples: int = 0
    self_energy_j: dict[str, float] = field(default_factory=dict)  # under the profile's idle policy
    other_policy_self_energy_j: dict[str, float] | None = None  # under the other policy (None: not recorded)
    peak_rss_bytes: int | None = None
    self_rss_growth_bytes: int | None = None
    alloc_bytes: int | None = None
    children: list[Node] = field(default_factory=list)
    # inclusive, derived
    time_s: float = 0.0
    cpu_time_s: float = 0.0
    samples: int = 0
    energy_j: dict[str, float] = field(default_factory=dict)
    rss_growth_bytes: int | None = None

    @property
    def is_special(self) -> bool:
        return self.function in SPECIAL_NODES

    @property
    def total_energy(self) -> float:
        return sum(self.energy_j.values())

    @property
    def self_total_energy(self) -> float:
        return sum(self.self_energy_j.values())

    def walk(self, depth: int = 0) -> Iterator[tuple[Node, int]]:
        """Pre-order (node, depth) without recursion: trees can be deeper than Python's stack."""
        stack: list[tuple[Node, int]] = [(self, depth)]
        while stack:
            node, d = stack.pop()
            yield node, d
            stack.extend((c, d + 1) for c in reversed(node.children))

    def fill_inclusive(self) -> None:
        """inclusive = self + children, for this subtree, bottom-up without recursion."""
        for node in reversed([n for n, _ in self.walk()]):
            energy = dict(node.self_energy_j)
            time_s, cpu_s, samples = node.self_time_s, node.self_cpu_time_s, node.self_samples
            growth, peak = node.self_rss_growth_bytes, node.peak_rss_bytes
            for c in node.children:
                for sid, j in c.energy_j.items():
                    energy[sid] = energy.get(sid, 0.0) + j
                time_s += c.time_s
                cpu_s += c.cpu_time_s
                samples += c.samples
                if c.rss_growth_bytes is not None:
                    growth = (growth or 0) + c.rss_growth_bytes
                if c.peak_rss_bytes is not None:
                    peak = max(peak or 0, c.peak_rss_bytes)
            node.energy_j, node.time_s, node.cpu_time_s, node.samples = energy, time_s, cpu_s, samples
            node.rss_growth_bytes, node.peak_rss_bytes = growth, peak

    def to_dict(self) -> dict[str, Any]:
        """The /1 nested form (very deep trees do not fit json.dumps: Profile.to_json writes /2)."""
        out: dict[str, Any] = {}
        open_at: list[dict[str, Any]] = []  # the open node at each depth of the walk
        for node, depth in self.walk():
            raw = _node_v1(node)
            del open_at[depth:]
            if open_at:
                open_at[-1]["children"].append(raw)
            else:
                out = raw
            open_at.append(raw)
        return out


_NODE_SELF = ("function", "file", "line", "self_time_s", "self_cpu_time_s", "self_samples", "self_energy_j")
_NODE_OPTIONAL = ("other_policy_self_energy_j", "peak_rss_bytes", "self_rss_growth_bytes", "alloc_bytes")


def _node_v1(n: Node) -> dict[str, Any]:
    out: dict[str, Any] = {k: getattr(n, k) for k in _NODE_SELF}
    out.update(time_s=n.time_s, cpu_time_s=n.cpu_time_s, samples=n.samples, energy_j=n.energy_j)
    for k in (*_NODE_OPTIONAL, "rss_growth_bytes"):
        if getattr(n, k) is not None:
            out[k] = getattr(n, k)
    out["children"] = []
    return out


# ---------------------------------------------------------------- the profile


@record(eq=False)
class Profile:
    """What the run was (meta), what was measured (sources, totals, timeline, windows, processes)
    and where it went (the tree). `meta["idle_policy"]` names the policy of the tree's figures."""

    meta: dict[str, Any]
    sources: list[Source]
    totals: Totals
    root: Node
    windows: list[Window] = field(default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)
    notes: list[Note] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # unknown top-level fields, kept for a round trip
    gpu_kernels: GpuKernels | None = None  # the GPU's energy split among its kernels' launch stacks (None: no split)
    load: MachineLoad | None = None  # how busy the machine was during the run (None: not read, or an older file)

    def __post_init__(self) -> None:
        # Accept /1-shaped dicts from Python callers; the records are what is kept.
        self.sources = [s if isinstance(s, Source) else read_source(s, "sources") for s in self.sources]
        if not isinstance(self.totals, Totals):
            self.totals = read_totals(self.totals)
        self.windows = [w if isinstance(w, Window) else read_window(w) for w in self.windows]
        if not isinstance(self.timeline, Timeline):
            self.timeline = read_timeline(self.timeline or {})
        self.notes = [n if isinstance(n, Note) else read_note(n) for n in self.notes]
        self.processes = [p if isinstance(p, Process) else read_process(p) for p in self.processes]
        if self.gpu_kernels is not None and not isinstance(self.gpu_kernels, GpuKernels):
            self.gpu_kernels = read_gpu_kernels(self.gpu_kernels)
        if self.load is not None and not isinstance(self.load, MachineLoad):
            self.load = read_machine_load(self.load)

    @property
    def idle_policy(self) -> str:
        return str(self.meta.get("idle_policy") or DEFAULT_POLICY)

    @property
    def io(self) -> IoFact | None:
        """The run's I/O counters (None: a profile written without them), typed and checked."""
        return read_io(self.extra.get("io"))

    @property
    def known_meta(self) -> Meta:
        """The meta's keys energyprof reads back (live_export, page_cache, distributed, settings), typed."""
        return read_meta(self.meta)

    @property
    def total_energy_j(self) -> float:
        return sum(self.totals.energy_j.values())

    @property
    def forecasts(self) -> list[Forecast]:
        """The tracked loops' forecasts of their own totals (energyprof.torch.track(epochs=N)), in the order made."""
        found = (read_forecast(w) for w in sorted(self.windows, key=lambda w: w.start_s))
        return [f for f in found if f is not None]

    def source(self, source_id: str) -> Source:
        for s in self.sources:
            if s.id == source_id:
                return s
        raise KeyError(source_id)

    def nodes(self) -> Iterator[tuple[Node, int]]:
        return self.root.walk()

    def walk(self) -> Iterator[tuple[Node, int]]:
        return self.root.walk()

    def find(self, function: str) -> list[Node]:
        """All nodes whose function name is `function` (a function can sit on several paths)."""
        return [n for n, _ in self.walk() if n.function == function]

    def function_totals(self, function: str) -> float:
        """Energy charged to a function over all its call paths, counting recursion once."""
        total = 0.0
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node.function == function:
                total += node.total_energy
                continue  # its children are inside its inclusive figure already
            stack.extend(node.children)
        return total

    # -- the other idle policy --------------------------------------------------------
    def policies(self) -> tuple[str, ...]:
        """The idle policies this profile holds figures for (older files: the run's only)."""
        if self.root.other_policy_self_energy_j is not None:  # written by a builder that keeps both
            return IDLE_POLICIES
        return (self.idle_policy,)

    def with_policy(self, policy: str) -> Profile:
        """The same run seen under another idle policy: a new Profile, this one untouched."""
        if policy == self.idle_policy:
            return self
        if policy not in self.policies():
            raise ProfileFormatError(f"this profile holds figures for idle policy {self.idle_policy!r} only "
                                     f"(written by an older energyprof); --idle {policy} needs a new run")
        copies: dict[int, Node] = {}
        for n, _ in self.walk():
            copies[id(n)] = Node(n.function, n.file, n.line, n.self_time_s, n.self_cpu_time_s, n.self_samples,
                                 dict(n.other_policy_self_energy_j or {}), dict(n.self_energy_j), n.peak_rss_bytes,
                                 n.self_rss_growth_bytes, n.alloc_bytes)
        for n, _ in self.walk():
            copies[id(n)].children = [copies[id(c)] for c in n.children]
        root = copies[id(self.root)]
        root.fill_inclusive()
        t = self.totals
        special = {c.function: c.energy_j for c in root.children if c.is_special}
        ids = list(t.energy_j)
        idle = special.get(IDLE_NODE, {})
        own = special.get(SELF_NODE, {})
        totals = Totals(dict(t.energy_j), {s: root.energy_j.get(s, 0.0) - idle.get(s, 0.0) - own.get(s, 0.0) for s in ids},
                        {s: own.get(s, 0.0) for s in ids}, {s: idle.get(s, 0.0) for s in ids}, t.duration_s,
                        t.cpu_time_s, t.energyprof_cpu_time_s, t.baseline_rss_bytes, t.peak_rss_bytes,
                        t.peak_rss_exact_bytes)
        meta = dict(self.meta)
        meta["idle_policy"] = policy
        windows = [replace(w, program_energy_j=dict(w.other_policy_program_energy_j),
                            other_policy_program_energy_j=dict(w.program_energy_j)) for w in self.windows]
        # A process's figures under the other policy; a profile written before processes kept them has none:
        # unknown (a dash), never the first policy's figures under the second's name.
        processes = [replace(p, energy_j=dict(p.other_policy_energy_j or {}),
                             other_policy_energy_j=dict(p.energy_j) if p.other_policy_energy_j is not None else None)
                     for p in self.processes]
        return Profile(meta, list(self.sources), totals, root, windows, self.timeline, list(self.notes),
                       processes, dict(self.extra),
                       self.gpu_kernels.other_policy() if self.gpu_kernels is not None else None, load=self.load)

    # -- copies with more facts (a built Profile is never edited) --------------------------
    def with_meta(self, notes: list[Note] | tuple[Note, ...] = (), **changes: Any) -> Profile:
        """The same run with `changes` in its meta (and `notes` added): a new Profile sharing this one's
        tree and records, this one untouched."""
        return replace(self, meta={**self.meta, **changes}, notes=[*self.notes, *notes])

    def with_live_export(self, summary: dict[str, Any], lost: str | None = None) -> Profile:
        """The same run with the live export's account (`meta.live_export`: what each sink sent and
        dropped) and, where points were `lost`, a note saying so."""
        return self.with_meta(notes=[Note("live-export", lost)] if lost else [], live_export=summary)

    # -- JSON --------------------------------------------------------------------------
    def to_table(self) -> dict[str, Any]:
        """The /2 document: the tree as a flat node table (parents before children)."""
        table: list[dict[str, Any]] = []
        open_at: list[int] = []  # the index of the open node at each depth of the walk
        for n, depth in self.walk():
            del open_at[depth:]
            row: dict[str, Any] = {"parent": open_at[-1] if open_at else -1}
            row.update({k: getattr(n, k) for k in _NODE_SELF})
            for k in _NODE_OPTIONAL:
                if getattr(n, k) is not None:
                    row[k] = getattr(n, k)
            open_at.append(len(table))
            table.append(row)
        out: dict[str, Any] = dict(self.extra)
        out.update({
            "schema": SCHEMA,
            BLOCKS_FIELD: dict(BLOCK_VERSIONS),
            "meta": self.meta,
            "sources": [s.to_dict() for s in self.sources],
            "totals": self.totals.to_dict(),
            "nodes": table,
            "windows": [w.to_dict() for w in self.windows],
            "timeline": self.timeline.to_dict(),
            "notes": [n.to_dict() for n in self.notes],
            "processes": [p.to_dict() for p in self.processes],
        })
        if self.gpu_kernels is not None:
            out[GPU_KERNELS_FIELD] = self.gpu_kernels.to_dict()
        if self.load is not None:
            out[MACHINE_LOAD_FIELD] = self.load.to_dict()
        return out

    def to_dict(self) -> dict[str, Any]:
        """The /1 nested form, for Python code that walks dicts (files are written as /2)."""
        out: dict[str, Any] = dict(self.extra)
        out.update({"schema": SCHEMA_FAMILY + "1", BLOCKS_FIELD: dict(BLOCK_VERSIONS), "meta": self.meta,
                    "sources": [s.to_dict() for s in self.sources],
                    "totals": self.totals.to_dict(), "root": self.root.to_dict(),
                    "windows": [w.to_dict() for w in self.windows], "timeline": self.timeline.to_dict(),
                    "notes": [n.to_dict() for n in self.notes], "processes": [p.to_dict() for p in self.processes]})
        if self.gpu_kernels is not None:
            out[GPU_KERNELS_FIELD] = self.gpu_kernels.to_dict()
        if self.load is not None:
            out[MACHINE_LOAD_FIELD] = self.load.to_dict()
        return out

    def to_json(self, derived: dict[str, Any] | None = None) -> str:
        """/2 JSON. `derived` (figures computed from the facts with the run's settings, e.g. carbon)
        is written under "derived" for other tools; readers, this one included, ignore it."""
        doc = self.to_table()
        if derived:
            doc["derived"] = derived
        return json.dumps(doc, allow_nan=False, separators=(",", ":"))

    def save(self, path: str | os.PathLike[str]) -> None:
        write_text(str(path), self.to_json())

    @classmethod
    def from_dict(cls, data: Any) -> Profile:
        """Read a /1 or /2 document, checking every field's type and value (files can be crafted)."""
        if not isinstance(data, dict):
            raise ProfileFormatError("not a profile: the top level is not a JSON object")
        schema = data.get("schema")
        if not isinstance(schema, str) or not schema.startswith(SCHEMA_FAMILY):
            raise ProfileFormatError(f"not an energyprof profile (schema {schema!r})")
        try:
            major = int(schema[len(SCHEMA_FAMILY):].split(".")[0])
        except ValueError:
            raise ProfileFormatError(f"unreadable schema version {schema!r}") from None
        if major > SCHEMA_MAJOR:
            raise ProfileFormatError(f"profile schema {schema} is newer than this energyprof reads ({SCHEMA}); "
                                     "upgrade energyprof")
        if major not in READABLE_MAJORS:
            raise ProfileFormatError(f"profile schema {schema} is older than this energyprof reads "
                                     f"(/{READABLE_MAJORS[0]} and later)")
        try:
            check_blocks(data.get(BLOCKS_FIELD))
            root = _tree_v1(get_field(data, "root", dict)) if major == 1 else _tree_v2(get_field(data, "nodes", list))
            known = {"schema", BLOCKS_FIELD, "meta", "sources", "totals", "root", "nodes", "windows", "timeline", "notes",
                     "processes", "carbon", "derived", GPU_KERNELS_FIELD, MACHINE_LOAD_FIELD}
            meta = dict(get_field(data, "meta", dict))
            policy = meta.get("idle_policy", DEFAULT_POLICY)
            if policy not in IDLE_POLICIES:
                raise ProfileFormatError(f"meta.idle_policy must be one of {', '.join(IDLE_POLICIES)}, not {policy!r}")
            extra = {k: v for k, v in data.items() if k not in known}
            _bounded_free_form(data, meta, extra)
            read_io(extra.get("io"))  # a damaged I/O block is refused here, in one line, not met by a view
            read_meta(meta)
            processes = [read_process(p) for p in get_field(data, "processes", list, [])]
            return cls(meta=meta, sources=[read_source(s, "sources") for s in get_field(data, "sources", list)],
                       totals=read_totals(get_field(data, "totals", dict)), root=root,
                       windows=[read_window(w) for w in get_field(data, "windows", list, [])],
                       timeline=read_timeline(get_field(data, "timeline", dict, {})),
                       notes=[read_note(n) for n in get_field(data, "notes", list, [])], processes=processes, extra=extra,
                       gpu_kernels=read_gpu_kernels(data[GPU_KERNELS_FIELD]) if data.get(GPU_KERNELS_FIELD) is not None
                       else None,
                       load=read_machine_load(data[MACHINE_LOAD_FIELD]) if data.get(MACHINE_LOAD_FIELD) is not None
                       else None)
        except ProfileFormatError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProfileFormatError(f"profile is missing or mangles a field: {exc}") from None


def _bounded_free_form(data: dict[str, Any], meta: dict[str, Any], extra: dict[str, Any]) -> None:
    """The numbers the checked readers do not type (meta, sources' details, notes, a process's exit, the
    timeline's function table, extra sections such as io) are read by the renderers too: within LARGEST."""
    bounded(meta, "meta")
    bounded(extra, "profile")
    for key in ("sources", "notes", "processes"):
        if isinstance(data.get(key), list):
            bounded(data[key], key)
    timeline = data.get("timeline")
    if isinstance(timeline, dict):
        bounded({k: timeline.get(k) for k in ("functions", "active")}, "timeline")


def load(path: str | os.PathLike[str]) -> Profile:
    """Read a saved profile. Raises ProfileFormatError with a one-line reason."""
    return Profile.from_dict(read_json(path))


def read_json(path: str | os.PathLike[str]) -> Any:
    """A JSON file, or ProfileFormatError with one line (NaN and Infinity are refused: not JSON)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ProfileFormatError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ProfileFormatError(f"{path} is not a text file") from None

    def constant(name: str) -> Any:
        raise ProfileFormatError(f"{path} holds {name}, which is not a number JSON allows")

    try:
        return json.loads(text, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise ProfileFormatError(f"{path} is not valid JSON (truncated or corrupt?): {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise ProfileFormatError(f"{path} nests deeper than this Python can read") from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.set_int_max_str_digits)
        raise ProfileFormatError(f"{path} holds a number this Python cannot read: {exc}") from None


# ---------------------------------------------------------------- checked reading


def _node(raw: Any, where: str) -> Node:
    if not isinstance(raw, dict):
        raise ProfileFormatError(f"{where} must be an object")
    if "function" not in raw:
        raise ProfileFormatError(f"{where} has no 'function'")
    return Node(function=string(raw["function"], f"{where}.function"), file=string(raw.get("file", ""), f"{where}.file"),
                line=integer(raw.get("line", 0), f"{where}.line") or 0,
                self_time_s=number(raw.get("self_time_s", 0.0), f"{where}.self_time_s"),
                self_cpu_time_s=number(raw.get("self_cpu_time_s", 0.0), f"{where}.self_cpu_time_s"),
                self_samples=integer(raw.get("self_samples", 0), f"{where}.self_samples") or 0,
                self_energy_j=energy(raw.get("self_energy_j", {}), f"{where}.self_energy_j") or {},
                other_policy_self_energy_j=energy(raw.get("other_policy_self_energy_j"),
                                                   f"{where}.other_policy_self_energy_j", optional=True),
                peak_rss_bytes=optional_bytes(raw, "peak_rss_bytes", where),
                self_rss_growth_bytes=optional_bytes(raw, "self_rss_growth_bytes", where),
                alloc_bytes=optional_bytes(raw, "alloc_bytes", where))


def _tree_v1(raw_root: dict[str, Any]) -> Node:
    root = _node(raw_root, "root")
    todo = [(root, raw_root, "root")]
    while todo:
        node, raw, where = todo.pop()
        kids = raw.get("children", [])
        if not isinstance(kids, list):
            raise ProfileFormatError(f"{where}.children must be a list")
        for i, child_raw in enumerate(kids):
            child = _node(child_raw, f"{where}.children[{i}]")
            node.children.append(child)
            todo.append((child, child_raw, f"{node.function}>{i}"))
    root.fill_inclusive()
    return root


def _tree_v2(table: list[Any]) -> Node:
    if not table:
        raise ProfileFormatError("the node table is empty")
    nodes: list[Node] = []
    for i, raw in enumerate(table):
        node = _node(raw, f"nodes[{i}]")
        parent = raw.get("parent")
        if i == 0:
            if parent != -1:
                raise ProfileFormatError("nodes[0] must be the root (parent -1)")
        elif isinstance(parent, bool) or not isinstance(parent, int) or not 0 <= parent < i:
            raise ProfileFormatError(f"nodes[{i}].parent must index an earlier node, not {parent!r}")
        else:
            nodes[parent].children.append(node)
        nodes.append(node)
    nodes[0].fill_inclusive()
    return nodes[0]
