"""`energyprof sweep`: run a program once per configuration (a grid of its arguments x power knobs), repeated,
and keep each configuration's energy and time, the best under an objective, and the Pareto front.

    energyprof sweep --grid batch_size=32,64,128 --knob gpu_power_limit=100:250:25 --repeats 3 \\
        --window train --objective slowdown:1.1 --out sweep/ -- python train.py --batch-size {batch_size}

Each run is `python -m energyprof --json ... -- COMMAND` with the configuration's `{name}` placeholders
filled in and its knobs given as `--knob`, so the run sets them before the program starts, puts them
back when it ends (a keeper process does it even after a kill -9) and records them in its profile.
Repeats are interleaved: every configuration runs once before any runs twice, so a drift of the
machine (heat, a neighbour) spreads over all of them instead of biasing one.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..store.files import check_link, write_text
from .common import PROG, Parser, UsageError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_RUNS = 10_000
_COLUMNS = ("config", "runs", "time_s_mean", "time_s_std", "energy_j_mean", "energy_j_std", "pareto", "score", "best")


def build_sweep_parser() -> Parser:
    p = Parser(prog=f"{PROG} sweep", description="Run a program over a grid of arguments and power knobs, repeated,"
               " and report each configuration's energy and time, the best one and the Pareto front.")
    p.add_argument("--grid", action="append", default=[], metavar="NAME=A,B,C",
                   help="values for the program's {NAME} placeholder; repeatable (the grid is every combination)")
    p.add_argument("--knob", action="append", default=[], metavar="KIND[:INDEX]=VALUES",
                   help="a power knob's values, LOW:HIGH:STEP or A,B,C (gpu_power_limit W, cpu_power_limit W,"
                        " cpu_max_freq kHz, jetson_power_mode N); set before each run and put back after it")
    p.add_argument("--repeats", type=int, default=1, help="runs of each configuration (interleaved), default 1")
    p.add_argument("--window", metavar="NAME", help="measure each run inside the windows named NAME (or NAME:LABEL),"
                   " summed, instead of the whole run")
    p.add_argument("--energy", choices=("program", "machine"), default="program",
                   help="the program's share of the energy (default) or the whole machine's")
    p.add_argument("--objective", default="energy", help="energy, time, edp, slowdown:FACTOR or cost:ETA"
                   " (default energy)")
    p.add_argument("--out", default="sweep", help="folder for the runs' profiles, sweep.csv, sweep.json and"
                   " sweep.html (default ./sweep)")
    g = p.add_argument_group("passed to every run")
    g.add_argument("--power-trace", help="replay this power trace CSV instead of reading sensors")
    g.add_argument("--powercap-root", help="powercap sysfs root (sensors and the cpu_power_limit knob)")
    g.add_argument("--sensor", action="append", default=[], metavar="NAME", help="read only this sensor (repeatable)")
    g.add_argument("--interval", type=float, help="stack sampling interval in seconds")
    g.add_argument("--sensor-interval", type=float, help="sensor polling interval in seconds")
    g.add_argument("--no-gpu", action="store_true", help="do not read NVIDIA GPUs")
    p.add_argument("--ray", metavar="ADDRESS", help="run each configuration as a Ray task on a cluster (its address,"
                   " or `local` for a local one); the sweep's folder must be one the cluster's machines share")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors and the best configuration")
    return p


def _grid(specs: list[str]) -> list[tuple[str, list[str]]]:
    axes = []
    for text in specs:
        name, eq, values = text.partition("=")
        if not eq or not _NAME.match(name):
            raise UsageError(f"--grid {text!r}: NAME=A,B,C with NAME a plain identifier")
        items = [v.strip() for v in values.split(",")]
        if not values or any(not v for v in items):
            raise UsageError(f"--grid {text!r}: an empty value")
        if name in _COLUMNS:
            raise UsageError(f"--grid {name}: the name is one of sweep.csv's own columns; call it something else")
        if name in (n for n, _ in axes):
            raise UsageError(f"--grid {name} given twice")
        axes.append((name, items))
    return axes


def _knobs(specs: list[str], powercap_root: str | None) -> list[tuple[str, list[str]]]:
    """Every knob spec checked against the machine's knobs and ranges now, before the first run."""
    from ..knobs.base import KnobError, num
    from ..knobs.registry import discover, overlap, parse_spec, resolve

    if not specs:
        return []
    try:
        parsed = [parse_spec(t) for t in specs]
        resolved = resolve(parsed, discover(powercap_root=powercap_root, kinds=tuple({s.kind for s in parsed})))
    except KnobError as exc:
        raise UsageError(f"--knob: {exc}") from None
    names = [s.name for s in parsed]
    if len(set(names)) != len(names):
        raise UsageError("--knob: the same knob given twice")
    both = overlap(resolved)  # one knob under two names: the sweep's axes would not be independent
    if both is not None:
        raise UsageError(f"--knob: {both}")
    return [(s.name, [num(v) for v in s.values]) for s in parsed]


