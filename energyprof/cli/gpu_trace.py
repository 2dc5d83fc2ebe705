"""`energyprof gpu-trace TRACE.json[.gz] --power-trace POWER.csv`: the GPU energy of a saved profiler trace.

The power log is the replay CSV (collect/sensors/replay.py): `t_s` then one column per source in
watts; its `gpu:N` columns are device N. `t_s` = 0 is the trace's earliest event, or
`--power-offset S` seconds after it (negative: before it).

The trace is read as a stream (collect/kernels/jsonstream.py): memory follows the events kept,
not the file. Its events go through the reduction the run uses (collect/kernels/kineto.py's adapter into
agent/kernels/reduce.launches), so a saved trace's launch paths are the run's.
A file that is not a trace this reader takes is one line on stderr and exit 2.
Backward's kernels go under backward()'s caller > [backward] > the forward line (agent/kernels/autograd.py);
what could not be linked is counted in a note, in meta["backward"] and on the console.
"""

from __future__ import annotations

import argparse
import math
import statistics
from typing import TYPE_CHECKING, Any

from .common import PROG, Parser, UsageError, build_options
from ..core.kernels import DEFAULT_SENSOR_ERROR

if TYPE_CHECKING:
    from ..collect.kernels.kineto import BackwardLinks, KernelTrace
    from ..collect.sensors.replay import PowerTrace
    from ..core.kernels import Attribution
    from ..facts.profile import Note, Profile, Source


def build_gpu_trace_parser() -> Parser:
    p = Parser(prog=f"{PROG} gpu-trace", description="Attribute a saved PyTorch profiler (Kineto) trace's GPU energy, "
               "read from a power log, to the Python lines (or operators) that launched its kernels.")
    p.add_argument("trace", metavar="TRACE.json[.gz]", help="a Kineto trace, as torch.profiler or TensorBoard saved it")
    p.add_argument("--power-trace", required=True, metavar="POWER.csv",
                   help="CSV t_s,gpu:0,...: each device's watts, each row holding until the next")
    p.add_argument("--power-offset", type=float, default=0.0, metavar="S",
                   help="the trace time (s after its earliest event) of the power log's t_s = 0 (default 0)")
    p.add_argument("--update-period", type=float, metavar="S",
                   help="the power sensor's update period (default: the log's median row spacing)")
    p.add_argument("--sensor-error", type=float, default=DEFAULT_SENSOR_ERROR, metavar="FRACTION",
                   help="the power sensor's relative error, for error bars (default %(default)s: NVML's stated "
                        "accuracy of its power reading)")
    p.add_argument("--peak-power", type=float, metavar="W",
                   help="the GPU's peak power (its power limit), for error bars: the power inside a sample is taken "
                        "to stay between 0 and it (default: the log's highest sample)")
    p.add_argument("-o", "--output", help="HTML report path")
    p.add_argument("--json", help="save the profile as JSON (energyprof report and compare read it)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing of energyprof's own")
    return p


def gpu_trace_cmd(argv: list[str]) -> int:
    from ..core.gpu_tree import profile_from
    from ..core.kernels import attribute

    ns = build_gpu_trace_parser().parse_args(argv)
    _check(ns)
    trace, power = _read(ns)
    columns = {c: _device(c) for c in power.columns}
    gpus = {d: c for c, d in columns.items() if d is not None}
    if not gpus:
        raise UsageError(f"power trace {ns.power_trace} has no gpu:N column (found {', '.join(power.columns)})")
    if ns.update_period is not None:
        period_s = ns.update_period
    else:
        steps = [b - a for a, b in zip(power.t_s, power.t_s[1:])]
        period_s = statistics.median(steps) if steps else 0.0
    intervals = {d: _intervals(power, c, trace.start_ns, trace.end_ns, ns.power_offset) for d, c in gpus.items()}
    notes = _input_notes(trace, power, ns.power_offset)
    meta = _meta(ns, trace)
    att = attribute(((k.stack, k.device, k.name, k.start_ns, k.end_ns) for k in trace.kernels), intervals,
                    {d: period_s * 1e9 for d in gpus}, sensor_error=ns.sensor_error,
                    peak_w=None if ns.peak_power is None else {d: ns.peak_power for d in gpus})
    if trace.backward.records:
        notes.append(_backward_note(trace.backward, att, meta))
    notes.append(_error_bars_note(ns, att))
    profile = profile_from(att, start_ns=trace.start_ns, end_ns=trace.end_ns, meta=meta,
                           sources=_sources(ns, sorted(gpus), period_s), notes=notes, records=len(trace.kernels))
    return _write(ns, profile)


