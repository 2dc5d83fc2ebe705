"""Apple silicon power through `powermetrics` (root), one child per run.

`powermetrics --samplers cpu_power,gpu_power,ane_power -i MS -f plist` prints one plist
document per interval, NUL-separated; the text form is read too (the tool's default, and what
older scripts record). Both layouts:
- macOS 12: `CPU Power`, `GPU Power`, `ANE Power`, `DRAM Power`, and `Package Power` (their total);
- macOS 13 and later: `Combined Power (CPU + GPU + ANE)`, no DRAM.
The figures are means over the sample's own `elapsed` time, so a sample's energy is mean x
elapsed (exact, no trapezoid). `GPU Power` is printed twice (processor and GPU sections): the
first is kept. The total is split into its measured parts plus `other`.
"""

from __future__ import annotations

import os
import plistlib
import re
import sys
from typing import Any, IO, Iterator

from ..base import Discovery, split_total
from ..presence import tool_absent
from .stream import Reading, find_tool, from_tool

INTERVAL_MS = 100
PARTS = {"CPU": "cpu", "GPU": "gpu:0", "ANE": "ane", "DRAM": "dram"}
TOTALS = ("Package", "Combined")
SUDO = ("powermetrics needs root: run `sudo energyprof ...` (the program then runs as root too), or install "
        "macmon (`brew install macmon`), which reads the same counters without sudo")
HEADER_RE = re.compile(r"^\*\*\* Sampled system activity .*\(([\d.]+)\s*ms elapsed\)")
POWER_RE = re.compile(r"^(CPU|GPU|ANE|DRAM|Package|Combined) Power(?: \([^)]*\))?:\s*([\d.]+)\s*mW")


def component(source: str) -> str:
    return source if source in ("cpu", "dram", "gpu:0") else "soc"


def _reading(parts_mw: dict[str, float], total_mw: float | None, elapsed_ns: int) -> Reading:
    parts = {PARTS[k]: v / 1000.0 for k, v in parts_mw.items()}
    return Reading(split_total(("", total_mw / 1000.0) if total_mw is not None else None, parts), True, elapsed_ns)


def parse_text(chunks: Iterator[bytes]) -> Iterator[Reading]:
    """Text samples: a header with the elapsed time, then `X Power: N mW` lines. A sample is
    complete at its total line (Package/Combined), or at the next header without one."""
    elapsed_ns: int | None = None
    parts: dict[str, float] = {}
    done = True
    buf = b""
    for chunk in chunks:
        buf += chunk
        *complete, buf = buf.split(b"\n")
        for raw in complete:
            line = raw.decode("utf-8", "replace").strip()
            m = HEADER_RE.match(line)
            if m:
                if not done and parts and elapsed_ns:
                    yield _reading(parts, None, elapsed_ns)
                elapsed_ns, parts, done = int(float(m.group(1)) * 1e6), {}, False
                continue
            m = POWER_RE.match(line)
            if m is None or done or elapsed_ns is None:
                continue
            what, mw = m.group(1), float(m.group(2))
            if what in TOTALS:
                yield _reading(parts, mw, elapsed_ns)
                done = True
            elif what not in parts:  # GPU Power again, in the GPU section: counted once
                parts[what] = mw
    if not done and parts and elapsed_ns:
        yield _reading(parts, None, elapsed_ns)


def plist_reading(doc: dict[str, Any]) -> Reading | None:
    """One plist document: `processor.<x>_power` (mW), or `<x>_energy` (mJ over the sample)."""
    elapsed = doc.get("elapsed_ns")
    proc = doc.get("processor")
    if not isinstance(elapsed, int) or elapsed <= 0 or not isinstance(proc, dict):
        return None

    def mw(key: str) -> float | None:
        if isinstance(proc.get(f"{key}_power"), (int, float)):
            return float(proc[f"{key}_power"])
        if isinstance(proc.get(f"{key}_energy"), (int, float)):
            return float(proc[f"{key}_energy"]) / (elapsed / 1e9)
        return None

    parts = {k: v for k, v in ((k, mw(k.lower())) for k in PARTS) if v is not None}
    total = next((v for v in (mw("combined"), mw("package")) if v is not None), None)
    return _reading(parts, total, elapsed) if parts or total is not None else None


def parse_plist(chunks: Iterator[bytes]) -> Iterator[Reading]:
    buf = b""
    for chunk in chunks:
        buf += chunk
        *docs, buf = buf.split(b"\0")
        for doc in docs:
            r = _one_plist(doc)
            if r is not None:
                yield r
    r = _one_plist(buf)
    if r is not None:
        yield r


def _one_plist(doc: bytes) -> Reading | None:
    doc = doc.strip()
    if not doc:
        return None
    return plist_reading(plistlib.loads(doc))


def parse(stream: IO[bytes]) -> Iterator[Reading]:
    """Text or plist, told apart by the first byte the tool prints."""
    chunks = _chunks(stream)
    first = b""
    for chunk in chunks:
        first += chunk
        if first.strip():
            break
    rest = _prepend(first, chunks)
    return parse_plist(rest) if first.lstrip().startswith(b"<") else parse_text(rest)


def _chunks(stream: IO[bytes]) -> Iterator[bytes]:
    read = getattr(stream, "read1", stream.read)
    while True:
        chunk = read(65536)
        if not chunk:
            return
        yield chunk


def _prepend(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


def discover(explicit: bool = False, interval_ms: int = INTERVAL_MS) -> Discovery:
    exe = find_tool("powermetrics")
    if exe is None:
        return tool_absent("powermetrics", explicit)
    if not explicit and os.geteuid() != 0:
        return Discovery.absent("powermetrics", "not used", SUDO, explicit=applies())
    argv = [exe, "--samplers", "cpu_power,gpu_power,ane_power", "-i", str(interval_ms), "-f", "plist"]
    return from_tool("powermetrics", argv, parse, interval_ms / 1000.0,
                     {"interval_ms": interval_ms, "format": "plist or text",
                      "reading": "mean power over each sample's elapsed time x that time"}, component, what="figure",
                     step=SUDO if os.geteuid() != 0 else None)

def applies() -> bool:
    return sys.platform == "darwin"
