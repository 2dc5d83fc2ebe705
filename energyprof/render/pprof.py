"""pprof export: the report model's attribution tree (under its idle policy) as a gzipped `perftools.profiles.Profile` protobuf.

Pyroscope, Parca and `pprof -diff_base` aggregate and diff these across runs and machines.
Sample types: `energy_<source>` in microjoules for each source, then `cpu` and `wall` in
nanoseconds. One sample per call path, holding that path's self figures, leaf first; labels say
which process, rank and node it ran on. The message is small enough to encode by hand (varints
and length-delimited fields), so the export needs no protobuf library.

Integers: each sample type is rounded as a running total (`integer_weights`), so the samples
of a type add up to the rounded total exactly.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import re
from typing import Any

from ..analysis.report import ReportModel
from ..facts.profile import Node
from .exports import _paths, integer_weights

NANO = 1_000_000_000
MICRO = 1_000_000
_PROCESS = re.compile(r"^\[(process|processes:|DataLoader worker|rank|ray worker) ")
_RANK = re.compile(r"^\[rank (\d+)\]")


# -- what this module reads: the report model (the run under its idle policy) ----------------------
def _source_ids(model: ReportModel) -> list[str]:
    return [s.id for s in model.sources]


def _methods(model: ReportModel) -> str:
    return ", ".join(f"{s.id} {s.method}" for s in model.sources)


def _host(model: ReportModel) -> str | None:
    host = model.meta.get("host") or {}
    name = host.get("hostname") or host.get("name") if isinstance(host, dict) else None
    return str(name) if name else None


# -- protobuf wire format ----------------------------------------------------------------------------
def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64: negative numbers as their two's complement
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _int(field: int, n: int) -> bytes:
    return _varint(field << 3) + _varint(n) if n else b""  # proto3: a zero is not written


def _bytes(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _packed(field: int, values: list[int]) -> bytes:
    return _bytes(field, b"".join(_varint(v) for v in values)) if values else b""


class _Strings:
    def __init__(self) -> None:
        self.table: list[str] = [""]
        self.index: dict[str, int] = {"": 0}

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.table)
            self.table.append(s)
        return i


# -- the document -------------------------------------------------------------------------------------
def pprof_bytes(model: ReportModel) -> bytes:
    """The serialised (not yet gzipped) perftools.profiles.Profile."""
    s = _Strings()
    sources = _source_ids(model)
    types = [(f"energy_{sid}", "microjoules") for sid in sources] + [("cpu", "nanoseconds"), ("wall", "nanoseconds")]
    functions: dict[tuple[str, str, int], int] = {}
    fn_msgs: list[bytes] = []
    loc_msgs: list[bytes] = []
    host = _host(model)
    pid = model.meta.get("pid")
    stacks: list[list[int]] = []
    labels: list[bytes] = []
    series: list[list[float]] = [[] for _ in types]
    for node, path in _paths(model):
        own = [node.self_energy_j.get(sid, 0.0) for sid in sources] + [node.self_cpu_time_s, node.self_time_s]
        if not any(v > 0 for v in own):
            continue
        ids = []
        for n in reversed(path):  # leaf first
            key = (n.function, n.file, int(n.line or 0))
            fid = functions.get(key)
            if fid is None:
                fid = functions[key] = len(functions) + 1
                name = s(n.function)
                fn_msgs.append(_int(1, fid) + _int(2, name) + _int(3, name) + _int(4, s(n.file)) + _int(5, key[2]))
                line = _int(1, fid) + _int(2, key[2])
                loc_msgs.append(_int(1, fid) + _bytes(4, line))  # one location per function: location id = function id
            ids.append(fid)
        stacks.append(ids)
        labels.append(_labels(s, path, pid, host))
        for i, v in enumerate(own):
            series[i].append(v)
    scales = [MICRO] * len(sources) + [NANO, NANO]
    values = [integer_weights(v, scale) for v, scale in zip(series, scales)]
    out = bytearray()
    for t, unit in types:
        out += _bytes(1, _int(1, s(t)) + _int(2, s(unit)))
    for i, ids in enumerate(stacks):
        out += _bytes(2, _packed(1, ids) + _packed(2, [v[i] for v in values]) + labels[i])
    for msg in loc_msgs:
        out += _bytes(4, msg)
    for msg in fn_msgs:
        out += _bytes(5, msg)
    tail = bytearray()
    started = _started_ns(model.meta.get("started_at"))
    tail += _int(9, started or 0)
    tail += _int(10, round(model.totals.duration_s * NANO))
    tail += _bytes(11, _int(1, s("wall")) + _int(2, s("nanoseconds")))
    interval = model.meta.get("interval_s")
    tail += _int(12, round(float(interval) * NANO) if interval else 0)
    methods = _methods(model)
    tail += _packed(13, [s(f"energyprof {model.meta.get('energyprof_version', '')}: energy in microjoules"
                           f" ({methods or 'no source'}); one sample per call path, self values")])
    if sources:
        tail += _int(14, s(types[0][0]))
    for text in s.table:  # string_table last: every index above is in it by now
        out += _bytes(6, text.encode("utf-8", "backslashreplace"))  # a lone surrogate as its escape
    return bytes(out + tail)


def _labels(s: _Strings, path: list[Node], pid: Any, host: str | None) -> bytes:
    process = rank = None
    for n in path:
        if _PROCESS.match(n.function):
            process = n.function
            m = _RANK.match(n.function)
            if m:
                rank = int(m.group(1))
    if process is None and pid is not None:
        process = f"[process {pid}]"
    out = b""
    if process is not None:
        out += _bytes(3, _int(1, s("process")) + _int(2, s(process)))
    if rank is not None:
        out += _bytes(3, _int(1, s("rank")) + _int(3, rank))
    if host is not None:
        out += _bytes(3, _int(1, s("node")) + _int(2, s(host)))
    return out


def _started_ns(text: Any) -> int | None:
    try:
        return round(_dt.datetime.fromisoformat(str(text)).timestamp() * NANO)
    except (TypeError, ValueError):
        return None


def pprof_gzip(model: ReportModel) -> bytes:
    """The file's bytes: gzipped as pprof expects (mtime 0: the same model gives the same bytes)."""
    return gzip.compress(pprof_bytes(model), mtime=0)
