"""Read a PyTorch profiler (Kineto) trace into kernel facts, each with the stack that launched it.

A device record (`cat` kernel, gpu_memcpy, gpu_memset) carries `args.correlation`, equal to its
launching runtime call's (`cuda_runtime` / `cuda_driver`; ROCm traces use the same categories).
The runtime call's launch stack is found by time nesting on its own thread: every `cpu_op` and
`python_function` event whose span holds the call, outermost first. `External id` is not used:
it is often missing on device records, while the correlation id is always there.

Times: Kineto writes `ts`/`dur` in microseconds (floats with ns digits). Traces that carry
`baseTimeNanoseconds` give Unix time as `baseTimeNanoseconds + ts * 1000`; older ones wrote Unix
microseconds directly. Both read here as `ts * 1000` ns on the trace's own clock; `unix_base_ns`
says how to reach Unix time. Aligning that clock with a power log is the caller's job (see
`agent/kernel_capture.py`'s `clock_offset` for the in-process case and docs/gpu.md).
"""

from __future__ import annotations

import bisect
import gzip
import json
from pathlib import Path
from typing import Any, Callable

from ...record import field, record
from ...core.kernels import OPERATOR_NODE, UNLAUNCHED_NODE, Frame, Kernel  # noqa: F401  (the record this reader makes)

DEVICE_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset",
               "memcpy": "memcpy", "memset": "memset"}  # lower-cased `cat` -> kind (older traces: Memcpy, Memset)
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
# python_function events that are not Python frames: C calls (named with an object's address, so
# one node per tensor) and module-hierarchy marks; the operator chain below them says the same.
NOT_FRAMES = ("<built-in ", "nn.Module: ")


class TraceFormatError(ValueError):
    """The file is not a Kineto trace this reader understands (one line for the user)."""


@record
class KernelTrace:
    kernels: list[Kernel]
    start_ns: int  # the earliest event of any kind, on the trace's clock
    end_ns: int  # the latest end of any event
    unix_base_ns: int  # add to the trace's ns to get Unix ns (0 when `ts` was Unix already)
    has_python: bool
    unmatched: int = 0  # device records with no runtime call of the same correlation
    meta: dict[str, Any] = field(default_factory=dict)


def parse_python_name(name: str) -> Frame:
    """`file.py(12): forward` -> ("forward", "file.py", 12); other shapes keep the name whole.

    The profiler names a frame by its code's name (not its qualified name), its first line, and
    its file less the sys.path entry that holds it (`torch/nn/modules/module.py`)."""
    head, sep, func = name.partition("): ")
    if sep:
        file, paren, line = head.rpartition("(")
        if paren and line.isdigit():
            return (func, file, int(line))
    return (name, "", 0)


