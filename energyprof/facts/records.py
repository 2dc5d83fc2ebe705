"""The Profile's records (Source, Totals, Window, Process, Note, Timeline) and their checked reading.

Plain records of facts, with read-only mapping access for code written against the /1 dicts,
and readers that check every field's type and value, because a profile file can be crafted.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..record import field, fields, record, replace


class ProfileFormatError(ValueError):
    """A profile file that cannot be read: corrupt, crafted, truncated, or from another version."""


# ---------------------------------------------------------------- records


class _Record:
    """Read-only mapping access (`w["name"]`, `w.get("index")`) for readers written against /1's dicts."""

    def __getitem__(self, key: str) -> Any:
        if key in field_names(type(self)):
            return getattr(self, key)
        extra = getattr(self, "extra", None)
        if isinstance(extra, dict) and key in extra:
            return extra[key]
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            value = self[key]
        except KeyError:
            return default
        return default if value is None else value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "extra":
                out.update({k: v for k, v in value.items() if k not in out})
            elif value is not None:
                out[f.name] = value
        return out


_FIELD_NAMES: dict[type, frozenset[str]] = {}


def field_names(cls: type) -> frozenset[str]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = frozenset(f.name for f in fields(cls))  # type: ignore[arg-type]
    return names


@record
class Source(_Record):
    """One energy source: `method` says whether its figures are measured or estimated."""

    id: str
    component: str = ""
    method: str = "measured"
    sensor: str = ""
    detail: Any = None
    update_period_s: float | None = None
    tier: str | None = None  # counter | integrated | model (collect/sensors/base.TIERS); None in older files
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tier_or_guess(self) -> str:
        """The tier, or for a profile written before sources declared one, what its method implies."""
        return self.tier or ("model" if self.method == "estimated" else "counter")

    @property
    def sensor_text(self) -> str:
        """What read the source, in the reader's words: a replay names what recorded it."""
        if self.sensor == "replay":
            recorded = self.detail.get("recorded_with") if isinstance(self.detail, dict) else None
            return f"replayed ({recorded or 'external meter'})"
        return self.sensor or "?"


@record
class Totals(_Record):
    """Run-wide sums for the profile's idle policy; energies are {source: joules}."""

    energy_j: dict[str, float] = field(default_factory=dict)  # everything the sensors measured
    attributed_j: dict[str, float] = field(default_factory=dict)  # the program's own nodes
    energyprof_j: dict[str, float] = field(default_factory=dict)
    idle_j: dict[str, float] = field(default_factory=dict)
    duration_s: float = 0.0
    cpu_time_s: float = 0.0
    energyprof_cpu_time_s: float = 0.0
    baseline_rss_bytes: int | None = None
    peak_rss_bytes: int | None = None
    peak_rss_exact_bytes: int | None = None  # the kernel's VmHWM after its mark was reset


@record
class Window(_Record):
    """A user-named span (epoch, step, phase): the machine's energy measured inside it, and the
    program's part of it under the profile's idle policy (absent from files written before it)."""

    name: str
    index: int | None = None
    depth: int = 0
    start_s: float = 0.0
    end_s: float = 0.0
    time_s: float = 0.0
    energy_j: dict[str, float] = field(default_factory=dict)
    pid: int | None = None  # the process that marked it
    rank: int | None = None  # that process's rank, in a distributed job
    node: str | None = None  # its host, in a profile joined from several nodes
    program_energy_j: dict[str, float] = field(default_factory=dict)
    # The program's part under the other idle policy, so a re-render under it needs no new run.
    other_policy_program_energy_j: dict[str, float] = field(default_factory=dict)
    # What the program measured about the span itself: a tracked loop's fetch window holds the
    # DataLoader worker's time on that batch (`pipeline_s`), `worker`, `workers` and `startup` (0/1).
    loop: dict[str, float] = field(default_factory=dict)

    # The window's two totals, the one place a view reads them from (a Measurement's names).
    @property
    def total_j(self) -> float:
        """The machine's energy in the span, all sources."""
        return sum(self.energy_j.values())

    @property
    def program_total_j(self) -> float | None:
        """The program's part of it, all sources; None in files written before windows held it."""
        return sum(self.program_energy_j.values()) if self.program_energy_j else None


