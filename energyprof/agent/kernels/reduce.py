"""One profiler cycle's events, in memory, reduced to what attribution needs: per launch path and
device, the GPU's busy time per short bucket, and the top kernels' names. No JSON.

Runs inside the program at the end of each cycle of the PyTorch profiler (agent/kernel_capture.py),
on `prof.profiler.kineto_results.events()`. What each event gives (torch 2.13, `_KinetoEvent`):
`name()`, `activity_type()` (`cpu_op`, `python_function`, `cuda_runtime`, `kernel`, `gpu_memcpy`,
...), `device_type()`, `device_index()`, `device_resource_id()` (a CPU event's OS thread id; a device
record's stream), `start_ns()`/`end_ns()` (Unix ns), `correlation_id()`, `linked_correlation_id()`,
`sequence_nr()`, `fwd_thread_id()`, `start_thread_id()` (the profiler's own thread id, 1, 2, ...),
`python_id()` and `python_parent_id()`. `stack()` is empty on a CPU build, so Python stacks are
rebuilt from the `python_function` events and their parents.

Launch path of a device record: its runtime call (same correlation id) on its OS thread at its
start; the innermost operator holding it there; that operator's tree path from agent/kernels/autograd.py
(a forward op: its Python stack then its operator chain; a backward op on autograd's thread: the
frames of the thread that called backward() > `[backward]` > the forward op's stack and chain >
the backward ops). Where no operator holds the call: the Python stack there. A path with no Python
frame above its operators starts with `[GPU kernels by operator]`.

The same reduction reads a saved trace: `launches` takes any events with these methods, and the offline
reader (collect/kernels/kineto.py) feeds it a Kineto JSON trace's events through a small adapter, so the
run and `energyprof gpu-trace` place device records by one rule (`Kernel`, one record for both).

Busy time per bucket: each instant with k records busy on a device gives each 1/k of it (as
core/kernels.py splits energy), summed per (path, device, bucket). The sum over paths in a bucket is
the device's busy union there. Memory and output grow with paths x buckets, not with kernels.
"""

from __future__ import annotations

import bisect
import os

from dataclasses import dataclass, field
from operator import itemgetter

from ..modules import name_by_id, wrapper_file
from .autograd import BACKWARD_FRAME, Autograd, Op
from .frames import MODULE_MARK, NOT_FRAMES, OPERATOR_NODE, UNLAUNCHED_NODE, Frame, Path, parse_python_name

# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Mapping, Sequence, Union

    from .torch_compat import ModuleMarks

    Marks = Union[Mapping[str, tuple[int, str]], ModuleMarks]  # a mark's name -> (its module's id, its class)

BUCKET_NS = 1_000_000  # 1 ms: far under NVML's ~100 ms power updates, far over a kernel's launch jitter
TOP_NAMES = 10
DEVICE_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "memcpy": "memcpy",
                "memset": "memset"}
RUNTIME_KINDS = {"cuda_runtime", "cuda_driver", "runtime", "driver", "hip_runtime", "privateuse1_runtime"}
OP_KINDS = {"cpu_op", "user_annotation"}
PROFILER_MARKS = ("ProfilerStep#",)  # record_functions the scheduled profiler wraps each step in
FWDBWD_FLOW = 1  # Kineto's flow type joining the forward op to its backward op (ac2g, type 2, joins a launch to its kernel)
SKIP_FILES = ("runpy", "<frozen runpy>")
# The "device" of backward's CPU time: a cycle's figures under this key are, per tree path below
# `[backward]`, the time of the backward ops (outermost, with all they hold) that path's forward op caused.
BACKWARD_DEVICE = -1
# A sample the sampler took inside backward() during the cycle (its number k) travels as paths under the
# "device" SAMPLE_DEVICE - k: the paths of the backward ops that ran in the span its CPU was measured over,
# each with its share of that span.
SAMPLE_DEVICE = -2
# A BACKWARD_DEVICE path's "kernel name" whose [count, time] are its runs in the cycle and its fastest run's
# ns: the supervisor keeps the fastest over all cycles (core/backward.BackwardFold)
FASTEST_RUN = "[fastest run]"
# The last frame of a forward path under BACKWARD_DEVICE: the time of the ops a module's forward called itself
FORWARD_OPS: Frame = ("[forward ops]", "", 0)

# Frames running when the cycle began, by (code name, current line): [(file, first line)], for the
# profiler names such a frame by its current line (`train.py(50): train`), not its first.
Running = dict[tuple[str, int], list[tuple[str, int]]]