def load(path: str | Path) -> KernelTrace:
    """Read a trace file (.json or .json.gz)."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            head = fh.read(2)
        opener: Callable[..., Any] = gzip.open if head == b"\x1f\x8b" else open
        with opener(p, "rt", encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise TraceFormatError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        raise TraceFormatError(f"trace {path} is neither JSON text nor gzipped JSON") from None
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"trace {path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    return parse(doc, str(path))


def parse(doc: Any, where: str = "trace") -> KernelTrace:
    """A loaded Kineto document -> kernels with launch stacks."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc if isinstance(doc, list) else None
    if not isinstance(events, list):
        raise TraceFormatError(f"{where} is not a Kineto/Chrome trace (no traceEvents list)")
    base = doc.get("baseTimeNanoseconds", 0) if isinstance(doc, dict) else 0
    base = int(base) if isinstance(base, (int, float)) and not isinstance(base, bool) else 0
    spans: dict[tuple[Any, Any], list[tuple[int, int, int, str, str]]] = {}  # thread -> (start, -end, order, cat, name)
    runtime: dict[int, tuple[Any, Any, int, int, str]] = {}
    device: list[dict[str, Any]] = []
    start = end = None
    has_python = False
    for order, ev in enumerate(events):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        ts, dur = ev.get("ts"), ev.get("dur", 0)
        if not _num(ts) or not _num(dur):
            continue
        t0 = int(round(float(ts) * 1000))
        t1 = t0 + max(0, int(round(float(dur) * 1000)))
        cat = str(ev.get("cat", "")).lower()
        if cat == "trace":  # the profiler's own span: not the program's activity
            continue
        start = t0 if start is None else min(start, t0)
        end = t1 if end is None else max(end, t1)
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        name = str(ev.get("name", ""))
        thread = (ev.get("pid"), ev.get("tid"))
        if cat in DEVICE_CATS:
            device.append({"ev": ev, "args": args, "t0": t0, "t1": t1, "kind": DEVICE_CATS[cat], "name": name})
        elif cat in RUNTIME_CATS:
            corr = _int(args.get("correlation"))
            if corr is not None:
                runtime[corr] = (ev.get("pid"), ev.get("tid"), t0, t1, name)
        elif cat in ("cpu_op", "python_function"):
            has_python |= cat == "python_function"
            spans.setdefault(thread, []).append((t0, -t1, order, cat, name))
    if start is None or end is None:
        raise TraceFormatError(f"{where} holds no timed events")
    nesting = {t: _Nesting(v) for t, v in spans.items()}
    kernels: list[Kernel] = []
    unmatched = 0
    for d in device:
        args = d["args"]
        corr = _int(args.get("correlation"))
        dev = _int(args.get("device"))
        if dev is None:
            dev = _int(d["ev"].get("pid")) or 0
        stream = _int(args.get("stream"))
        if stream is None:
            stream = _int(d["ev"].get("tid")) or 0
        launch = runtime.get(corr) if corr is not None else None
        python: list[Frame] = []
        ops: list[str] = []
        rt_name = tid = None
        if launch is None:
            unmatched += 1
        else:
            pid, tid, r0, r1, rt_name = launch
            holder = nesting.get((pid, tid))
            for cat, name in (holder.holding(r0, r1) if holder else ()):
                if cat == "python_function":
                    if not name.startswith(NOT_FRAMES):
                        python.append(parse_python_name(name))
                else:
                    ops.append(name)
        kernels.append(Kernel(device=dev, stream=stream, name=d["name"], kind=d["kind"], start_ns=d["t0"], end_ns=d["t1"],
                              correlation=corr, runtime=rt_name, python=tuple(python), operators=tuple(ops),
                              thread=_int(tid)))
    kernels.sort(key=lambda k: (k.start_ns, k.end_ns))
    meta = {k: doc.get(k) for k in ("schemaVersion", "traceName", "with_stack") if isinstance(doc, dict) and k in doc}
    return KernelTrace(kernels, start, end, base, has_python, unmatched, meta)


class _Nesting:
    """One thread's spans, for 'which spans hold [t0, t1]', outermost first.

    Spans on one thread nest (a profiler's record functions open and close in order), so a span
    holding the call starts at or before it; checking every earlier span would be quadratic on
    long traces, so candidates are kept as a stack of open spans at each span start."""

    def __init__(self, spans: list[tuple[int, int, int, str, str]]) -> None:
        spans.sort()  # by start, then longest first, then file order
        self.starts = [s[0] for s in spans]
        self.chains: list[tuple[tuple[int, str, str], ...]] = []  # per span: the open spans (end, cat, name), itself last
        open_: list[tuple[int, str, str]] = []
        for t0, neg_t1, _, cat, name in spans:
            while open_ and open_[-1][0] < t0:
                open_.pop()
            open_.append((-neg_t1, cat, name))
            self.chains.append(tuple(open_))

    def holding(self, t0: int, t1: int) -> list[tuple[str, str]]:
        k = bisect.bisect_right(self.starts, t0) - 1
        if k < 0:
            return []
        # A span that ended before the call began is a finished sibling, not on its stack. Only the
        # call's start is tested: runtime calls are stamped by CUPTI/roctracer, operators by the
        # profiler, and a call can overrun its operator's recorded end by a few microseconds.
        return [(cat, name) for end, cat, name in self.chains[k] if end > t0 or end >= t1]


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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