@record
class Process(_Record):
    """One process of the job (the program, a child, a rank, a DataLoader worker)."""

    pid: int
    parent_pid: int | None = None
    command: str = ""
    role: str = "child"  # main, child, rank, worker, or an engine's (ray worker, ray daemon raylet, dask worker)
    rank: int | None = None
    local_rank: int | None = None
    cpu_time_s: float = 0.0
    energy_j: dict[str, float] = field(default_factory=dict)
    peak_rss_bytes: int | None = None
    exit: dict[str, Any] | None = None
    host: str | None = None  # the node it ran on, in a profile joined from several
    # the other idle policy's energy (as Node and Window keep it), so the rows add up to the program under
    # either; None in profiles written before it was kept
    other_policy_energy_j: dict[str, float] | None = None


@record
class Note(_Record):
    """Something the reader must know (a sensor dropped, a checkpoint rebuilt); `extra` keeps details."""

    kind: str
    message: str
    extra: dict[str, Any] = field(default_factory=dict)


@record
class Timeline(_Record):
    """Power and RSS per bucket (about 1,000 however long the run), and which functions ran in each."""

    t_s: list[float] = field(default_factory=list)
    start_s: list[float] = field(default_factory=list)
    end_s: list[float] = field(default_factory=list)
    power_w: dict[str, list[float]] = field(default_factory=dict)
    # the program's power per bucket (all sources), by idle policy: {"share": [...], "all": [...]}
    program_w: dict[str, list[float]] = field(default_factory=dict)
    rss_bytes: list[int] = field(default_factory=list)
    functions: list[list[Any]] = field(default_factory=list)  # [function, file, line]
    active: list[list[int]] = field(default_factory=list)  # per bucket: indices into functions

    def __bool__(self) -> bool:
        return bool(self.t_s)


# ---------------------------------------------------------------- checked reading


def get_field(d: dict[str, Any], key: str, kind: type, default: Any = ...) -> Any:
    if key not in d:
        if default is ...:
            raise ProfileFormatError(f"profile is missing {key!r}")
        return default
    value = d[key]
    if not isinstance(value, kind):
        raise ProfileFormatError(f"{key!r} must be a {kind.__name__}, not {type(value).__name__}")
    return value


# No figure a profile holds comes near this (joules, seconds, bytes, counts); sums, squares and ratios of
# numbers past it would leave a float's range, and a report of them would be no report. A crafted file
# holding one is refused with one line (a 10**400 once failed deep in the renderers).
LARGEST = 1e100
_LARGEST_INT = 10 ** 100


def too_large(value: Any) -> bool:
    """A JSON number past LARGEST (or not finite); a Python int of any size is compared exactly."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) > _LARGEST_INT
    return isinstance(value, float) and not (math.isfinite(value) and abs(value) <= LARGEST)


def shown(value: Any) -> str:
    """A number for a one-line message: a huge integer by its size, not its thousand digits."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10 ** 15:
        return f"{'-' if value < 0 else ''}an integer of about 10**{int(abs(value).bit_length() * 0.30103)}"
    return repr(value)


def past_largest(value: Any, where: str) -> ProfileFormatError:
    return ProfileFormatError(f"{where} is {shown(value)}, past what a profile's figures can be (at most 1e100)")


def bounded(value: Any, where: str) -> None:
    """Every number in a free-form part (meta, a source's detail, a note's details): within LARGEST."""
    todo = [(value, where)]
    while todo:
        v, w = todo.pop()
        if isinstance(v, dict):
            todo.extend((x, f"{w}.{k}") for k, x in v.items())
        elif isinstance(v, list):
            todo.extend((x, f"{w}[{i}]") for i, x in enumerate(v))
        elif too_large(v):
            if isinstance(v, float) and not math.isfinite(v):
                raise ProfileFormatError(f"{w} is {v!r}, not a finite number")
            raise past_largest(v, w)


def number(value: Any, where: str, nonneg: bool = True) -> float:
    kind = type(value)
    if kind is float:  # the common case first: a profile holds hundreds of thousands of numbers
        if not -LARGEST <= value <= LARGEST:  # NaN fails both comparisons
            _refuse_number(value, where)
    elif kind is bool or not isinstance(value, (int, float)) or too_large(value):
        _refuse_number(value, where)
    if nonneg and value < 0:
        raise ProfileFormatError(f"{where} must not be negative ({value!r})")
    return float(value)