@dataclass
class PathFigures:
    """One launch path on one device over one cycle."""

    busy: dict[int, float] = field(default_factory=dict)  # bucket index (t // BUCKET_NS) -> shared busy ns
    names: dict[str, list[float]] = field(default_factory=dict)  # kernel name -> [count, time ns]


@dataclass
class Cycle:
    """A cycle reduced: its span on energyprof's clock (perf_counter_ns) and its figures."""

    t0: int
    t1: int  # the later of the cycle's end and its last device record's end
    bucket_ns: int
    figures: dict[tuple[Path, int], PathFigures]  # (path, device) -> figures
    counts: dict[str, int]  # what could not be placed or linked, by reason
    records: int = 0  # device records seen
    cost_ns: int = 0  # the capture's own CPU so far (set by the capture: charged to energyprof)


class FullPaths:
    """A file as the profiler names it (its path less the sys.path entry that holds it) -> the path the
    program's code objects carry: the first sys.path entry under which it exists. Cached per file (the
    program's files: bounded by lines); unchanged where none holds it."""

    def __init__(self, path: Sequence[str]) -> None:
        self.path = [p for p in path if isinstance(p, str) and p]
        self.cache: dict[str, str] = {}

    def __call__(self, file: str) -> str:
        got = self.cache.get(file)
        if got is None:
            got = file
            if file and not os.path.isabs(file) and not file.startswith("<"):
                for entry in self.path:
                    candidate = os.path.join(entry, file)
                    if os.path.isfile(candidate):
                        got = candidate
                        break
            self.cache[file] = got
        return got


def running_frames(frames: Iterable[Any]) -> Running:
    """The frames running now (`sys._current_frames().values()`), keyed for `reduce`."""
    out: Running = {}
    for f in frames:
        while f is not None:
            code = f.f_code
            entry = (code.co_filename, code.co_firstlineno)
            lst = out.setdefault((code.co_name, f.f_lineno), [])
            if entry not in lst:
                lst.append(entry)
            f = f.f_back
    return out


def _first_line(frame: Frame, running: Running) -> Frame:
    fn, file, line = frame
    for full, first in running.get((fn, line), ()):
        if full == file or (file and full.endswith(("/" + file, "\\" + file))):
            return (fn, file, first)
    return frame


def _keep(frame: Frame, package: str) -> bool:
    file = frame[1]
    return not (file in SKIP_FILES or file.endswith("/runpy.py") or file.startswith("energyprof/")
                or (bool(package) and file.startswith(package)))


class _Nest:
    """One thread's spans (start, end, key), for 'the innermost span holding t'."""

    def __init__(self, spans: list[tuple[int, int, int]]) -> None:
        # by start, the longer first where two start together (two stable sorts: no key tuple per span)
        spans.sort(key=itemgetter(1), reverse=True)
        spans.sort(key=itemgetter(0))
        self.starts = [s[0] for s in spans]
        self.ends = [s[1] for s in spans]
        self.keys = [s[2] for s in spans]
        self.outer: list[int] = []  # per span: the index of its innermost holder (-1: none)
        outer, ends, open_ = self.outer, self.ends, []
        for i, a in enumerate(self.starts):
            while open_ and ends[open_[-1]] < a:
                open_.pop()
            outer.append(open_[-1] if open_ else -1)
            open_.append(i)

    def at(self, t: int) -> int | None:
        ends, outer = self.ends, self.outer
        k = bisect.bisect_right(self.starts, t) - 1
        while k >= 0:
            if ends[k] >= t:
                return self.keys[k]
            k = outer[k]
        return None


def _kind_name(v: Any) -> str:
    return str(getattr(v, "name", v)).rsplit(".", 1)[-1].upper()


