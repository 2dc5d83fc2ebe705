"""Read a PyTorch profiler (Kineto) trace into kernel facts, each with the stack that launched it.

A device record (`cat` kernel, gpu_memcpy, gpu_memset) carries `args.correlation`, equal to its
launching runtime call's (`cuda_runtime` / `cuda_driver`; ROCm traces use the same categories).
The runtime call's launch stack is found by time nesting on its own thread: every `cpu_op` and
`python_function` event whose span holds the call, outermost first. `External id` is not used:
it is often missing on device records, while the correlation id is always there.

Backward: autograd runs backward's ops on its own thread, which has no Python stack. Each
backward op is linked to the forward op it differentiates (agent/kernels/autograd.py: the same `Sequence
number` on its `Fwd thread id`'s thread, the latest-started before it; a `fwdbwd` flow, `ph` s/f,
where present), and its kernels get the path `backward()`'s caller > `[backward]` > the forward
op's Python stack and operators > the backward ops. A trace without Python stacks gets the same
link on the operator chain, under `[GPU kernels by operator]`. What could not be linked is
counted by reason (`KernelTrace.backward`).

The file is read as a stream (jsonstream.py): memory follows the events kept, not the file.

Times: Kineto writes `ts`/`dur` in microseconds (floats with ns digits). Traces that carry
`baseTimeNanoseconds` give Unix time as `baseTimeNanoseconds + ts * 1000`; older ones wrote Unix
microseconds directly. Both read here as `ts * 1000` ns on the trace's own clock; `unix_base_ns`
says how to reach Unix time. Aligning that clock with a power log is the caller's job (see
`agent/kernel_capture.py`'s `clock_offset` for the in-process case and docs/gpu.md).
"""

from __future__ import annotations

import bisect
import gzip
import math
import sys
import zlib
from pathlib import Path
from typing import Any

from ...record import field, record
from ...agent.kernels.autograd import BACKWARD_FRAME, EVALUATE_PREFIX, Autograd, Op
from ...agent.kernels.frames import NOT_FRAMES, OPERATOR_NODE, UNLAUNCHED_NODE, Frame, parse_python_name  # noqa: F401
from ...core.kernels import Kernel  # noqa: F401  (the record this reader makes)
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


