"""Read a PyTorch profiler (Kineto) trace into kernel facts, each with the stack that launched it.

The trace's events go through a small adapter (`TraceEvent`: each JSON event with the methods of the
profiler's in-memory events) into the reduction the run uses (agent/kernels/reduce.launches): one code
path builds the launch paths, links backward to forward and counts what it could not place, in the run
and here. What this reader adds is the JSON: the stream, the times, the thread and Python ids a saved
trace does not hold, and the flow events written beside their ops.

A device record (`cat` kernel, gpu_memcpy, gpu_memset) carries `args.correlation`, equal to its
launching runtime call's (`cuda_runtime` / `cuda_driver`; ROCm traces use the same categories).
The runtime call's launch path is its innermost `cpu_op` on its own thread (its Python stack then its
operator chain), found by time nesting. `External id` is not used: it is often missing on device
records, while the correlation id is always there. A saved trace has no Python ids: a
`python_function` event's parent is the one that holds it on its thread.

Backward: autograd runs backward's ops on its own thread, which has no Python stack. Each
backward op is linked to the forward op it differentiates (agent/kernels/autograd.py: the same `Sequence
number` on its `Fwd thread id`'s thread, the latest-started before it; a `fwdbwd` flow, `ph` s/f,
where present), and its kernels get the path `backward()`'s caller > `[backward]` > the forward
op's Python stack and operators > the backward ops. A trace without Python stacks gets the same
link on the operator chain, under `[GPU kernels by operator]`. What could not be linked is
counted by reason (`KernelTrace.backward`).

The file is read as a stream (jsonstream.py): memory follows the events kept, not the file. Frames keep
the names the trace gives them (no sampler to meet here).

Times: Kineto writes `ts`/`dur` in microseconds (floats with ns digits). Traces that carry
`baseTimeNanoseconds` give Unix time as `baseTimeNanoseconds + ts * 1000`; older ones wrote Unix
microseconds directly. Both read here as `ts * 1000` ns on the trace's own clock; `unix_base_ns`
says how to reach Unix time. Aligning that clock with a power log is the caller's job (see
`agent/kernel_capture.py`'s `clock_offset` for the in-process case and docs/gpu.md).
"""

from __future__ import annotations

import gzip
import math
import sys
import zlib
from pathlib import Path
from typing import Any

from ...record import field, record
from ...agent.kernels.frames import OPERATOR_NODE, UNLAUNCHED_NODE, Frame, parse_python_name  # noqa: F401
from ...agent.kernels.reduce import FWDBWD_FLOW, Kernel, Launches, launches
from .jsonstream import StreamError, TraceStream

DEVICE_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset",
               "memcpy": "memcpy", "memset": "memset"}  # lower-cased `cat` -> kind (older traces: Memcpy, Memset)
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
META_KEYS = frozenset({"schemaVersion", "traceName", "with_stack", "baseTimeNanoseconds", "displayTimeUnit"})
MAX_TS_US = 2.0 ** 62 / 1000  # |ts| and dur beyond this (about 146 years in us) are not a profiler's
FLOW_CAT = "fwdbwd"


class TraceFormatError(ValueError):
    """The file is not a Kineto trace this reader understands (one line for the user)."""


@record
class BackwardLinks:
    """How backward's work was linked: ops and device records on backward ops, linked or not (by reason)."""

    ops: int = 0  # backward ops in the trace
    linked_ops: int = 0
    unlinked_ops: dict[str, int] = field(default_factory=dict)  # reason -> ops
    records: int = 0  # device records launched under a backward op
    linked_records: int = 0
    unlinked_records: dict[str, int] = field(default_factory=dict)  # reason -> device records
    flows: int = 0  # fwdbwd flow events read (a pair is a certain link)
    unlinked_paths: set[tuple[Frame, ...]] = field(default_factory=set)  # the tree paths of unlinked records

    @property
    def unlinked_records_total(self) -> int:
        return sum(self.unlinked_records.values())