def _fill(command: list[str], values: dict[str, str]) -> list[str]:
    """Each `{name}` of the configuration replaced; other braces (a -c program's own) left alone."""
    pattern = re.compile(r"\{(" + "|".join(re.escape(k) for k in values) + r")\}") if values else None
    return [pattern.sub(lambda m: values[m.group(1)], a) if pattern else a for a in command]


def _forwarded(ns: Any) -> list[str]:
    out: list[str] = []
    for flag, value in (("--power-trace", ns.power_trace), ("--powercap-root", ns.powercap_root),
                        ("--interval", ns.interval), ("--sensor-interval", ns.sensor_interval)):
        if value is not None:
            out += [flag, str(value)]
    for s in ns.sensor:
        out += ["--sensor", s]
    if ns.no_gpu:
        out.append("--no-gpu")
    return out


def _measure(profile: Any, window: str | None, machine: bool) -> tuple[float, float]:
    """(time s, energy J) of a run: over the whole run, or summed over the windows named `window`; the program's
    energy (where a window's file has it) or the machine's."""
    if window is None:
        from ..analysis.report import RenderOptions, build

        m = build(profile, RenderOptions(carbon=None))
        return m.duration_s, sum((m.totals.energy_j if machine else m.totals.attributed_j).values())
    from ..analysis.pareto import program_energy, split_name

    chosen = [w for w in profile.windows if split_name(w.name)[0] == window]
    if not chosen:
        raise LookupError(f"no window named {window!r}")
    energies = [None if machine else program_energy(w) for w in chosen]
    if any(e is None for e in energies):
        energies = [sum(w.energy_j.values()) for w in chosen]
    return sum(w.time_s for w in chosen), sum(e for e in energies if e is not None)