class _Reader:
    """Events in, one at a time; keeps only what attribution needs (names interned)."""

    def __init__(self) -> None:
        self.order = 0
        self.threads: dict[Any, int] = {}  # (pid, tid) -> a thread number (negative: see _thread)
        self.spans: dict[int, list[tuple[int, int, int, str, str]]] = {}  # thread -> (start, -end, order, cat, name)
        self.ops: list[Op] = []
        self.runtime: dict[int, tuple[int, int, int, str]] = {}  # correlation -> (thread, start, end, name)
        self.device: list[tuple[int, int, str, str, int | None, int, int]] = []  # (t0, t1, kind, name, corr, dev, stream)
        self.last_op: dict[int, tuple[int, int]] = {}  # thread -> (start, order) of its latest cpu_op in the file
        self.flows: dict[Any, dict[str, list[int]]] = {}  # flow id -> {"s"/"f": op orders}
        self.loose_flows: list[tuple[Any, str, int, int]] = []  # (id, ph, thread, t0): not right after their op
        self.start: int | None = None
        self.end: int | None = None
        self.has_python = False
        self.python_threads: set[int] = set()
        self.flow_events = 0
        self.skipped = 0  # complete events without a usable ts/dur (missing, wrong type, out of range)

    def _thread(self, ev: dict[str, Any]) -> int:
        """A thread's number: negative, so that it is never taken for a profiler's own thread id
        (`Fwd thread id` 1, 2, ...), which a saved trace does not map to its OS threads."""
        key = (_hashable(ev.get("pid")), _hashable(ev.get("tid")))
        n = self.threads.get(key)
        if n is None:
            n = self.threads[key] = -1 - len(self.threads)
        return n

    def add(self, ev: Any) -> None:
        order = self.order
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
            if dev is None:
                dev = _int(ev.get("pid")) or 0
            stream = _int(args.get("stream"))
            if stream is None:
                stream = _int(ev.get("tid")) or 0
            self.device.append((t0, t1, DEVICE_CATS[cat], name, _int(args.get("correlation")), dev, stream))
        elif cat in RUNTIME_CATS:
            corr = _int(args.get("correlation"))
            if corr is not None:
                self.runtime[corr] = (self._thread(ev), t0, t1, name)
        elif cat in ("cpu_op", "python_function"):
            thread = self._thread(ev)
            if cat == "python_function":
                self.has_python = True
                self.python_threads.add(thread)
            self.spans.setdefault(thread, []).append((t0, -t1, order, sys.intern(cat), name))
            if cat == "cpu_op":
                seq = _int(args.get("Sequence number"))
                fwd = _int(args.get("Fwd thread id"))
                self.ops.append(Op(order, name, thread, t0, t1, seq=seq if seq is not None and seq >= 0 else -1,
                                   fwd_tid=fwd if fwd is not None and fwd > 0 else 0))
                self.last_op[thread] = (t0, order)

    def _flow(self, ev: dict[str, Any]) -> None:
        cat, ph, ts = ev.get("cat"), ev.get("ph"), ev.get("ts")
        if cat != FLOW_CAT or not _num(ts):
            return
        fid = _hashable(ev.get("id"))
        thread, t0 = self._thread(ev), _ns(ts)
        self.flow_events += 1
        last = self.last_op.get(thread)
        if last is not None and last[0] == t0:  # written right after its op, as the exporters do
            self.flows.setdefault(fid, {}).setdefault(ph, []).append(last[1])
        else:
            self.loose_flows.append((fid, ph, thread, t0))

    def finish(self, meta: dict[str, Any], where: str) -> KernelTrace:
        if self.start is None or self.end is None:
            why = f" ({self.skipped} complete event(s) have no usable ts/dur: missing, not a number, or out of range)"
            raise TraceFormatError(f"{where} holds no timed events" + (why if self.skipped else ""))
        base = meta.get("baseTimeNanoseconds", 0)
        base = int(base) if isinstance(base, int) and not isinstance(base, bool) and abs(base) < 2 ** 63 else 0
        nesting = {t: _Nesting(v) for t, v in self.spans.items()}
        self.spans = {}
        flows = self._flow_links(self.ops)
        ops = self._with_stacks(nesting, set(flows.values()))
        python_threads = sorted(self.python_threads)
        graph = Autograd(ops, flows, frames_at=lambda thread, t: _frames(nesting.get(thread), t, t),
                         caller_thread=python_threads[0] if len(python_threads) == 1 else None)
        links = graph.links
        stats = BackwardLinks(ops=len(links.root_of), linked_ops=len(links.forward_of),
                              unlinked_ops=dict(links.unlinked), flows=self.flow_events)
        os_tid = {n: _int(key[1]) for key, n in self.threads.items()}  # the trace's own tid, for Kernel.thread
        kernels: list[Kernel] = []
        unmatched = 0
        for t0, t1, kind, name, corr, dev, stream in self.device:
            launch = self.runtime.get(corr) if corr is not None else None
            python: list[Frame] = []
            op_names: list[str] = []
            rt_name = tid = None
            path: tuple[Frame, ...] = ()
            if launch is None:
                unmatched += 1
            else:
                tid, r0, r1, rt_name = launch
                holder = nesting.get(tid)
                innermost = None
                for cat, sname, order in (holder.holding(r0, r1) if holder else ()):
                    if cat == "python_function":
                        if not sname.startswith(NOT_FRAMES):
                            python.append(parse_python_name(sname))
                    else:
                        op_names.append(sname)
                        innermost = order
                if innermost is not None and links.is_backward(innermost):
                    path = graph.path(innermost)
                    if path[0] == BACKWARD_FRAME:  # no caller frames: beside the other operator-only paths
                        path = ((OPERATOR_NODE, "", 0),) + path
                    stats.records += 1
                    if innermost in links.forward_of:
                        stats.linked_records += 1
                    else:
                        r = links.unlinked_reason(innermost) or "unknown"
                        stats.unlinked_records[r] = stats.unlinked_records.get(r, 0) + 1
                        stats.unlinked_paths.add(path)
            kernels.append(Kernel(device=dev, stream=stream, name=name, kind=kind, start_ns=t0, end_ns=t1,
                                  correlation=corr, runtime=rt_name, python=tuple(python), operators=tuple(op_names),
                                  thread=None if tid is None else os_tid.get(tid), path=path))
        kernels.sort(key=lambda k: (k.start_ns, k.end_ns))
        out_meta = {k: meta[k] for k in ("schemaVersion", "traceName", "with_stack") if k in meta}
        return KernelTrace(kernels, self.start, self.end, base, self.has_python, unmatched, out_meta, stats, self.skipped)

    def _with_stacks(self, nesting: dict[int, "_Nesting"], flow_sources: set[int]) -> list[Op]:
        """The ops, those that may be linked or call backward() with their Python frames."""
        out = []
        for op in self.ops:
            if op.seq >= 0 or op.fwd_tid > 0 or op.name.startswith(EVALUATE_PREFIX) or op.id in flow_sources:
                stack = _frames(nesting.get(op.tid), op.start_ns, op.end_ns, below=op.id)
                if stack:
                    op = Op(op.id, op.name, op.tid, op.start_ns, op.end_ns, op.seq, op.fwd_tid, stack)
            out.append(op)
        return out

    def _flow_links(self, ops: list[Op]) -> dict[int, int]:
        """backward op order -> forward op order, from fwdbwd flows (s on the forward op, f on the backward)."""
        if self.loose_flows:
            starting: dict[tuple[int, int], list[Op]] = {}
            for op in ops:
                starting.setdefault((op.tid, op.start_ns), []).append(op)
            for fid, ph, thread, t0 in self.loose_flows:
                cands = starting.get((thread, t0))
                if not cands:
                    continue
                # a flow's start binds to the op that made the node (the innermost numbered one),
                # its end to the enclosing backward op (the outermost)
                pick = ([o for o in cands if o.seq >= 0] or cands)[-1] if ph == "s" else cands[0]
                self.flows.setdefault(fid, {}).setdefault(str(ph), []).append(pick.id)
        out: dict[int, int] = {}
        for ends in self.flows.values():
            s, f = ends.get("s"), ends.get("f")
            if s and f:
                for b in f:
                    out[b] = s[-1]
        return out