def _refuse_number(value: Any, where: str) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and (isinstance(value, int) or math.isfinite(value)):
        raise past_largest(value, where)
    raise ProfileFormatError(f"{where} must be a finite number, not {value!r}")


def integer(value: Any, where: str, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileFormatError(f"{where} must be an integer, not {value!r}")
    if too_large(value):
        raise past_largest(value, where)
    return value


def string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ProfileFormatError(f"{where} must be a string, not {value!r}")
    return value


def energy(value: Any, where: str, optional: bool = False) -> dict[str, float] | None:
    if value is None and optional:
        return None
    if not isinstance(value, dict):
        raise ProfileFormatError(f"{where} must be an object of source: joules, not {type(value).__name__}")
    return {string(k, where): number(v, f"{where}[{k}]") for k, v in value.items()}


def optional_number(raw: dict[str, Any], key: str, where: str) -> float | None:
    return None if raw.get(key) is None else number(raw[key], f"{where}.{key}")


def optional_bytes(raw: dict[str, Any], key: str, where: str) -> int | None:
    v = raw.get(key)
    if v is None:
        return None
    return int(number(v, f"{where}.{key}", nonneg=False))


def read_source(raw: Any, where: str) -> Source:
    if not isinstance(raw, dict):
        raise ProfileFormatError(f"{where}: each source must be an object")
    known = field_names(Source)
    return Source(id=string(raw.get("id"), f"{where}.id"), component=string(raw.get("component", ""), f"{where}.component"),
                  method=string(raw.get("method", "measured"), f"{where}.method"),
                  sensor=string(raw.get("sensor", ""), f"{where}.sensor"), detail=raw.get("detail"),
                  update_period_s=optional_number(raw, "update_period_s", where),
                  tier=string(raw["tier"], f"{where}.tier") if raw.get("tier") is not None else None,
                  extra={k: v for k, v in raw.items() if k not in known})


def read_totals(raw: dict[str, Any]) -> Totals:
    if not isinstance(raw, dict):
        raise ProfileFormatError("totals must be an object")
    w = "totals"
    return Totals(energy_j=energy(raw.get("energy_j", {}), f"{w}.energy_j") or {},
                  attributed_j=energy(raw.get("attributed_j", {}), f"{w}.attributed_j") or {},
                  energyprof_j=energy(raw.get("energyprof_j", {}), f"{w}.energyprof_j") or {},
                  idle_j=energy(raw.get("idle_j", {}), f"{w}.idle_j") or {},
                  duration_s=number(raw.get("duration_s", 0.0), f"{w}.duration_s"),
                  cpu_time_s=number(raw.get("cpu_time_s", 0.0), f"{w}.cpu_time_s"),
                  energyprof_cpu_time_s=number(raw.get("energyprof_cpu_time_s", 0.0), f"{w}.energyprof_cpu_time_s"),
                  baseline_rss_bytes=optional_bytes(raw, "baseline_rss_bytes", w),
                  peak_rss_bytes=optional_bytes(raw, "peak_rss_bytes", w),
                  peak_rss_exact_bytes=optional_bytes(raw, "peak_rss_exact_bytes", w))


def read_window(raw: Any) -> Window:
    if not isinstance(raw, dict):
        raise ProfileFormatError("each window must be an object")
    w = f"window {raw.get('name')!r}"
    index = raw.get("index")
    return Window(name=str(raw.get("name", "")), index=integer(index, f"{w}.index", optional=True),
                  depth=integer(raw.get("depth", 0), f"{w}.depth") or 0,
                  start_s=number(raw.get("start_s", 0.0), f"{w}.start_s", nonneg=False),
                  end_s=number(raw.get("end_s", 0.0), f"{w}.end_s", nonneg=False),
                  time_s=number(raw.get("time_s", 0.0), f"{w}.time_s"),
                  energy_j=energy(raw.get("energy_j", {}), f"{w}.energy_j") or {},
                  pid=integer(raw.get("pid"), f"{w}.pid", optional=True),
                  rank=integer(raw.get("rank"), f"{w}.rank", optional=True),
                  node=None if raw.get("node") is None else string(raw.get("node"), f"{w}.node"),
                  program_energy_j=energy(raw.get("program_energy_j", {}), f"{w}.program_energy_j") or {},
                  other_policy_program_energy_j=energy(raw.get("other_policy_program_energy_j", {}),
                                                       f"{w}.other_policy_program_energy_j") or {},
                  loop=_numbers(raw.get("loop", {}), f"{w}.loop"))


def _numbers(raw: Any, where: str) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise ProfileFormatError(f"{where} must be an object")
    out = {}
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or too_large(v):
            raise ProfileFormatError(f"{where}.{k} must be a number within 1e100")
        out[str(k)] = float(v)
    return out


def read_timeline(raw: dict[str, Any]) -> Timeline:
    if not isinstance(raw, dict):
        raise ProfileFormatError("timeline must be an object")

    def series(key: str, nonneg: bool = True) -> list[float]:
        values = raw.get(key) or []
        if not isinstance(values, list):
            raise ProfileFormatError(f"timeline.{key} must be a list")
        return [number(v, f"timeline.{key}", nonneg) for v in values]

    power = raw.get("power_w") or {}
    if not isinstance(power, dict):
        raise ProfileFormatError("timeline.power_w must be an object")
    program = raw.get("program_w") or {}
    if not isinstance(program, dict):
        raise ProfileFormatError("timeline.program_w must be an object")
    functions = raw.get("functions") or []
    active = raw.get("active") or []
    if not isinstance(functions, list) or not isinstance(active, list) \
            or not all(isinstance(a, list) for a in active):
        raise ProfileFormatError("timeline.functions and timeline.active must be lists")
    return Timeline(t_s=series("t_s", False), start_s=series("start_s", False), end_s=series("end_s", False),
                    power_w={string(k, "timeline.power_w"): [number(v, f"timeline.power_w[{k}]") for v in vs]
                             for k, vs in power.items() if isinstance(vs, list)},
                    program_w={string(k, "timeline.program_w"): [number(v, f"timeline.program_w[{k}]") for v in vs]
                               for k, vs in program.items() if isinstance(vs, list)},
                    rss_bytes=[int(v) for v in series("rss_bytes")], functions=functions, active=active)


def read_note(raw: Any) -> Note:
    if isinstance(raw, str):
        return Note("note", raw)
    if not isinstance(raw, dict):
        raise ProfileFormatError("each note must be an object")
    kind = str(raw.get("kind", "note"))
    message = str(raw.get("message", ""))
    return Note(kind, message, {k: v for k, v in raw.items() if k not in ("kind", "message")})


def read_process(raw: Any) -> Process:
    if not isinstance(raw, dict):
        raise ProfileFormatError("each process must be an object")
    w = f"process {raw.get('pid')!r}"
    return Process(pid=integer(raw.get("pid"), f"{w}.pid") or 0,
                   parent_pid=integer(raw.get("parent_pid"), f"{w}.parent_pid", optional=True),
                   command=str(raw.get("command", "")), role=str(raw.get("role", "child")),
                   rank=integer(raw.get("rank"), f"{w}.rank", optional=True),
                   local_rank=integer(raw.get("local_rank"), f"{w}.local_rank", optional=True),
                   cpu_time_s=number(raw.get("cpu_time_s", 0.0), f"{w}.cpu_time_s"),
                   energy_j=energy(raw.get("energy_j", {}), f"{w}.energy_j") or {},
                   peak_rss_bytes=optional_bytes(raw, "peak_rss_bytes", w),
                   exit=raw.get("exit") if isinstance(raw.get("exit"), dict) else None,
                   host=None if raw.get("host") is None else string(raw.get("host"), f"{w}.host"),
                   other_policy_energy_j=energy(raw.get("other_policy_energy_j"), f"{w}.other_policy_energy_j",
                                                optional=True))


# ---------------------------------------------------------------- GPU kernels (core/gpu_tree.py)

GPU_KERNELS_FIELD = "gpu_kernels"  # the profile's top-level field
GpuFrame = tuple[str, str, int]  # (function, file, first line)


@record
class GpuKernelSum:
    """The kernels of one name on one launch stack: how many, their time and their joules."""

    name: str
    count: int = 0
    time_s: float = 0.0
    joules: float = 0.0


@record
class GpuStack:
    """One launch stack on one device: the joules of the kernels it launched and their error bar."""

    path: list[GpuFrame]  # outermost frame first; operators and [backward] are frames with no file
    device: int
    joules: float = 0.0
    error_j: float = 0.0  # this stack's own bar: the samples it shares with any other stack, plus the sensor's
    busy_s: float = 0.0
    kernel_names: int = 0  # names it launched; `kernels` keeps the heaviest
    kernels: list[GpuKernelSum] = field(default_factory=list)
    # node_error_j[i]: the bar of the tree node path[:i+1], i.e. of every stack on this device beneath it
    # taken together (what they share among themselves moves nothing out of the node), plus the sensor's.
    # None in profiles written before it: a node's bar is then the sum of its stacks' (a wider bound).
    node_error_j: list[float] | None = None


@record
class GpuDevice:
    """One device's figures inside the split."""

    source: str
    energy_j: float = 0.0
    idle_j: float = 0.0
    busy_s: float = 0.0
    update_period_s: float = 0.0
    short_j: float = 0.0  # joules of records shorter than the update period
    short_share: float = 0.0
    unmeasured_busy_s: float = 0.0
    idle_error_j: float | None = None  # [GPU idle]'s bar (None in older profiles)
    split_share: float | None = None  # a run's capture: share of the measured energy inside the profiled cycles
    other_policy_energy_j: float | None = None  # a run's capture: `energy_j` under the other idle policy
    busy_lane: list[list[float | None]] = field(default_factory=list)  # [start_s, end_s, busy_s or None], the timeline's


@record
class GpuSchedule:
    """Which spans of a run the kernel capture profiled."""

    spans_ns: list[list[int]] = field(default_factory=list)  # the first 1,000
    windows: int = 0
    profiled_s: float = 0.0
    profiled_share: dict[str, float] = field(default_factory=dict)  # device -> share of its energy


@record
class GpuKernels:
    """The GPU's energy split among the kernels' launch stacks (core/gpu_tree.py): the profile's
    `gpu_kernels` field. Made while the tree is built; the tree holds the same joules on its nodes."""

    method: str
    devices: dict[str, GpuDevice] = field(default_factory=dict)  # device number (a string, as JSON keys) -> figures
    stacks: list[GpuStack] = field(default_factory=list)
    records: int = 0
    cycles: int | None = None  # a run's capture; None for an offline trace
    clock_error_ns: int | None = None
    unplaced: dict[str, int] = field(default_factory=dict)  # reason -> device records not on their line
    fold: dict[str, int] = field(default_factory=dict)  # the run's fold: paths, entries, cell width, capture CPU
    schedule: GpuSchedule | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # fields this version does not know, kept for a round trip

    def other_policy(self) -> GpuKernels:
        """The same facts under the profile's other idle policy (Profile.with_policy). A run's capture
        split the program's share of each device inside the profiled cycles, which the policies may
        set differently: every figure of that device (joules, bars, idle) is scaled by the ratio of
        the two shares, as the split itself scaled them. Devices without the other share kept, or with
        no joules to scale, keep their figures."""
        ratio = {int(d): v.other_policy_energy_j / v.energy_j for d, v in self.devices.items()
                 if v.other_policy_energy_j is not None and v.energy_j > 0 and d.lstrip("-").isdigit()}
        if not ratio:
            return self
        devices = {}
        for d, v in self.devices.items():
            r = ratio.get(int(d)) if d.lstrip("-").isdigit() else None
            if r is None:
                devices[d] = v
                continue
            devices[d] = replace(v, energy_j=v.other_policy_energy_j, other_policy_energy_j=v.energy_j,
                                 idle_j=v.idle_j * r, idle_error_j=None if v.idle_error_j is None else v.idle_error_j * r)
        stacks = []
        for s in self.stacks:
            r = ratio.get(s.device)
            if r is None:
                stacks.append(s)
                continue
            stacks.append(replace(s, joules=s.joules * r, error_j=s.error_j * r,
                                  kernels=[replace(k, joules=k.joules * r) for k in s.kernels],
                                  node_error_j=None if s.node_error_j is None else [e * r for e in s.node_error_j]))
        return replace(self, devices=devices, stacks=stacks)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        out.update(method=self.method, records=self.records)
        for key in ("cycles", "clock_error_ns"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out["devices"] = {d: _gpu_device_dict(v) for d, v in self.devices.items()}
        out["stacks"] = [_gpu_stack_dict(s) for s in self.stacks]
        if self.cycles is not None:  # a run's capture writes these, an offline trace has none
            out["unplaced"] = dict(self.unplaced)
            out["fold"] = dict(self.fold)
        if self.schedule is not None:
            s = self.schedule
            out["schedule"] = {"spans_ns": [list(x) for x in s.spans_ns], "windows": s.windows, "profiled_s": s.profiled_s,
                               "profiled_share": dict(s.profiled_share)}
        return out


def _gpu_device_dict(d: GpuDevice) -> dict[str, Any]:
    out: dict[str, Any] = {"source": d.source, "energy_j": d.energy_j, "idle_j": d.idle_j, "busy_s": d.busy_s,
                           "update_period_s": d.update_period_s, "short_j": d.short_j, "short_share": d.short_share,
                           "unmeasured_busy_s": d.unmeasured_busy_s}
    if d.idle_error_j is not None:
        out["idle_error_j"] = d.idle_error_j
    if d.split_share is not None:
        out["split_share"] = d.split_share
    if d.other_policy_energy_j is not None:
        out["other_policy_energy_j"] = d.other_policy_energy_j
    if d.busy_lane:
        out["busy_lane"] = [list(c) for c in d.busy_lane]
    return out


def _gpu_stack_dict(s: GpuStack) -> dict[str, Any]:
    out: dict[str, Any] = {"path": [list(f) for f in s.path], "device": s.device, "joules": s.joules,
                           "error_j": s.error_j, "busy_s": s.busy_s, "kernel_names": s.kernel_names,
                           "kernels": [{"name": k.name, "count": k.count, "time_s": k.time_s, "joules": k.joules}
                                       for k in s.kernels]}
    if s.node_error_j is not None:
        out["node_error_j"] = list(s.node_error_j)
    return out


def read_gpu_kernels(raw: Any) -> GpuKernels:
    """The `gpu_kernels` field, checked (a profile can be crafted); a profile written when it was an
    untyped object has the same shape, less the newer fields, which read as absent."""
    w = GPU_KERNELS_FIELD
    if not isinstance(raw, dict):
        raise ProfileFormatError(f"{w} must be an object")
    devices_raw = raw.get("devices") or {}
    stacks_raw = raw.get("stacks") or []
    if not isinstance(devices_raw, dict) or not isinstance(stacks_raw, list):
        raise ProfileFormatError(f"{w}.devices must be an object and {w}.stacks a list")
    devices = {string(k, f"{w}.devices"): _read_gpu_device(v, f"{w}.devices[{k}]") for k, v in devices_raw.items()}
    stacks = [_read_gpu_stack(s, f"{w}.stacks[{i}]") for i, s in enumerate(stacks_raw)]
    schedule = None
    if raw.get("schedule") is not None:
        s = raw["schedule"]
        if not isinstance(s, dict):
            raise ProfileFormatError(f"{w}.schedule must be an object")
        spans = s.get("spans_ns") or []
        if not isinstance(spans, list) or not all(isinstance(x, list) and len(x) == 2 for x in spans):
            raise ProfileFormatError(f"{w}.schedule.spans_ns must be a list of [start, end]")
        schedule = GpuSchedule([[integer(a, f"{w}.schedule.spans_ns") or 0, integer(b, f"{w}.schedule.spans_ns") or 0]
                                for a, b in spans],
                               integer(s.get("windows", len(spans)), f"{w}.schedule.windows") or 0,
                               number(s.get("profiled_s", 0.0), f"{w}.schedule.profiled_s"),
                               _numbers(s.get("profiled_share") or {}, f"{w}.schedule.profiled_share"))
    known = {"method", "devices", "stacks", "records", "cycles", "clock_error_ns", "unplaced", "fold", "schedule"}
    extra = {k: v for k, v in raw.items() if k not in known}
    bounded(extra, w)
    return GpuKernels(method=str(raw.get("method", "")), devices=devices, stacks=stacks,
                      records=integer(raw.get("records", 0), f"{w}.records") or 0,
                      cycles=integer(raw.get("cycles"), f"{w}.cycles", optional=True),
                      clock_error_ns=integer(raw.get("clock_error_ns"), f"{w}.clock_error_ns", optional=True),
                      unplaced={str(k): int(v) for k, v in _numbers(raw.get("unplaced") or {}, f"{w}.unplaced").items()},
                      fold={str(k): int(v) for k, v in _numbers(raw.get("fold") or {}, f"{w}.fold").items()},
                      schedule=schedule, extra=extra)


def _object(raw: Any, w: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ProfileFormatError(f"{w} must be an object")
    return raw


def _items(raw: dict[str, Any], key: str, w: str, ok: Callable[[Any], bool], what: str) -> list[Any]:
    """`raw[key]`, a list whose every item passes `ok` (absent: empty); else one line naming the field."""
    items = raw.get(key) or []
    if not isinstance(items, list) or not all(ok(x) for x in items):
        raise ProfileFormatError(f"{w}.{key} must be {what}")
    return items


def _triple(x: Any) -> bool:
    return isinstance(x, list) and len(x) == 3


def _read_gpu_device(raw: Any, w: str) -> GpuDevice:
    raw = _object(raw, w)
    lane = _items(raw, "busy_lane", w, _triple, "a list of [start_s, end_s, busy_s]")
    return GpuDevice(source=string(raw.get("source", ""), f"{w}.source"),
                     energy_j=number(raw.get("energy_j", 0.0), f"{w}.energy_j"),
                     idle_j=number(raw.get("idle_j", 0.0), f"{w}.idle_j"),
                     busy_s=number(raw.get("busy_s", 0.0), f"{w}.busy_s"),
                     update_period_s=number(raw.get("update_period_s", 0.0), f"{w}.update_period_s"),
                     short_j=number(raw.get("short_j", 0.0), f"{w}.short_j"),
                     short_share=number(raw.get("short_share", 0.0), f"{w}.short_share"),
                     unmeasured_busy_s=number(raw.get("unmeasured_busy_s", 0.0), f"{w}.unmeasured_busy_s"),
                     idle_error_j=optional_number(raw, "idle_error_j", w),
                     split_share=optional_number(raw, "split_share", w),
                     other_policy_energy_j=optional_number(raw, "other_policy_energy_j", w),
                     busy_lane=[[number(a, f"{w}.busy_lane", False), number(b, f"{w}.busy_lane", False),
                                 None if c is None else number(c, f"{w}.busy_lane")] for a, b, c in lane])


def _read_gpu_stack(raw: Any, w: str) -> GpuStack:
    raw = _object(raw, w)
    path_raw = _items(raw, "path", w, _triple, "a list of [function, file, line]")
    path = [(string(f[0], f"{w}.path"), string(f[1], f"{w}.path"), integer(f[2], f"{w}.path") or 0) for f in path_raw]
    kernels_raw = _items(raw, "kernels", w, lambda k: isinstance(k, dict), "a list of objects")
    kernels = [GpuKernelSum(string(k.get("name", ""), f"{w}.kernels.name"),
                            integer(k.get("count", 0), f"{w}.kernels.count") or 0,
                            number(k.get("time_s", 0.0), f"{w}.kernels.time_s"),
                            number(k.get("joules", 0.0), f"{w}.kernels.joules")) for k in kernels_raw]
    node_raw = raw.get("node_error_j")
    node_error = None
    if node_raw is not None:
        if not isinstance(node_raw, list) or len(node_raw) != len(path):
            raise ProfileFormatError(f"{w}.node_error_j must be a list of one number per frame of its path")
        node_error = [number(x, f"{w}.node_error_j") for x in node_raw]
    return GpuStack(path=path, device=integer(raw.get("device", 0), f"{w}.device") or 0,
                    joules=number(raw.get("joules", 0.0), f"{w}.joules"),
                    error_j=number(raw.get("error_j", 0.0), f"{w}.error_j"),
                    busy_s=number(raw.get("busy_s", 0.0), f"{w}.busy_s"),
                    kernel_names=integer(raw.get("kernel_names", len(kernels)), f"{w}.kernel_names") or 0,
                    kernels=kernels, node_error_j=node_error)