@record
class KernelTrace:
    kernels: list[Kernel]
    start_ns: int  # the earliest event of any kind, on the trace's clock
    end_ns: int  # the latest end of any event
    unix_base_ns: int  # add to the trace's ns to get Unix ns (0 when `ts` was Unix already)
    has_python: bool
    unmatched: int = 0  # device records with no runtime call of the same correlation
    meta: dict[str, Any] = field(default_factory=dict)
    backward: BackwardLinks = field(default_factory=BackwardLinks)
    skipped: int = 0  # complete events without a usable ts/dur (missing, wrong type, out of range), left out


def load(path: str | Path) -> KernelTrace:
    """Read a trace file (.json or .json.gz) as a stream."""
    p = Path(path)
    reader = _Reader()
    try:
        with open(p, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            fh: Any = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
            stream = TraceStream(fh, keep=META_KEYS)
            for ev in stream.events():
                reader.add(ev)
    except StreamError as exc:
        raise TraceFormatError(f"trace {path}: {exc}") from None
    except (EOFError, zlib.error, gzip.BadGzipFile):
        raise TraceFormatError(f"trace {path} is a damaged or truncated gzip file") from None
    except UnicodeDecodeError:
        raise TraceFormatError(f"trace {path} is neither UTF-8 JSON text nor gzipped JSON") from None
    except OSError as exc:
        raise TraceFormatError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    except MemoryError:
        raise TraceFormatError(f"trace {path}: out of memory reading it") from None
    if not stream.found_events:
        raise TraceFormatError(f"{path} is not a Kineto/Chrome trace (no traceEvents list)")
    return reader.finish(stream.meta, str(path))


def parse(doc: Any, where: str = "trace") -> KernelTrace:
    """A loaded Kineto document -> kernels with launch stacks."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc if isinstance(doc, list) else None
    if not isinstance(events, list):
        raise TraceFormatError(f"{where} is not a Kineto/Chrome trace (no traceEvents list)")
    reader = _Reader()
    for ev in events:
        reader.add(ev)
    return reader.finish({k: v for k, v in doc.items() if k in META_KEYS} if isinstance(doc, dict) else {}, where)


class TraceEvent:
    """One kept JSON event with the methods the reduction reads of the profiler's in-memory events
    (agent/kernels/reduce.py's `_Read`). Threads are numbered per (pid, tid), negative, so that one is
    never taken for a profiler's own thread id (`Fwd thread id` 1, 2, ...), which a saved trace does not
    map to its threads."""

    __slots__ = ("kind", "_name", "thread", "start", "end", "corr", "device", "stream", "seq", "fwd", "pid", "parent",
                 "flow", "flow_is_start")

    def __init__(self, kind: str, name: str, thread: int, start: int, end: int, corr: int | None = None,
                 device: int = 0, stream: int = 0, seq: int = -1, fwd: int = 0) -> None:
        self.kind, self._name, self.thread, self.start, self.end = kind, name, thread, start, end
        self.corr, self.device, self.stream, self.seq, self.fwd = corr, device, stream, seq, fwd
        self.pid, self.parent = -1, -1  # python_function: its id (file order) and its holder's
        self.flow: Any = None  # a fwdbwd flow's id, where one is bound to this op
        self.flow_is_start = False

    def activity_type(self) -> str:
        return self.kind

    def name(self) -> str:
        return self._name

    def device_type(self) -> str:
        return "CPU" if self.kind not in DEVICE_CATS else "CUDA"

    def device_index(self) -> int:
        return self.device

    def device_resource_id(self) -> int:
        return self.stream if self.kind in DEVICE_CATS else self.thread

    def start_thread_id(self) -> int:
        return self.thread

    def start_ns(self) -> int:
        return self.start

    def end_ns(self) -> int:
        return self.end

    def correlation_id(self) -> int | None:
        return self.corr

    def linked_correlation_id(self) -> int:
        return 0

    def sequence_nr(self) -> int:
        return self.seq

    def fwd_thread_id(self) -> int:
        return self.fwd

    def python_id(self) -> int:
        return self.pid

    def python_parent_id(self) -> int:
        return self.parent

    def flow_type(self) -> int:
        return FWDBWD_FLOW if self.flow is not None else 0

    def flow_id(self) -> Any:
        return self.flow

    def flow_start(self) -> bool:
        return self.flow_is_start


class _Reader:
    """JSON events in, one at a time, as `TraceEvent`s (names interned); what the trace says of itself
    (its span, its unusable events, its flows) beside them."""

    def __init__(self) -> None:
        self.order = 0
        self.threads: dict[Any, int] = {}  # (pid, tid) -> a thread number (negative)
        self.events: list[TraceEvent] = []
        self.python: dict[int, list[TraceEvent]] = {}  # thread -> its python_function events
        self.last_op: dict[int, TraceEvent] = {}  # thread -> its latest cpu_op in the file
        self.loose_flows: list[tuple[Any, str, int, int]] = []  # (id, ph, thread, t0): not right after their op
        self.start: int | None = None
        self.end: int | None = None
        self.flow_events = 0
        self.skipped = 0  # complete events without a usable ts/dur (missing, wrong type, out of range)

    def _thread(self, ev: dict[str, Any]) -> int:
        key = (_hashable(ev.get("pid")), _hashable(ev.get("tid")))
        n = self.threads.get(key)
        if n is None:
            n = self.threads[key] = -1 - len(self.threads)
        return n

    def add(self, ev: Any) -> None:
        self.order += 1
        if not isinstance(ev, dict):
            return
        ph = ev.get("ph")
        if ph in ("s", "f"):
            self._flow(ev)
            return
        if ph != "X":
            return
        ts, dur = ev.get("ts"), ev.get("dur", 0)
        if not _num(ts) or not _num(dur):
            self.skipped += 1
            return
        t0 = _ns(ts)
        t1 = t0 + max(0, _ns(dur))
        cat = ev.get("cat", "")
        cat = cat.lower() if isinstance(cat, str) else ""
        if cat == "trace":  # the profiler's own span: not the program's activity
            return
        self.start = t0 if self.start is None else min(self.start, t0)
        self.end = t1 if self.end is None else max(self.end, t1)
        args = ev.get("args")
        if not isinstance(args, dict):
            args = {}
        name = ev.get("name", "")
        name = sys.intern(name) if isinstance(name, str) else ""
        if cat in DEVICE_CATS:
            dev = _int(args.get("device"))
            stream = _int(args.get("stream"))
            self.events.append(TraceEvent(cat, name, 0, t0, t1, _int(args.get("correlation")),
                                          dev if dev is not None else _int(ev.get("pid")) or 0,
                                          stream if stream is not None else _int(ev.get("tid")) or 0))
        elif cat in RUNTIME_CATS:
            corr = _int(args.get("correlation"))
            if corr is not None:
                self.events.append(TraceEvent(cat, name, self._thread(ev), t0, t1, corr))
        elif cat == "python_function":
            te = TraceEvent(cat, name, self._thread(ev), t0, t1)
            te.pid = self.order
            self.events.append(te)
            self.python.setdefault(te.thread, []).append(te)
        elif cat == "cpu_op":
            seq, fwd = _int(args.get("Sequence number")), _int(args.get("Fwd thread id"))
            te = TraceEvent(cat, name, self._thread(ev), t0, t1, seq=seq if seq is not None and seq >= 0 else -1,
                            fwd=fwd if fwd is not None and fwd > 0 else 0)
            self.events.append(te)
            self.last_op[te.thread] = te

    def _flow(self, ev: dict[str, Any]) -> None:
        cat, ph, ts = ev.get("cat"), ev.get("ph"), ev.get("ts")
        if cat != FLOW_CAT or not _num(ts):
            return
        fid = _hashable(ev.get("id"))
        thread, t0 = self._thread(ev), _ns(ts)
        self.flow_events += 1
        last = self.last_op.get(thread)
        if last is not None and last.start == t0:  # written right after its op, as the exporters do
            last.flow, last.flow_is_start = fid, ph == "s"
        else:
            self.loose_flows.append((fid, str(ph), thread, t0))

    def finish(self, meta: dict[str, Any], where: str) -> KernelTrace:
        if self.start is None or self.end is None:
            why = f" ({self.skipped} complete event(s) have no usable ts/dur: missing, not a number, or out of range)"
            raise TraceFormatError(f"{where} holds no timed events" + (why if self.skipped else ""))
        base = meta.get("baseTimeNanoseconds", 0)
        base = int(base) if isinstance(base, int) and not isinstance(base, bool) and abs(base) < 2 ** 63 else 0
        self._bind_loose_flows()
        for spans in self.python.values():
            _python_parents(spans)
        threads = sorted(self.python)
        placed = launches(self.events, caller_thread=threads[0] if len(threads) == 1 else None)
        self.events = []
        kernels, stats = _kernels(placed, {n: _int(key[1]) for key, n in self.threads.items()})
        stats.flows = self.flow_events
        kernels.sort(key=lambda k: (k.start_ns, k.end_ns))
        unmatched = sum(1 for k in kernels if k.runtime is None)
        out_meta = {k: meta[k] for k in ("schemaVersion", "traceName", "with_stack") if k in meta}
        return KernelTrace(kernels, self.start, self.end, base, bool(self.python), unmatched, out_meta, stats,
                           self.skipped)

    def _bind_loose_flows(self) -> None:
        """Flows not written right after their op: bound to the op that starts on their thread at their time."""
        if not self.loose_flows:
            return
        starting: dict[tuple[int, int], list[TraceEvent]] = {}
        for ev in self.events:
            if ev.kind == "cpu_op":
                starting.setdefault((ev.thread, ev.start), []).append(ev)
        for fid, ph, thread, t0 in self.loose_flows:
            cands = starting.get((thread, t0))
            if not cands:
                continue
            # a flow's start binds to the op that made the node (the innermost numbered one),
            # its end to the enclosing backward op (the outermost)
            pick = ([o for o in cands if o.seq >= 0] or cands)[-1] if ph == "s" else cands[0]
            pick.flow, pick.flow_is_start = fid, ph == "s"


def _python_parents(spans: list[TraceEvent]) -> None:
    """A thread's python_function events: each one's parent is the innermost that holds it (a saved trace
    has no Python ids); spans on one thread nest, as the profiler opens and closes them."""
    spans.sort(key=lambda e: (e.start, -e.end, e.pid))
    open_: list[TraceEvent] = []
    for ev in spans:
        while open_ and (open_[-1].end < ev.start or (open_[-1].end == ev.start and open_[-1].start < ev.start)):
            open_.pop()
        ev.parent = open_[-1].pid if open_ else -1
        open_.append(ev)


def _kernels(placed: Launches, os_tid: dict[int, int | None]) -> tuple[list[Kernel], BackwardLinks]:
    """The placed device records as kernel facts, and how backward's were linked."""
    auto = placed.auto
    links = auto.links
    stats = BackwardLinks(ops=len(links.root_of), linked_ops=len(links.forward_of), unlinked_ops=dict(links.unlinked))
    kernels = []
    for rec in placed.records:
        python = placed.frames_on(rec.thread, rec.launched_ns) if rec.thread is not None and rec.launched_ns is not None else ()
        operators = auto.chain(rec.op) if rec.op is not None else ()
        if rec.op is not None and links.is_backward(rec.op):
            stats.records += 1
            if rec.op in links.forward_of:
                stats.linked_records += 1
            else:
                r = links.unlinked_reason(rec.op) or "unknown"
                stats.unlinked_records[r] = stats.unlinked_records.get(r, 0) + 1
                stats.unlinked_paths.add(rec.path)
        rec.python, rec.operators = python, operators  # the reader's own records: filled in, not copied
        rec.thread = None if rec.thread is None else os_tid.get(rec.thread)
        kernels.append(rec)
    return kernels, stats


def _hashable(v: Any) -> Any:
    return v if isinstance(v, (int, str, float)) or v is None else repr(type(v))


def _ns(us: float) -> int:
    return int(round(float(us) * 1000))


def _num(v: Any) -> bool:
    """A usable time: a finite number a profiler could have written (a hostile one is refused in load)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v) and abs(v) <= MAX_TS_US
    except OverflowError:  # an int too large for a float
        return False


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            return None
    return None