def _frames(holder: "_Nesting | None", t0: int, t1: int, below: int | None = None) -> tuple[Frame, ...]:
    """The Python frames on a thread holding [t0, t1], outermost first (only those outside op `below`)."""
    if holder is None:
        return ()
    chain = holder.holding(t0, t1)
    if below is not None:
        orders = [o for _, _, o in chain]
        if below in orders:
            chain = chain[:orders.index(below)]
    return tuple(parse_python_name(n) for cat, n, _ in chain if cat == "python_function" and not n.startswith(NOT_FRAMES))


class _Nesting:
    """One thread's spans, for 'which spans hold [t0, t1]', outermost first.

    Spans on one thread nest (a profiler's record functions open and close in order), so a span
    holding the call starts at or before it; checking every earlier span would be quadratic on
    long traces, so candidates are kept as a stack of open spans at each span start."""

    def __init__(self, spans: list[tuple[int, int, int, str, str]]) -> None:
        spans.sort()  # by start, then longest first, then file order
        self.starts = [s[0] for s in spans]
        # per span: the open spans (end, cat, name, order), itself last
        self.chains: list[tuple[tuple[int, str, str, int], ...]] = []
        open_: list[tuple[int, str, str, int]] = []
        for t0, neg_t1, order, cat, name in spans:
            while open_ and open_[-1][0] < t0:
                open_.pop()
            open_.append((-neg_t1, cat, name, order))
            self.chains.append(tuple(open_))

    def holding(self, t0: int, t1: int) -> list[tuple[str, str, int]]:
        k = bisect.bisect_right(self.starts, t0) - 1
        if k < 0:
            return []
        # A span that ended before the call began is a finished sibling, not on its stack. Only the
        # call's start is tested: runtime calls are stamped by CUPTI/roctracer, operators by the
        # profiler, and a call can overrun its operator's recorded end by a few microseconds.
        return [(cat, name, order) for end, cat, name, order in self.chains[k] if end > t0 or end >= t1]


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