class _Read:
    """A cycle's events sorted by kind into the tables the reduction reads (a cycle holds tens of thousands)."""

    def __init__(self, modules: Marks) -> None:
        self.modules = modules
        self.py: dict[int, tuple[Frame | None, int, int]] = {}  # python id -> (frame or None, parent id, os thread)
        self.marks: dict[int, tuple[int, str]] = {}  # python id of a module call's mark -> (module id, class)
        self.py_spans: dict[int, list[tuple[int, int, int]]] = {}
        self.raw_ops: list[tuple[str, int, int, int, int, int, int]] = []  # (name, prof tid, OS tid, start, end, seq, fwd)
        self.op_events: list[Any] = []  # per op id, its event: correlation ids are read where device records ask
        self.prof_to_os: dict[int, int] = {}
        self.runtime: dict[int, tuple[int, int, str]] = {}  # correlation -> (OS thread, start, name)
        self.flow_ends: dict[int, list[tuple[bool, int]]] = {}  # Kineto's fwdbwd flows (type 1): id -> [(start?, op id)]
        # (device, name, kind, start, end, correlation, linked correlation, stream)
        self.device: list[tuple[int, str, str, int, int, int, int, int]] = []
        self.first_py: int | None = None
        self.unreadable = 0
        # a python_function name -> (its frame, None for a C call or mark; its module, None if not a module's
        # mark): one per line and module, read once, where the events repeat them each step
        self.names: dict[str, tuple[Frame | None, tuple[int, str] | None]] = {}

    def read(self, events: Sequence[Any]) -> None:
        """The events read into this cycle's tables. One loop with its tables held in locals and the two kinds
        that make nearly all events (Python calls, operators) read in line: the per-event cost is the cost."""
        py, marks, py_spans, raw_ops, op_events, prof_to_os = (self.py, self.marks, self.py_spans, self.raw_ops,
                                                                self.op_events, self.prof_to_os)
        names, named = self.names, self._named
        first = self.first_py
        for ev in events:
            try:
                kind = ev.activity_type()
                if kind == "python_function":
                    start, pid, name, tid = ev.start_ns(), ev.python_id(), ev.name(), ev.device_resource_id()
                    frame, mark = names.get(name) or named(name)
                    py[pid] = (frame, ev.python_parent_id(), tid)
                    if mark is not None:
                        marks[pid] = mark
                    spans = py_spans.get(tid)
                    if spans is None:
                        spans = py_spans[tid] = []
                    spans.append((start, ev.end_ns(), pid))
                    if first is None or start < first:
                        first = start
                elif kind in OP_KINDS:
                    name = ev.name()
                    if name.startswith(PROFILER_MARKS):
                        continue  # the profiler's own step marks: a path per step would grow with steps, not lines
                    oid = len(raw_ops)
                    tid, ptid = ev.device_resource_id(), ev.start_thread_id()
                    prof_to_os.setdefault(ptid, tid)
                    raw_ops.append((name, ptid, tid, ev.start_ns(), ev.end_ns(), ev.sequence_nr(), ev.fwd_thread_id()))
                    op_events.append(ev)
                    if ev.flow_type() == FWDBWD_FLOW:
                        self.flow_ends.setdefault(ev.flow_id(), []).append((bool(ev.flow_start()), oid))
                elif kind in RUNTIME_KINDS:
                    self.runtime_call(ev)
                elif kind in DEVICE_KINDS and _kind_name(ev.device_type()) != "CPU":
                    self.device_record(ev, kind)
            except UnicodeDecodeError:  # a name torch could not decode (seen on a CPU build, now and then): that event only
                self.unreadable += 1
        self.first_py = first

    def _named(self, name: str) -> tuple[Frame | None, tuple[int, str] | None]:
        frame = None if name.startswith(NOT_FRAMES) else parse_python_name(name)
        got = self.names[name] = (frame, self.modules.get(name) if name.startswith(MODULE_MARK) else None)
        return got

    def op_spans(self) -> dict[int, list[tuple[int, int, int]]]:
        """Each OS thread's ops as (start, end, op id), in event order: only device records' launches ask."""
        out: dict[int, list[tuple[int, int, int]]] = {}
        for oid, (_name, _ptid, tid, start, end, _seq, _fwd) in enumerate(self.raw_ops):
            spans = out.get(tid)
            if spans is None:
                spans = out[tid] = []
            spans.append((start, end, oid))
        return out

    def op_by_corr(self) -> dict[int, int]:
        """A correlation id -> the (last) op that carries it, for a device record's linked correlation."""
        out: dict[int, int] = {}
        for oid, ev in enumerate(self.op_events):
            corr = ev.correlation_id()
            if corr:
                out[corr] = oid
        return out

    def runtime_call(self, ev: Any) -> None:
        self.runtime[ev.correlation_id()] = (ev.device_resource_id(), ev.start_ns(), ev.name())

    def device_record(self, ev: Any, kind: str) -> None:
        self.device.append((ev.device_index(), ev.name(), DEVICE_KINDS[kind], ev.start_ns(), ev.end_ns(),
                            ev.correlation_id(), ev.linked_correlation_id(), ev.device_resource_id()))