def _check(ns: argparse.Namespace) -> None:
    """The options' values, checked before anything is read."""
    if ns.output is None and ns.json is None:
        raise UsageError("gpu-trace needs --json OUT and/or -o OUT.html")
    if ns.update_period is not None and not ns.update_period > 0:
        raise UsageError(f"--update-period must be a positive number of seconds, not {ns.update_period}")
    if not 0 <= ns.sensor_error < 1:
        raise UsageError(f"--sensor-error must be a fraction in [0, 1), not {ns.sensor_error}")
    if not math.isfinite(ns.power_offset):
        raise UsageError(f"--power-offset must be a number of seconds, not {ns.power_offset}")
    if ns.peak_power is not None and not 0 < ns.peak_power < 1e7:
        raise UsageError(f"--peak-power must be a positive number of watts, not {ns.peak_power}")


def _read(ns: argparse.Namespace) -> tuple[KernelTrace, PowerTrace]:
    """The trace and the power log; a file either reader refuses is one line (UsageError), never a traceback."""
    from ..collect.kernels import kineto
    from ..collect.sensors.replay import TraceError, load_trace

    try:
        trace = kineto.load(ns.trace)
    except kineto.TraceFormatError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a trace this reader did not foresee: one line, never a traceback
        why = f"{type(exc).__name__}: {str(exc)[:200]}".replace("\n", " ")
        raise UsageError(f"trace {ns.trace}: cannot read it ({why})") from None
    try:
        power = load_trace(ns.power_trace)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    return trace, power


def _input_notes(trace: KernelTrace, power: PowerTrace, offset_s: float) -> list[Note]:
    """What the inputs leave out: the power log's span against the trace's, and the trace's unusable events."""
    from ..facts.profile import Note

    notes = []
    span_s = (trace.end_ns - trace.start_ns) / 1e9
    if power.t_s[0] + offset_s > 0 or power.t_s[-1] + offset_s < span_s:
        notes.append(Note("gpu-power-span", f"the power log covers {power.t_s[0] + offset_s:.6g} to "
                          f"{power.t_s[-1] + offset_s:.6g} s of a {span_s:.6g} s trace; before its first row the "
                          "power is taken as zero, after its last row as that row's"))
    if trace.unmatched:
        notes.append(Note("gpu-launch", f"{trace.unmatched} device record(s) have no runtime call of the same correlation "
                          "in the trace: their joules sit on [launch not in trace]"))
    if trace.skipped:
        notes.append(Note("gpu-trace-skipped", f"{trace.skipped} complete event(s) of the trace have no usable time "
                          "(missing, not a number, or out of range) and were left out", {"events": trace.skipped}))
    if not trace.has_python:
        notes.append(Note("gpu-no-stacks", "the trace has no Python stacks (profiled without with_stack=True): kernels "
                          "sit on their launching operators under [GPU kernels by operator]"))
    return notes


def _sources(ns: argparse.Namespace, devices: list[int], period_s: float) -> list[Source]:
    from ..facts.profile import Source

    return [Source(id=f"gpu:{d}", component=f"gpu:{d}", method="measured", sensor="replay", tier="integrated",
                   update_period_s=period_s or None, detail={"power_trace": str(ns.power_trace)},
                   extra={"relative_error": ns.sensor_error})
            for d in devices]


def _meta(ns: argparse.Namespace, trace: KernelTrace) -> dict[str, Any]:
    bw = trace.backward
    return {"target": str(ns.trace), "command": ["gpu-trace", str(ns.trace)], "kind": "gpu-trace",
            "trace": {**trace.meta, "unix_start_ns": trace.unix_base_ns + trace.start_ns},
            "power_offset_s": ns.power_offset, "time_is": "GPU busy time",
            "backward": {"ops": bw.ops, "linked_ops": bw.linked_ops, "unlinked_ops": dict(bw.unlinked_ops),
                         "records": bw.records, "linked_records": bw.linked_records,
                         "unlinked_records": dict(bw.unlinked_records), "flow_events": bw.flows}}