def _on_ray(address: str, runs: list[Any]) -> dict[str, int]:
    """Every run as a Ray task, submitted in the interleaved order; each profile written where a local
    sweep writes it, with the machine it ran on. {stem: exit status}."""
    from ..engines.ray_trials import Trials

    try:
        trials = Trials(address)
    except Exception as exc:  # noqa: BLE001 - no Ray, or no cluster at that address: one line
        raise UsageError(f"--ray {address}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    try:
        for _, _, _, stem, run_argv in runs:
            trials.submit(run_argv, str(Path.cwd()), f"{stem.resolve()}.json", alone="--knob" in run_argv)
        results = trials.results()
    finally:
        trials.close()
    statuses = {}
    for (_, _, _, stem, _), (status, text, err, host) in zip(runs, results):
        if text:
            doc = json.loads(text)
            doc.setdefault("meta", {}).setdefault("sweep", {})["ray_host"] = host
            write_text(f"{stem}.json", json.dumps(doc))
        elif status == 0:
            status = 1  # ran, but left no profile where the driver can read it
        if status != 0 and err:
            print(f"energyprof sweep: {stem.name} on {host}: {err.strip().splitlines()[-1]}", file=sys.stderr)
        statuses[str(stem)] = status
    return statuses


class _Sweep:
    """A sweep as its command line asked for it, checked before the first run."""

    def __init__(self, ns: Any, command: list[str], objective: Any, axes: list[tuple[str, list[Any]]],
                 knobs: list[tuple[str, list[Any]]], configs: list[dict[str, Any]], out: Path) -> None:
        self.ns, self.command, self.objective, self.axes, self.knobs = ns, command, objective, axes, knobs
        self.configs, self.out = configs, out
        self.knob_names = {n for n, _ in knobs}


def sweep_cmd(argv: list[str]) -> int:
    sweep = _parse(argv)
    results, profiles, failed, stopped = _run_all(sweep)
    return _report(sweep, results, profiles, failed, stopped)


def _parse(argv: list[str]) -> _Sweep:
    """The sweep's command line, checked: UsageError, one line, before any run."""
    from ..analysis.sweep import ObjectiveError, parse_objective

    own, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = build_sweep_parser()
    ns = parser.parse_args(own)
    if not command:
        raise UsageError("sweep needs the program after --, e.g. -- python train.py --batch-size {batch_size}")
    if ns.repeats < 1:
        raise UsageError(f"--repeats must be at least 1, not {ns.repeats}")
    try:
        objective = parse_objective(ns.objective)
    except ObjectiveError as exc:
        raise UsageError(str(exc)) from None
    if ns.power_trace is not None and not Path(ns.power_trace).is_file():
        raise UsageError(f"--power-trace: {ns.power_trace} is not a file")
    grid = _grid(ns.grid)
    joined = " ".join(command)
    for name, _ in grid:
        if "{" + name + "}" not in joined:
            raise UsageError(f"--grid {name}: the command has no {{{name}}} to put its values in")
    knobs = _knobs(ns.knob, ns.powercap_root)
    axes = grid + knobs
    if not axes:
        raise UsageError("nothing to sweep: give --grid and/or --knob")
    configs = [dict(zip([n for n, _ in axes], combo)) for combo in itertools.product(*(v for _, v in axes))]
    if len(configs) * ns.repeats > MAX_RUNS:
        raise UsageError(f"{len(configs)} configurations x {ns.repeats} repeats is more than {MAX_RUNS} runs")
    out = Path(ns.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out: cannot make {out}: {exc.strerror or exc}") from None
    try:  # before the first run: a planted link is one line and exit 2, not a lost sweep at its end
        for name in ("sweep.json", "sweep.csv", "sweep.html"):
            check_link(str(out / name))
    except OSError as exc:
        raise UsageError(f"--out: {exc}") from None
    return _Sweep(ns, command, objective, axes, knobs, configs, out)


def _run_all(sweep: _Sweep) -> tuple[list[Any], list[tuple[str, str, Any]], int, bool]:
    """Every configuration once per round, each a run of energyprof of its own: (the measured runs, their
    profiles, how many failed, whether Ctrl-C stopped the sweep)."""
    from ..analysis.sweep import RunResult, label
    from ..facts.profile import ProfileFormatError
    from ..facts.profile import load

    ns, out = sweep.ns, sweep.out
    forwarded = _forwarded(ns)
    results: list[RunResult] = []
    profiles: list[tuple[str, str, Any]] = []  # (path, label, profile) of every run that measured
    failed = 0
    stopped = False
    plan = [(repeat, ci, values) for repeat in range(ns.repeats) for ci, values in enumerate(sweep.configs)]
    runs = []
    for repeat, ci, values in plan:  # interleaved: every configuration once per round
        stem = out / f"run-c{ci:02d}-r{repeat}"
        knob_args = [a for n in values if n in sweep.knob_names for a in ("--knob", f"{n}={values[n]}")]
        runs.append((repeat, ci, values, stem, [sys.executable, "-m", "energyprof", "-q", *forwarded, *knob_args,
                                                "--json", f"{stem.resolve()}.json", "-o", f"{stem.resolve()}.html",
                                                "--", *_fill(sweep.command, values)]))
    statuses = _on_ray(ns.ray, runs) if ns.ray else {}
    for repeat, ci, values, stem, run_argv in runs:
        if not ns.quiet:
            print(f"energyprof sweep: [{repeat + 1}/{ns.repeats}] {label(values)}", file=sys.stderr, flush=True)
        try:
            status = statuses[str(stem)] if ns.ray else subprocess.run(run_argv).returncode
        except KeyboardInterrupt:  # Ctrl-C reached the run too (it restores its own knobs): keep what ran
            print("energyprof sweep: interrupted; the table holds the runs that finished", file=sys.stderr)
            stopped = True
            break
        why = f"exit status {status}" if status != 0 else ""
        if not why:
            try:
                profile = load(f"{stem}.json")
                t, e = _measure(profile, ns.window, ns.energy == "machine")
            except (OSError, ProfileFormatError, LookupError) as exc:
                why = str(exc)
        if why:
            failed += 1
            print(f"energyprof sweep: {label(values)} repeat {repeat + 1}: {why}; left out", file=sys.stderr)
            continue
        results.append(RunResult(ci, repeat, t, e))
        profiles.append((f"{stem}.json", f"{label(values)} #{repeat + 1}", profile))
    return results, profiles, failed, stopped


def _report(sweep: _Sweep, results: list[Any], profiles: list[tuple[str, str, Any]], failed: int,
            stopped: bool) -> int:
    """The table (JSON, CSV), the page, the best configuration; the sweep's exit status."""
    from ..analysis.sweep import score, summarize

    ns, out, axes, objective = sweep.ns, sweep.out, sweep.axes, sweep.objective
    summaries = summarize(sweep.configs, results)
    limits = [float(v) for n, vs in sweep.knobs if n.split(":")[0].endswith("power_limit") for v in vs]
    best = score(summaries, objective, max(limits) if limits else None)
    table = {"objective": str(objective), "window": ns.window, "repeats": ns.repeats, "command": sweep.command,
             "axes": {n: vs for n, vs in axes}, "knobs": sorted(sweep.knob_names), "failed_runs": failed,
             "energy": ns.energy, "power": "measured" if ns.power_trace is None else "replayed power trace",
             "best": best.to_json() if best is not None else None,
             "configurations": [s.to_json() for s in summaries]}
    # The one writer (store/files.py): a sweep over knobs runs as root, and another user's link planted in a
    # shared sticky folder is refused there, not followed.
    try:
        write_text(str(out / "sweep.json"), json.dumps(table, indent=1) + "\n")
        f = io.StringIO(newline="")
        w = csv.writer(f)
        w.writerow([_COLUMNS[0], *[n for n, _ in axes], *_COLUMNS[1:]])
        for s in summaries:
            w.writerow([s.index, *[s.values[n] for n, _ in axes], s.n, f"{s.time_s:.6g}", f"{s.time_std:.6g}",
                        f"{s.energy_j:.6g}", f"{s.energy_std:.6g}", int(s.pareto),
                        "" if s.score is None else f"{s.score:.6g}", int(best is not None and s.index == best.index)])
        write_text(str(out / "sweep.csv"), f.getvalue())
    except OSError as exc:
        print(f"energyprof sweep: could not write the table in {out}: {exc.strerror or exc}", file=sys.stderr)
        return 130 if stopped else 1
    if len(profiles) >= 2:
        _write_page(profiles, summaries, ns.window, ns.energy == "machine", str(out / "sweep.html"))
    if best is not None:
        print(f"energyprof sweep: best under {objective}: {best.label} ({best.energy_j:.4g} J, {best.time_s:.4g} s,"
              f" n={best.n}); table in {out / 'sweep.csv'}", file=sys.stderr)
    else:
        print("energyprof sweep: no configuration measured", file=sys.stderr)
    return 130 if stopped else 1 if failed or best is None else 0


def _write_page(profiles: list[tuple[str, str, Any]], summaries: list[Any], window: str | None, machine: bool,
                path: str) -> None:
    """compare's page over every run, its sweep figure holding one point per configuration (the mean of its
    repeats, their spread in the label)."""
    from ..analysis.compare import compare
    from ..analysis.pareto import WindowPoint
    from ..render.compare import write_html

    cmp = compare([p for _, _, p in profiles], [p for p, _, _ in profiles], [lb for _, lb, _ in profiles])
    cmp.sweep = window or "configuration"
    cmp.sweep_program = not machine
    cmp.sweep_points = [WindowPoint(s.index, f"{s.label} (n={s.n}, \u00b1{s.energy_std:.3g} J, \u00b1{s.time_std:.3g} s)",
                                    s.time_s, s.energy_j, s.pareto) for s in summaries]
    try:
        write_html(cmp, path)
    except OSError as exc:
        print(f"energyprof sweep: could not write {path}: {exc.strerror or exc}", file=sys.stderr)