@dataclass(slots=True)
class Kernel:
    """One device record (kernel, memcpy, memset) with its launch, as the run's reduction and the offline
    reader both place it; `path` is the tree path its work goes to (`_Launches`'s rule)."""

    device: int
    stream: int
    name: str
    kind: str  # kernel | memcpy | memset
    start_ns: int  # on the events' clock
    end_ns: int
    correlation: int | None
    path: Path = ()
    op: int | None = None  # the innermost operator holding its runtime call (an `Autograd` op id)
    thread: int | None = None  # the runtime call's thread, as the events name it (None: no call found)
    runtime: str | None = None  # the runtime call's name (cudaLaunchKernel, hipMemcpyWithStream, ...)
    launched_ns: int | None = None  # the runtime call's start
    python: Path = ()  # the Python frames holding the runtime call (the offline reader fills them in)
    operators: tuple[str, ...] = ()  # the operators holding it, outermost first (the same)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def stack(self) -> Path:
        """The tree path this record's joules go to: `path` where the reduction placed it; for a record
        made by hand, its Python frames then its operators, or with no Python frame a labelled node then
        its operators (or its runtime call, or that none was found)."""
        if self.path:
            return self.path
        ops = tuple((op, "", 0) for op in self.operators)
        if self.python:
            return self.python + ops
        if ops:
            return ((OPERATOR_NODE, "", 0),) + ops
        if self.runtime:
            return ((OPERATOR_NODE, "", 0), (self.runtime, "", 0))
        return ((UNLAUNCHED_NODE, "", 0),)