def _backward_note(bw: BackwardLinks, att: Attribution, meta: dict[str, Any]) -> Note:
    """How much of backward's kernels sit on the forward lines that made them; the joules of the rest go in
    `meta["backward"]` too."""
    from ..facts.profile import Note

    unlinked_j = sum(fig.joules for path in bw.unlinked_paths for fig in att.stacks.get(path, {}).values())
    meta["backward"]["unlinked_j"] = unlinked_j
    reasons = "; ".join(f"{r}: {n}" for r, n in sorted(bw.unlinked_records.items(), key=lambda x: -x[1]))
    return Note("gpu-backward", (
        f"{bw.linked_records} of {bw.records} device record(s) launched by backward ops sit under [backward] on the "
        f"forward line that made them ({bw.linked_ops} of {bw.ops} backward ops linked by sequence number"
        f"{' and fwdbwd flows' if bw.flows else ''})" + (
            f"; {bw.unlinked_records_total} record(s), {unlinked_j:.6g} J, could not be linked and sit under "
            f"[backward] on their backward ops ({reasons})" if bw.unlinked_records_total else "")),
        {"records": bw.records, "linked_records": bw.linked_records, "unlinked_records": dict(bw.unlinked_records),
         "unlinked_j": unlinked_j})


def _error_bars_note(ns: argparse.Namespace, att: Attribution) -> Note:
    from ..facts.profile import Note

    bound = "the given peak" if ns.peak_power is not None else "the log's highest sample"
    peaks = ", ".join(f"gpu:{d} {e.peak_w:.4g} W" for d, e in sorted(att.devices.items()))
    return Note("gpu-error-bars", (
        f"GPU error bars: the joules a power sample could move between lines that share it, for power inside a sample "
        f"between 0 and {bound} ({peaks}), plus "
        f"the sensor's {100 * ns.sensor_error:.3g}%"),
        {"sensor_error": ns.sensor_error, "peak_w": {str(d): e.peak_w for d, e in sorted(att.devices.items())}})


def _write(ns: argparse.Namespace, profile: Profile) -> int:
    """The files asked for; on stderr, energyprof's lines with the GPU's (its idle time among them) before the
    files written. 1 where a file could not be written."""
    import io
    import sys

    from ..output.writer import write_outputs
    from ..render.gpu import gpu_console

    try:
        options = build_options(argparse.Namespace(), inputs=(ns.trace, ns.power_trace), keep_checkpoint=False,
                                json=ns.json, output=ns.output, quiet=ns.quiet)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    console = io.StringIO()
    try:
        write_outputs(profile, options, stream=console)
    except OSError:
        return 1
    finally:  # the GPU's lines, [GPU idle] among them, before the files written
        text = console.getvalue()
        if text:
            lines = text.splitlines(keepends=True)
            at = next((i for i, ln in enumerate(lines) if ln.startswith("energyprof: wrote")), len(lines))
            sys.stderr.write("".join(lines[:at]) + gpu_console(profile) + "".join(lines[at:]))
    return 0


def _device(column: str) -> int | None:
    head, sep, tail = column.partition(":")
    if head == "gpu":
        if not sep:
            return 0
        if tail.isdigit():
            return int(tail)
    return None


def _intervals(power: PowerTrace, column: str, start_ns: int, end_ns: int, offset_s: float) -> list[tuple[int, int, float]]:
    """The power log over the trace's span as (t0_ns, t1_ns, joules) on the trace's clock, cut at each row."""
    lo, hi = offset_s, (end_ns - start_ns) / 1e9
    cuts = sorted({0.0, hi, *(t + offset_s for t in power.t_s if 0.0 < t + offset_s < hi)})
    out = []
    for a, b in zip(cuts, cuts[1:]):
        j = power.energy_at(column, b - lo) - power.energy_at(column, a - lo)
        out.append((start_ns + int(round(a * 1e9)), start_ns + int(round(b * 1e9)), j))
    return out
