"""`energyprof sensors`: what this machine can measure, a recorder, and the privileged reader.

    energyprof sensors                              list every backend found, how it is read, and
                                                    the step that enables each one missing
    energyprof sensors record -o rec.csv --seconds N   record the run's sensors as a power trace
                                                    that `--power-trace` replays
    energyprof sensors serve --group G [--socket P] [--check] [--print-unit]
                                                    (as root) hand RAPL counters and power knobs to a group
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import signal
import sys
import time
from typing import Any, Sequence

from ..options import SENSORS, Options, OptionError
from .common import PROG, Parser, UsageError


def sensors_cmd(argv: Sequence[str]) -> int:
    argv = list(argv)
    if argv and argv[0] == "record":
        return record_cmd(argv[1:])
    if argv and argv[0] == "serve":
        return serve_cmd(argv[1:])
    return list_cmd(argv)


def _powercap_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--powercap-root", default=None, help="powercap sysfs root (default /sys/class/powercap)")


def list_cmd(argv: list[str]) -> int:
    p = Parser(prog=f"{PROG} sensors", description="List the energy sensors this machine offers, how each is read, "
               "and the step that would enable each one missing. Subcommands: record, serve.")
    _powercap_flag(p)
    ns = p.parse_args(argv)
    from ..collect import sensors

    found = sensors.survey(ns.powercap_root)
    try:
        print(format_listing(found))
    finally:
        for s in found.sensors:
            s.close()
    return 0


def format_listing(found: Any) -> str:
    lines = ["found:" if found.sensors else "found: no energy sensor (a run uses the model: estimated figures)"]
    for s in found.sensors:
        period = f"every {s.update_period_s:g} s" if s.update_period_s else "period unknown"
        how = s.detail.get("reading") or s.detail.get("domain") or s.detail.get("event") or ""
        lines.append(f"  {s.id:<16} {s.sensor:<13} {s.method:<9} {s.tier:<10} {period:<16} {how}")
    if found.missing:
        lines.append("missing (and the step that enables each):")
        for name, step in found.missing.items():
            lines.append(f"  {name:<13} {step}")
    lines.append("model         always available: CPU power from TDP and utilisation, RAM from installed size "
                 "(estimated, never measured)")
    lines.append("replay        `--power-trace FILE` replays a recorded trace (`energyprof sensors record` makes one)")
    return "\n".join(lines)


def record_cmd(argv: list[str]) -> int:
    p = Parser(prog=f"{PROG} sensors record", description="Record every sensor a run would read, as a power "
               "trace CSV (t_s,<source>... in watts) that `energyprof --power-trace FILE` replays; a comment line per "
               "source keeps whether it was measured or estimated, and by which sensor.")
    p.add_argument("-o", "--output", required=True, help="the CSV to write")
    p.add_argument("--seconds", type=float, required=True, help="how long to record (up to 86400)")
    p.add_argument("--interval", type=float, default=0.1, help="seconds between rows, 0.001 to 60 (default 0.1)")
    p.add_argument("--sensor", action="append", metavar="NAME", help="record only this backend (repeatable): "
                   + ", ".join(s for s in SENSORS if s != "replay"))
    p.add_argument("--no-gpu", dest="gpus", action="store_false", help="do not read GPUs")
    p.add_argument("--cpu-tdp", type=float, help="CPU TDP in watts for the model")
    _powercap_flag(p)
    ns = p.parse_args(argv)
    if not 0 < ns.seconds <= 86400:
        raise UsageError(f"--seconds must be > 0 and <= 86400, not {ns.seconds:g}")
    if not 0.001 <= ns.interval <= 60:
        raise UsageError(f"--interval must be >= 0.001 and <= 60 s, not {ns.interval:g}")
    if ns.sensor and "replay" in ns.sensor:
        raise UsageError("--sensor replay cannot be recorded: it is a recording already")
    options = Options(powercap_root=ns.powercap_root, cpu_tdp=ns.cpu_tdp, sensor=ns.sensor, gpus=ns.gpus,
                      quiet=True)
    from ..preflight import check_writable

    check_writable(ns.output, "--output")
    from ..collect.collector import open_sources

    found, _ = open_sources(options)
    try:
        rows = record(found.sensors, ns.seconds, ns.interval)
    finally:
        for s in found.sensors:
            s.close()
    from ..files import write_text

    write_text(ns.output, trace_csv([s.id for s in found.sensors], rows, [s.describe() for s in found.sensors]))
    print(f"{PROG}: recorded {len(rows)} rows of {', '.join(s.id for s in found.sensors)} to {ns.output}",
          file=sys.stderr)
    return 0


def record(sensors: list[Any], seconds: float, interval: float) -> list[tuple[float, list[float]]]:
    """(t_s, watts per sensor) rows: each row's power is the mean over the interval it starts,
    which is what a replay holds until the next row, so a replay gives back the same joules."""
    t0 = time.perf_counter_ns()
    for s in sensors:
        s.start(t0)
    last_t, last_e = t0, [0.0] * len(sensors)
    rows: list[tuple[float, list[float]]] = []
    end = t0 + int(seconds * 1e9)
    k = 0
    while last_t < end:
        k += 1
        target = min(end, t0 + int(k * interval * 1e9))
        time.sleep(max(0.0, (target - time.perf_counter_ns()) / 1e9))
        t = time.perf_counter_ns()
        if t <= last_t:  # the replay format needs t_s to increase
            continue
        energy = [float(s.read(t)) for s in sensors]
        dt = (t - last_t) / 1e9
        rows.append(((last_t - t0) / 1e9, [max(0.0, (e - le) / dt) for e, le in zip(energy, last_e)]))
        last_t, last_e = t, energy
    return rows


def trace_csv(columns: list[str], rows: list[tuple[float, list[float]]],
              sources: list[dict[str, Any]] | None = None) -> str:
    """The replay format (collect/sensors/replay.py): a `t_s` column, then watts per source,
    after one comment per source that says how it was read, so that a replay labels it the same."""
    from ..collect.sensors.replay import trace_header

    out = io.StringIO()
    for line in trace_header(sources) if sources else []:
        out.write(line + "\n")
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["t_s", *columns])
    for t_s, watts in rows:
        w.writerow([repr(round(t_s, 9)), *(repr(v) for v in watts)])
    return out.getvalue()


def serve_cmd(argv: list[str]) -> int:
    from ..collect.sensors import rapl, served
    from ..serve import server as srv

    p = Parser(prog=f"{PROG} sensors serve", description="As root: serve RAPL's counters, and the power knobs found "
               "here, over a Unix socket to the members of one group, so that they get measured figures and can set "
               "knobs within range without root. The recommended way to run it is the systemd units that --print-unit "
               "shows (docs/sensors.md).")
    p.add_argument("--socket", default=None, help=f"socket path (default $ENERGYPROF_SENSOR_SOCKET or "
                   f"{served.DEFAULT_SOCKET}); its folder must be root's, or is created 0750 root:GROUP")
    p.add_argument("--group", default=None, help="the group whose members may read and set knobs (required)")
    p.add_argument("--check", action="store_true", help="say what would be served, where and to whom; change nothing")
    p.add_argument("--print-unit", action="store_true", help="print the systemd socket and service units and exit")
    _powercap_flag(p)
    ns = p.parse_args(argv)
    if ns.print_unit:
        for name in UNIT_FILES:
            print(f"# ---- {name}\n{_unit_text(name)}")
        return 0
    if not ns.group:
        raise OptionError("name the group whose members may read: --group energyprof (RAPL's counters are root-only "
                          "since CVE-2020-8694: the reader never serves them to every user)")
    try:
        gid = srv.group_id(ns.group)
    except srv.ServeError as exc:
        raise OptionError(str(exc)) from None
    found = rapl.discover(ns.powercap_root)
    knobs = _served_knobs(ns.powercap_root)
    path = served.socket_path(ns.socket)
    if ns.check:
        return _serve_check(path, ns.group, gid, found, knobs)
    if not found.sensors:
        raise OptionError("no readable RAPL counter to serve: " + "; ".join(found.notes or ["none found"]))
    inherited = srv.inherited_socket()
    try:
        listener = inherited or srv.bind(path, gid)
    except (srv.ServeError, OSError) as exc:
        raise OptionError(str(exc)) from None
    reader = srv.Reader(listener, gid, lambda: served.snapshot(found.sensors), knobs)

    def stop(signum: int, frame: Any) -> None:
        reader.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    zones = ", ".join(f"{s.id} ({s.detail.get('domain')})" for s in found.sensors)
    print(f"{PROG}: serving {zones}" + (f" and knobs {', '.join(k.name for k in knobs)}" if knobs else "")
          + f" on {'the socket systemd handed over' if inherited else path} to group {ns.group}",
          file=sys.stderr, flush=True)
    try:
        reader.serve()
    finally:
        if inherited is None:
            try:
                os.unlink(path)
            except OSError:
                pass
    return 0


UNIT_FILES = ("energyprof-sensors.socket", "energyprof-sensors.service")


def _unit_text(name: str) -> str:
    from importlib.resources import files

    return (files("energyprof.serve") / "units" / name).read_text()


def _served_knobs(powercap_root: str | None) -> list[Any]:
    """The knobs this machine has (root discovers them; a client only ever names one)."""
    try:
        from ..knobs.registry import discover
    except ImportError:
        return []
    try:
        return list(discover(powercap_root=powercap_root))
    except Exception as exc:  # noqa: BLE001 - a knob backend that fails is left out, and said
        print(f"{PROG}: no knobs served: {exc}", file=sys.stderr)
        return []


def _serve_check(path: str, group: str, gid: int, found: Any, knobs: list[Any]) -> int:
    """`serve --check`: what would be served, where and to whom. Reads only."""
    import grp
    import pwd

    from ..serve import server as srv

    folder = os.path.dirname(os.path.abspath(path))
    problem = srv.check_folder(folder)
    members = set(grp.getgrgid(gid).gr_mem) | {u.pw_name for u in pwd.getpwall() if u.pw_gid == gid}
    lines = [f"{PROG} sensors serve --check (nothing changed):"]
    zones = ", ".join(f"{s.id} ({s.detail.get('domain')})" for s in found.sensors)
    lines.append(f"  counters: {zones or 'none readable (' + '; '.join(found.notes or ['none found']) + ')'}")
    lines.append(f"  knobs:    {', '.join(k.name for k in knobs) or 'none found'}")
    lines.append(f"  socket:   {path}, mode 0660 root:{group}")
    if problem:
        lines.append(f"  folder:   REFUSED: {problem}")
    elif os.path.isdir(folder):
        st = os.stat(folder)
        lines.append(f"  folder:   {folder} exists, root's, mode {st.st_mode & 0o777:o}: used as it is")
    else:
        lines.append(f"  folder:   {folder} would be created, mode 0750 root:{group}")
    lines.append(f"  serves:   root and the members of {group} (gid {gid}): {', '.join(sorted(members)) or 'no members yet'}")
    lines.append(f"  runs as:  {'root' if os.geteuid() == 0 else f'uid {os.geteuid()} (run it as root: RAPL is root-only)'}")
    print("\n".join(lines))
    return 2 if problem or not found.sensors else 0
