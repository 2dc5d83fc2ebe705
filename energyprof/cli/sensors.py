"""`energyprof sensors`: what this machine can measure, a recorder, and the privileged reader.

    energyprof sensors                              list every backend found, how it is read, and
                                                    the step that enables each one missing
    energyprof sensors record -o rec.csv --seconds N   record the run's sensors as a power trace
                                                    that `--power-trace` replays
    energyprof sensors serve [--socket P] [--group G] [--check]  (as root) hand RAPL counters and knobs to a group
    energyprof sensors unit                         print the reader's systemd units (the recommended way)
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

from ..setup.options import SENSORS
from ..setup.options import Options
from ..setup.options import OptionError
from .common import PROG, Parser, UsageError


def sensors_cmd(argv: Sequence[str]) -> int:
    argv = list(argv)
    if argv and argv[0] == "record":
        return record_cmd(argv[1:])
    if argv and argv[0] == "serve":
        return serve_cmd(argv[1:])
    if argv and argv[0] == "unit":
        return unit_cmd(argv[1:])
    return list_cmd(argv)


def _powercap_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--powercap-root", default=None, help="powercap sysfs root (default /sys/class/powercap)")


def list_cmd(argv: list[str]) -> int:
    p = Parser(prog=f"{PROG} sensors", description="List the energy sensors this machine offers, how each is read, "
               "and the step that would enable each one missing. Subcommands: record, serve, unit.")
    _powercap_flag(p)
    ns = p.parse_args(argv)
    from ..collect import sensors

    found = sensors.survey(ns.powercap_root)
    try:
        print(format_listing(found, check_counters(found.sensors)))
    finally:
        for s in found.sensors:
            s.close()
    return 0


CHECK_BUDGET_S = 2.0  # the longest the listing watches the counters (an NVML counter is judged after 1 s)
CHECK_READ_S = 0.005


def check_counters(found: list[Any], budget_s: float = CHECK_BUDGET_S) -> dict[str, str]:
    """Which counters count: each one is read while this process keeps a CPU busy, until it has moved
    or stood still long enough to be condemned (the rule a run applies: base.FrozenWatch), at most
    `budget_s`. A GPU's is judged by what its driver says of its power and utilisation. Returns
    {source id: why it is not a sensor} for those that counted nothing."""
    t0 = time.perf_counter_ns()
    counters = []
    for s in found:
        if s.tier != "counter":
            continue
        try:
            s.start(t0)
        except Exception:  # noqa: BLE001 - a counter that cannot start is not judged here
            continue
        counters.append(s)
    if not counters:
        return {}
    first = {s.id: None for s in counters}
    settled: set[str] = set()
    end = t0 + int(budget_s * 1e9)
    while len(settled) < len(counters) and time.perf_counter_ns() < end:
        spin = time.perf_counter_ns() + int(CHECK_READ_S * 1e9)
        while time.perf_counter_ns() < spin:  # the CPU busy, so a CPU counter has something to count
            pass
        t = time.perf_counter_ns()
        for s in counters:
            if s.id in settled:
                continue
            try:
                v = float(s.read(t))
            except Exception:  # noqa: BLE001
                settled.add(s.id)
                continue
            if first[s.id] is None:
                first[s.id] = v
            elif v != first[s.id] or s.frozen is not None:
                settled.add(s.id)
    return {s.id: s.frozen for s in counters if s.frozen is not None}


def format_listing(found: Any, frozen: dict[str, str] | None = None) -> str:
    frozen = frozen or {}
    lines = ["found:" if found.sensors else "found: no energy sensor (a run uses the model: estimated figures)"]
    for s in found.sensors:
        period = f"every {s.update_period_s:g} s" if s.update_period_s else "period unknown"
        how = s.detail.get("reading") or s.detail.get("domain") or s.detail.get("event") or ""
        method = "FROZEN" if s.id in frozen else s.method
        lines.append(f"  {s.id:<16} {s.sensor:<13} {method:<9} {s.tier:<10} {period:<16} {how}")
    if frozen:
        lines.append("not counting (a run reads these no longer once it sees it: the model, or the GPU's power,"
                     " takes over, labelled):")
        for sid, why in frozen.items():
            lines.append(f"  {sid:<16} {why}")
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
    from ..drive.preflight import check_writable

    check_writable(ns.output, "--output")
    from ..collect.collector import open_sources

    found, _ = open_sources(options)
    try:
        rows = record(found.sensors, ns.seconds, ns.interval)
    finally:
        for s in found.sensors:
            s.close()
    from ..store.files import write_text

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


def _discover_knobs(powercap_root: str | None) -> list[Any]:
    """The knobs root may hand out (root discovers them; a client only ever names one)."""
    from ..knobs.registry import discover

    try:
        return discover(powercap_root=powercap_root)
    except Exception as exc:  # noqa: BLE001 - a knob backend that fails is left out, and said
        print(f"{PROG}: no knobs served: {exc}", file=sys.stderr)
        return []


def serve_cmd(argv: list[str]) -> int:
    from ..collect.sensors.served import DEFAULT_SOCKET
    from ..serve import server

    default = os.environ.get("ENERGYPROF_SENSOR_SOCKET") or DEFAULT_SOCKET
    p = Parser(prog=f"{PROG} sensors serve", description="As root: serve RAPL's counters (and power knobs within "
               "range) over a Unix socket to root and the members of a group (docs/sensors.md). The recommended "
               "deployment is the systemd socket unit: see --print-unit.")
    p.add_argument("--socket", default=None, help=f"socket path (default $ENERGYPROF_SENSOR_SOCKET or {DEFAULT_SOCKET})")
    p.add_argument("--group", default=None, help="the group whose members may read the counters (socket 0660 "
                   "root:GROUP, folder 0750 root:GROUP); without it, only root may (socket 0600)")
    p.add_argument("--control-group", default=None, help="the group whose members may also set knobs within range "
                   "(they need the socket too: make them members of --group); without it, only root sets knobs")
    p.add_argument("--read-interval", type=float, default=server.READ_INTERVAL_S, metavar="S",
                   help="clients other than root: at most one fresh reading per S seconds per user (the power"
                   f" side channel; default {server.READ_INTERVAL_S:g}, 0: no limit)")
    p.add_argument("--energy-resolution", type=int, default=server.ENERGY_RESOLUTION_UJ, metavar="UJ",
                   help="clients other than root: counters rounded down to UJ microjoules (default "
                   f"{server.ENERGY_RESOLUTION_UJ}, 1: the kernel's own)")
    p.add_argument("--set-interval", type=float, default=server.SET_INTERVAL_S, metavar="S",
                   help=f"clients other than root: at most one knob change per S seconds per user (default "
                   f"{server.SET_INTERVAL_S:g})")
    p.add_argument("--check", action="store_true", help="say what would be served, where and to whom; change nothing")
    p.add_argument("--print-unit", action="store_true", help="print the systemd socket and service units")
    p.add_argument("--idle-timeout", type=float, default=server.IDLE_TIMEOUT_S, help=argparse.SUPPRESS)
    _powercap_flag(p)
    ns = p.parse_args(argv)
    if ns.print_unit:
        return unit_cmd([])
    if ns.read_interval < 0 or ns.set_interval < 0 or ns.energy_resolution < 1:
        raise OptionError("--read-interval and --set-interval take seconds >= 0, --energy-resolution microjoules >= 1")
    path = ns.socket or default
    knobs = _discover_knobs(ns.powercap_root)
    if ns.check:
        return _check(path, ns.group, ns.powercap_root, knobs, ns.control_group)
    try:
        reader = server.Reader(path, ns.powercap_root, ns.group, knobs, control_group=ns.control_group,
                               idle_timeout_s=ns.idle_timeout, read_interval_s=ns.read_interval,
                               energy_resolution_uj=ns.energy_resolution, set_interval_s=ns.set_interval)
    except (ValueError, OSError) as exc:
        raise OptionError(str(exc)) from None

    def stop(signum: int, frame: Any) -> None:
        reader.server.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    what = ", ".join(reader.zones + [k.name for k in knobs])
    print(f"{PROG}: serving {what} on {path}" + (" (socket from systemd)" if reader.activated else "")
          + (f" to group {ns.group}" if ns.group else " to root only")
          + (f"; knobs set by root and group {ns.control_group}" if ns.control_group else "; knobs set by root only"),
          file=sys.stderr, flush=True)
    reader.serve_forever()  # restores every knob a client set and removes its socket when stopped
    return 0


def _check(path: str, group: str | None, powercap_root: str | None, knobs: list[Any],
           control_group: str | None = None) -> int:
    import grp
    import pwd

    from ..serve import server

    problems = []
    sock_group = group or control_group  # the socket is the read group's, or the control group's alone
    _, zones = server.rapl_reader(powercap_root)
    print(f"zones: {', '.join(zones) or 'none readable'}")
    print(f"knobs: {', '.join(k.name for k in knobs) or 'none'}")
    print(f"socket: {path} (mode {'0660' if sock_group else '0600'}, owner {pwd.getpwuid(os.geteuid()).pw_name}"
          + (f", group {sock_group})" if sock_group else ")"))
    folder = os.path.dirname(os.path.abspath(path))
    try:
        st = os.lstat(folder)
        try:
            server.check_folder(st, folder)
            print(f"folder: {folder} exists, owner {pwd.getpwuid(st.st_uid).pw_name}, mode {st.st_mode & 0o7777:04o}; kept as is")
        except server.ServeError as exc:
            problems.append(str(exc))
    except FileNotFoundError:
        print(f"folder: {folder} would be created, mode {'0750' if sock_group else '0700'}, owner "
              f"{pwd.getpwuid(os.geteuid()).pw_name}" + (f", group {sock_group}" if sock_group else ""))
    if group:
        try:
            g = grp.getgrnam(group)
            members = set(g.gr_mem) | {u.pw_name for u in pwd.getpwall() if u.pw_gid == g.gr_gid}
            print(f"group: {group} (gid {g.gr_gid}), members: {', '.join(sorted(members)) or 'none yet'}")
        except KeyError:
            problems.append(f"no group named {group!r} (create it: sudo groupadd --system {group})")
    else:
        print("group: none; only root" + (" and the control group" if control_group else "") + " may connect")
    print(f"control group: {control_group}; its members may set knobs within range" if control_group
          else "control group: none; only root may set knobs")
    if control_group:
        try:
            grp.getgrnam(control_group)
        except KeyError:
            problems.append(f"no group named {control_group!r} (create it: sudo groupadd --system {control_group})")
    if not zones and not knobs:
        problems.append("nothing to serve: no readable RAPL counter and no knob")
    if os.geteuid() != 0:
        problems.append("not root: the reader must run as root (or from its systemd unit)")
    if problems:
        print(f"{PROG} sensors serve: {problems[0]}", file=sys.stderr)
        return 2
    return 0


def unit_cmd(argv: list[str]) -> int:
    from importlib import resources

    p = Parser(prog=f"{PROG} sensors unit", description="Print the privileged reader's systemd units (the recommended "
               "deployment, docs/sensors.md), or write them into a folder.")
    p.add_argument("--install-to", default=None, help="write both unit files into this folder (e.g. /etc/systemd/system)")
    ns = p.parse_args(argv)
    units = resources.files("energyprof.serve") / "units"
    for name in ("energyprof-sensors.socket", "energyprof-sensors.service"):
        text = (units / name).read_text()
        if ns.install_to:
            with open(os.path.join(ns.install_to, name), "x") as f:
                f.write(text)
            print(f"wrote {os.path.join(ns.install_to, name)}")
        else:
            print(f"# ---- {name}\n{text}")
    return 0