class _Launches:
    """A device record's launch path: its runtime call's innermost operator (that op's tree path), else the
    Python stack there, else the operator its linked correlation names, else a labelled node. A path with
    no Python frame above its operators starts with `OPERATOR_NODE`."""

    def __init__(self, got: _Read, auto: Autograd, frames_on: Callable[[int, int], Path], counts: dict[str, int]) -> None:
        self.got, self.auto, self.frames_on, self.counts = got, auto, frames_on, counts
        self.op_nest = {t: _Nest(s) for t, s in got.op_spans().items()}
        self.op_by_corr = got.op_by_corr()
        self.paths: dict[int, Path] = {}  # op id -> its path, per cycle

    def _count(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1

    def _op_path(self, oid: int) -> Path:
        got = self.paths.get(oid)
        if got is None:
            got = self.auto.path(oid)
            if not got or got[0] == BACKWARD_FRAME or not (self.auto.links.is_backward(oid) or self.auto.ops[oid].stack):
                got = ((OPERATOR_NODE, "", 0),) + got
            self.paths[oid] = got
        return got

    def __call__(self, record: tuple[int, str, str, int, int, int, int, int]) -> Kernel:
        dev, name, kind, s, e, corr, linked, stream = record
        rt = self.got.runtime.get(corr)
        if rt is not None:
            tid, t, rname = rt
            nest = self.op_nest.get(tid)
            oid = nest.at(t) if nest is not None else None
            if oid is not None:
                return Kernel(dev, stream, name, kind, s, e, corr, self._op_path(oid), oid, tid, rname, t)
            stack = self.frames_on(tid, t)
            return Kernel(dev, stream, name, kind, s, e, corr, stack or ((OPERATOR_NODE, "", 0), (rname, "", 0)),
                          None, tid, rname, t)
        oid = self.op_by_corr.get(linked) if linked else None
        if oid is not None:
            self._count("launch found by its operator (no runtime call)")
            return Kernel(dev, stream, name, kind, s, e, corr, self._op_path(oid), oid)
        self._count("device record with no launch in the cycle")
        return Kernel(dev, stream, name, kind, s, e, corr, ((UNLAUNCHED_NODE, "", 0),))


@dataclass
class Launches:
    """A window's device records placed on their launch paths, with the ops and links that placed them."""

    records: list[Kernel]
    auto: Autograd
    frames_on: Callable[[int, int], Path]  # (thread, t) -> the Python frames running there
    counts: dict[str, int]  # what could not be placed or linked, by reason


def _linked(got: _Read, running: Running | None, package: str, files: Callable[[str], str] | None,
            program_frames: bool, caller_thread: int | None) -> tuple[Autograd, Callable[[int, int], Path]]:
    """The window's ops with their Python stacks and backward links, and the Python frames on a thread at an
    instant. `program_frames`: name frames as the sampler does (energyprof's and runpy's left out, torch's
    module-call wrappers folded, frames running at the start by their first line); else as the events give them."""
    py_stack = _Stacks(got.py, got.marks, got.py_spans, got.first_py, running or {}, package, files or (lambda f: f),
                       program_frames)
    py_nest = {t: _Nest(s) for t, s in got.py_spans.items()}

    def frames_on(os_tid: int, t: int) -> Path:
        nest = py_nest.get(os_tid)
        pid = nest.at(t) if nest is not None else None
        return py_stack(pid) if pid is not None else ()

    ops: list[Op] = []
    for i, (name, ptid, tid, a, b, seq, fwd) in enumerate(got.raw_ops):  # frames_on in line: once per op
        nest = py_nest.get(tid)
        pid = nest.at(a) if nest is not None else None
        ops.append(Op(i, name, ptid, a, b, seq, fwd, py_stack(pid) if pid is not None else ()))
    flows = {b: f for ends in got.flow_ends.values() for fs, f in ends if fs for bs, b in ends if not bs}
    auto = Autograd(ops, flows, frames_at=lambda ptid, t: frames_on(got.prof_to_os.get(ptid, ptid), t),
                    caller_thread=caller_thread)
    return auto, frames_on


def launches(events: Iterable[Any], *, program_frames: bool = False, caller_thread: int | None = None) -> Launches:
    """Events (the profiler's in memory, or a saved trace's through an adapter with the same methods) ->
    each device record on its launch path, on the events' own clock. The offline reader's entry into the
    reduction the run uses: the same ops, links and paths. `caller_thread`: the thread taken to have
    called backward() where no link names one."""
    got = _Read({})
    got.read(events)
    counts: dict[str, int] = {"event(s) whose name could not be read": got.unreadable} if got.unreadable else {}
    auto, frames_on = _linked(got, None, "", None, program_frames, caller_thread)
    for reason, n in auto.links.unlinked.items():
        counts[f"backward: {reason}"] = counts.get(f"backward: {reason}", 0) + n
    place = _Launches(got, auto, frames_on, counts)
    return Launches([place(r) for r in got.device if r[4] >= r[3]], auto, frames_on, counts)


def reduce_events(events: Sequence[Any], *, unix_minus_perf: int, t0: int, t1: int, running: Running | None = None,
                  package: str = "", bucket_ns: int = BUCKET_NS, files: Callable[[str], str] | None = None,
                  modules: Marks | None = None, backward: bool = False,
                  samples: Sequence[tuple[int, int, int]] = ()) -> Cycle:
    """A cycle's events -> its reduced figures on energyprof's clock (`perf = unix - unix_minus_perf`);
    [t0, t1] is the cycle's span on that clock. `files`: the full path of a file as the profiler names it
    (less its sys.path entry), so that a frame the sampler never saw is still known as a library's.
    `modules`: the profiler's module marks (`nn.Module: Linear_0`) -> (the module's id, its class), so a
    module's `forward` frame is named by its path as the sampler names it (agent/modules.py).
    `backward`: also reduce backward's CPU time per path (`BACKWARD_DEVICE`), for training on any device.
    `samples`: (number, span start, span end in perf ns) of samples taken inside backward(): each gets the
    paths of the backward ops that ran in its span, with their shares of it (`SAMPLE_DEVICE - number`)."""
    got = _Read(modules or {})
    got.read(events)
    counts: dict[str, int] = {"event(s) whose name could not be read": got.unreadable} if got.unreadable else {}
    if not got.device and not (backward and got.raw_ops):  # nothing to place: stacks and links are built for these only
        return Cycle(t0, t1, bucket_ns, {}, counts, 0)
    auto, frames_on = _linked(got, running, package, files, True, None)
    for reason, n in auto.links.unlinked.items():
        counts[f"backward: {reason}"] = counts.get(f"backward: {reason}", 0) + n
    figures: dict[tuple[Path, int], PathFigures] = {}
    if backward:
        backward_time(auto, figures, unix_minus_perf, bucket_ns)
        forward_time(auto, figures, unix_minus_perf, bucket_ns)
        samples_in(auto, samples, figures, unix_minus_perf)
    if not got.device:
        return Cycle(t0, t1, bucket_ns, figures, counts, 0)
    place = _Launches(got, auto, frames_on, counts)
    last_end = _place_device([place(r) for r in got.device if r[4] >= r[3]], figures, unix_minus_perf, bucket_ns)
    _keep_top_names(figures)
    return Cycle(t0, max(t1, last_end), bucket_ns, figures, counts, len(got.device))


def _place_device(records: list[Kernel], figures: dict[tuple[Path, int], PathFigures], unix_minus_perf: int,
                  bucket_ns: int) -> int:
    """Device records onto their launch paths: names counted, busy time shared per bucket. Returns the
    last record's end on energyprof's clock (0 with none)."""
    by_device: dict[int, list[tuple[int, int, Path, str]]] = {}
    last_end = 0
    for rec in records:
        s, e, path, name, dev = rec.start_ns - unix_minus_perf, rec.end_ns - unix_minus_perf, rec.path, rec.name, rec.device
        last_end = max(last_end, e)
        by_device.setdefault(dev, []).append((s, e, path, name))
        fig = figures.setdefault((path, dev), PathFigures())
        n = fig.names.setdefault(name, [0, 0.0])
        n[0] += 1
        n[1] += e - s
    for dev, recs in by_device.items():
        _share_busy(recs, dev, figures, bucket_ns)
    return last_end


def _keep_top_names(figures: dict[tuple[Path, int], PathFigures]) -> None:
    for fig in figures.values():
        if len(fig.names) > TOP_NAMES:
            top = sorted(fig.names.items(), key=lambda kv: -kv[1][1])
            kept = dict(top[:TOP_NAMES])
            rest = top[TOP_NAMES:]
            kept[f"[{len(rest)} other kernel names]"] = [sum(v[0] for _, v in rest), sum(v[1] for _, v in rest)]
            fig.names = kept


class _Stacks:
    """Python stacks from the profiler's `python_function` events, memoised per python id. Frames already
    running when the cycle began (stamped at its start) are named by their first line, as the sampler
    names them; torch's module-call wrappers are left out, and a module's `forward` frame is named by the
    module's path (the mark of its call above it gives the module, the outermost mark the root)."""

    def __init__(self, py: dict[int, tuple[Frame | None, int, int]], marks: dict[int, tuple[int, str]],
                 py_spans: dict[int, list[tuple[int, int, int]]], first_py: int | None, running: Running,
                 package: str, files: Callable[[str], str], program_frames: bool = True) -> None:
        self.py, self.marks, self.running, self.package, self.files = py, marks, running, package, files
        self.program_frames = program_frames
        self.early = (first_py or 0) + 1_000_000
        self.starts = {pid: s for spans in py_spans.values() for s, _, pid in spans}
        # python id -> (its stack, the root module's id, the module whose forward comes next)
        self.ctx: dict[int, tuple[Path, int | None, tuple[int, str] | None]] = {-1: ((), None, None)}

    def _frame(self, p: int, frame: Frame) -> Frame | None:
        if not self.program_frames:
            return frame
        if not _keep(frame, self.package) or wrapper_file(frame[1], frame[0]):
            return None
        if self.starts.get(p, self.early + 1) <= self.early:
            frame = _first_line(frame, self.running)
        full = self.files(frame[1])
        if full != frame[1]:
            frame = (frame[0], full, frame[2])
            if not _keep(frame, self.package):
                return None
        return frame

    def __call__(self, pid: int) -> Path:
        py, ctx = self.py, self.ctx
        known = ctx.get(pid)
        if known is not None:  # most calls: an op's frame held ops before it
            return known[0]
        chain = []
        cur = pid
        while cur not in ctx and cur in py:
            chain.append(cur)
            cur = py[cur][1]
        base, root, pending = ctx.get(cur, ((), None, None))
        for p in reversed(chain):
            mark = self.marks.get(p)
            frame = py[p][0]
            if mark is not None:
                pending = mark
                root = mark[0] if root is None else root
            elif frame is not None:
                kept = self._frame(p, frame)
                if kept is not None:
                    if pending is not None and kept[0] == "forward":
                        kept = (name_by_id(pending[0], pending[1], root), kept[1], kept[2])
                        pending = None
                    base = base + (kept,)
            ctx[p] = (base, root, pending)
        return ctx.get(pid, ((), None, None))[0]


def backward_time(auto: Autograd, figures: dict[tuple[Path, int], PathFigures], unix_minus_perf: int,
                  bucket_ns: int) -> None:
    """Each outermost backward op's time (all it holds: one thread runs one at a time) on its tree path,
    under `BACKWARD_DEVICE`, in the bucket of its first start: the caller's frames, `[backward]`, then the
    forward op's module frames and operators, or the op's own name where it has no forward op
    (AccumulateGrad). A path's time is its fastest run x their number: op times are wall times, and a run
    the OS held off the CPU (a busy machine) would otherwise give its wait to whichever op it hit; the
    fastest of a path's runs (one per step) is the one least held off, taken op by op within the run
    (`fastest_by_op`): a backward op of a few ms was held in most of 6 runs at load 5-9, its inner ops less."""
    runs: dict[Path, list[tuple[str, ...]]] = {}
    pieces: dict[Path, list[list[int]]] = {}
    first: dict[Path, int] = {}
    inner: dict[int, list[Op]] = {}
    for oid, root in auto.links.root_of.items():
        inner.setdefault(root, []).append(auto.ops[oid])
    for oid, held in inner.items():
        op = auto.ops[oid]
        if op.end_ns <= op.start_ns:
            continue
        path = auto.path(oid)
        if BACKWARD_FRAME not in path:
            continue
        shape, own = _self_times(held, auto.parent)
        runs.setdefault(path, []).append(shape)
        pieces.setdefault(path, []).append(own)
        first[path] = min(first.get(path, op.start_ns), op.start_ns)
    fastest = {path: fastest_by_op(runs[path], pieces[path]) for path in runs}
    _put_runs({p: [fastest[p]] * len(runs[p]) for p in runs}, first, figures, unix_minus_perf, bucket_ns)


def _self_times(held: list[Op], parent: dict[int, int | None]) -> tuple[tuple[str, ...], list[int]]:
    """One outermost backward op and the ops it holds: their shape (each op's name and its holder's place,
    in start order) and each op's own time (its span less its direct children's), in that order."""
    held = sorted(held, key=lambda o: (o.start_ns, -o.end_ns, o.id))
    place = {o.id: i for i, o in enumerate(held)}
    own = [o.end_ns - o.start_ns for o in held]
    shape = []
    for o in held:
        holder = parent.get(o.id)
        up = -1 if holder is None else place.get(holder, -1)
        if up >= 0:
            own[up] -= o.end_ns - o.start_ns
        shape.append(f"{up}:{o.name}")
    return tuple(shape), [max(0, t) for t in own]


def fastest_by_op(shapes: list[tuple[str, ...]], own: list[list[int]]) -> int:
    """A path's fastest run, op by op: among runs of one shape (the same ops nested alike), the sum over
    the ops of each one's fastest own time. A run the OS held off the CPU gives the wait to the op it hit;
    an op a tenth of the run is held in fewer runs than the run is, so each op's fastest is less often
    held. Never more than the fastest whole run; over runs of several shapes, the least."""
    by_shape: dict[tuple[str, ...], list[list[int]]] = {}
    for shape, times in zip(shapes, own):
        by_shape.setdefault(shape, []).append(times)
    return min(sum(min(col) for col in zip(*group)) for group in by_shape.values())


def _put_runs(runs: dict[Path, list[int]], first: dict[Path, int], figures: dict[tuple[Path, int], PathFigures],
              unix_minus_perf: int, bucket_ns: int) -> None:
    """Each path's runs under `BACKWARD_DEVICE`: fastest x runs in the bucket of its first start, and
    `FASTEST_RUN` (runs, fastest ns), so the supervisor can keep the fastest over cycles."""
    for path, times in runs.items():
        fig = figures.setdefault((path, BACKWARD_DEVICE), PathFigures())
        b = (first[path] - unix_minus_perf) // bucket_ns
        fig.busy[b] = fig.busy.get(b, 0.0) + min(times) * len(times)
        fig.names[FASTEST_RUN] = [len(times), float(min(times))]


def is_module_frame(frame: Frame) -> bool:
    """A module's `forward` frame as agent/modules.py names it (`four.l.0 (Linear)`): no qualified name
    holds a space and ends with `)`."""
    return " " in frame[0] and frame[0].endswith(")")


def forward_time(auto: Autograd, figures: dict[tuple[Path, int], PathFigures], unix_minus_perf: int,
                 bucket_ns: int) -> None:
    """Each outermost forward op called straight from a module's `forward` (its stack's innermost frame a
    module frame): its time on that stack + `FORWARD_OPS`, under `BACKWARD_DEVICE` (no `[backward]` in the
    path: core/backward.py reads these as the forward's proportions). Fastest run x runs, as backward's."""
    runs: dict[Path, list[int]] = {}
    first: dict[Path, int] = {}
    for op in auto.ops.values():
        if op.end_ns <= op.start_ns or not op.stack or not is_module_frame(op.stack[-1]):
            continue
        if auto.links.is_backward(op.id) or op.name.startswith(PROFILER_MARKS):
            continue
        parent = auto.parent.get(op.id)
        if parent is not None and not auto.ops[parent].name.startswith(PROFILER_MARKS):
            continue  # inside another op: its time is in that op's
        path = op.stack + (FORWARD_OPS,)
        runs.setdefault(path, []).append(op.end_ns - op.start_ns)
        first[path] = min(first.get(path, op.start_ns), op.start_ns)
    _put_runs(runs, first, figures, unix_minus_perf, bucket_ns)


def samples_in(auto: Autograd, samples: Sequence[tuple[int, int, int]],
               figures: dict[tuple[Path, int], PathFigures], unix_minus_perf: int) -> None:
    """Each sample's span (the last tick to its own: its CPU was spent over it) -> the outermost backward ops
    that ran in it, each path with its share of the span, under `SAMPLE_DEVICE - number`; what no backward op
    covers stays with the engine. Not the one op at the tick's instant: beside two CPU hogs, one tick's 0.24 J
    put whole on a 30 us TanhBackward0 moved a decoder's backward by 18%."""
    roots = sorted((auto.ops[r].start_ns, auto.ops[r].end_ns, r) for r in set(auto.links.root_of.values()))
    if not samples or not roots:
        return
    starts = [a for a, _, _ in roots]
    longest = max(b - a for a, b, _ in roots)
    paths: dict[int, Path] = {}
    for k, t0, t1 in samples:
        a, b = t0 + unix_minus_perf, t1 + unix_minus_perf
        shares: dict[Path, float] = {}
        i = bisect.bisect_left(starts, b) - 1
        while b > a and i >= 0 and starts[i] + longest > a:  # every op that starts before b and may end after a
            start, end, r = roots[i]
            i -= 1
            overlap = min(end, b) - max(start, a)
            path = (paths[r] if r in paths else paths.setdefault(r, auto.path(r))) if overlap > 0 else ()
            if BACKWARD_FRAME in path:
                shares[path] = shares.get(path, 0.0) + overlap / (b - a)
        for path, share in shares.items():  # ops of several threads at once may add to over 1 (core/backward.py)
            figures[(path, SAMPLE_DEVICE - k)] = PathFigures({0: share})


def _share_busy(recs: list[tuple[int, int, Path, str]], dev: int, figures: dict[tuple[Path, int], PathFigures],
                bucket_ns: int) -> None:
    """Each instant's busy time shared among the records busy then (1/k each), per path and bucket."""
    points: dict[int, list[tuple[int, int]]] = {}
    for i, (s, e, _, _) in enumerate(recs):
        if e > s:
            points.setdefault(s, []).append((1, i))
            points.setdefault(e, []).append((0, i))
    order = sorted(points)
    active: dict[int, None] = {}
    for a, b in zip(order, order[1:]):
        for kind, i in points[a]:
            if kind == 0:
                active.pop(i, None)
        for kind, i in points[a]:
            if kind == 1:
                active[i] = None
        if not active:
            continue
        k = len(active)
        targets = [figures[(recs[i][2], dev)].busy for i in active]
        t = a
        while t < b:  # the segment cut at bucket edges
            bucket = t // bucket_ns
            u = min(b, (bucket + 1) * bucket_ns)
            share = (u - t) / k
            for busy in targets:
                busy[bucket] = busy.get(bucket, 0.0) + share
            t = u


def fold_names(into: dict[str, list[float]], names: dict[str, Sequence[float]], keep: int = 4 * TOP_NAMES) -> None:
    """Kernel names of a cycle added to a running table, kept to the `keep` longest (bounded by lines)."""
    for name, (count, time_ns) in names.items():
        cur = into.setdefault(name, [0, 0.0])
        cur[0] += count
        cur[1] += time_ns
    if len(into) > keep:
        for name, _ in sorted(into.items(), key=lambda kv: kv[1][1])[: len(into) - keep]:
            del into[name]


if TYPE_CHECKING:
    Sink = Callable[[Cycle], None]
