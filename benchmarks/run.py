"""Overhead of energyprof (and pyinstrument) on a few workloads, measured side by side.

    python benchmarks/run.py                      # every workload, 5 pairs each
    python benchmarks/run.py --pairs 9 --workloads calls,loops
    python benchmarks/run.py --quick              # tiny sizes, 2 pairs: the CI smoke run

Each profiled run is paired with a plain run of the same workload, back to back, in
separate fresh processes; the order inside a pair alternates (A B, B A, ...) so slow drift
of a shared machine cancels out, and a ratio only ever compares two runs taken seconds
apart. A warm-up pair per workload and mode comes first and is thrown away (page cache,
CPU frequency, first-import .pyc writing).

Two times per run:
* work: what the workload measured around its work (`BENCH_SECONDS=` on stdout), i.e. how
  much the profiler slows the program while it runs. The targets are about this one.
* wall: the whole process, start-up and report writing included (the price of one run).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKLOADS_DIR = HERE / "workloads"
WORKLOADS = ("calls", "loops", "native", "threads", "training", "loader")
MARKER = "BENCH_SECONDS="
CPU_MARKER = "BENCH_CPU_SECONDS="
SKIP_EXIT = 3  # workloads/training.py: torch or the example is missing
QUICK_SIZE = 0.05

# The cheapest energyprof configuration the options allow: 50 Hz stacks, 10 Hz sensors, no
# memory probes, no child-process polling.
CHEAP_FLAGS = ["--interval", "0.02", "--sensor-interval", "0.1", "--memory", "off", "--no-children"]


@dataclass
class Mode:
    """One way to run a workload: a name and the command prefix before the script path."""

    name: str
    label: str
    prefix: list[str]
    writes: str | None = None  # output flag to point into the temp dir, if the tool writes one


@dataclass
class Result:
    work: list[float] = field(default_factory=list)  # profiled / plain, per pair
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # the work's CPU time in the program's process
    skipped: str | None = None
    failed: str | None = None


def modes(py: str, out: Path) -> list[Mode]:
    ep = [py, "-m", "energyprof", "-q"]
    return [
        Mode("default", "energyprof (default: threads, 5 ms)", ep + ["-o", str(out / "ep.html")]),
        Mode("cheap", "energyprof cheapest", ep + ["-o", str(out / "cheap.html")] + CHEAP_FLAGS),
        Mode("no-memory", "energyprof default without memory tracking",
             ep + ["-o", str(out / "nomem.html"), "--memory", "off", "--no-peak-reset"]),
        Mode("no-follow", "energyprof default, children measured by CPU only",
             ep + ["-o", str(out / "nofollow.html"), "--no-follow"]),
        Mode("ep-pyinst", "energyprof --sampler pyinstrument",
             ep + ["-o", str(out / "epp.html"), "--sampler", "pyinstrument"]),
        Mode("pyinstrument", "python -m pyinstrument (1 ms)",
             [py, "-m", "pyinstrument", "-o", str(out / "pyinstrument.txt")]),
    ]


def run_once(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, float] | str:
    """(work seconds, wall seconds, work CPU seconds), or the reason it did not produce a time."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - t0
    if proc.returncode == SKIP_EXIT:
        return "skipped: " + (proc.stderr.strip().splitlines() or ["exit 3"])[-1].split("skipped, ")[-1]
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        return f"failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}"
    cpu = float("nan")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(CPU_MARKER):
            cpu = float(line[len(CPU_MARKER):])
        if line.startswith(MARKER):
            for later in proc.stdout.splitlines():
                if later.startswith(CPU_MARKER):
                    cpu = float(later[len(CPU_MARKER):])
            return float(line[len(MARKER):]), wall, cpu
    return f"failed: no {MARKER} line from {' '.join(cmd)}"


def bench_workload(name: str, size: float, pairs: int, all_modes: list[Mode], py: str, env: dict[str, str],
                   cwd: Path, extra: list[str], log: bool) -> dict[str, Result]:
    script = [str(WORKLOADS_DIR / f"{name}.py"), str(size), *extra]
    plain = [py, *script]
    results = {m.name: Result() for m in all_modes}
    for rnd in range(pairs + 1):  # round 0 is the warm-up
        for m in all_modes:
            res = results[m.name]
            if res.skipped or res.failed:
                continue
            cmds = [plain, m.prefix + script]
            if rnd % 2:
                cmds.reverse()
            times = [run_once(c, env, cwd) for c in cmds]
            if rnd % 2:
                times.reverse()
            bad = next((t for t in times if isinstance(t, str)), None)
            if bad is not None:
                if bad.startswith("skipped"):
                    res.skipped = bad
                    continue
                # One broken mode (say, a renderer mid-rewrite) must not hide the others.
                res.failed = bad
                print(f"{name}/{m.name}: {bad}", file=sys.stderr, flush=True)
                continue
            (p_work, p_wall, p_cpu), (m_work, m_wall, m_cpu) = times  # type: ignore[misc]
            if rnd == 0:
                continue
            res.work.append(m_work / p_work)
            res.wall.append(m_wall / p_wall)
            if p_cpu > 0 and m_cpu == m_cpu:
                res.cpu.append(m_cpu / p_cpu)
            if log:
                print(f"  {name:8s} {m.name:12s} pair {rnd}: plain {p_work:.3f}s  profiled {m_work:.3f}s"
                      f"  x{m_work / p_work:.3f}", file=sys.stderr, flush=True)
    return results


def machine() -> str:
    from energyprof.collect import probes

    return (f"machine: {probes.cpu_model()}, {os.cpu_count()} logical CPUs, "
            f"Python {platform.python_version()} ({platform.python_implementation()}), {platform.system()}"
            f"{load_average()}")


def load_average() -> str:
    """The machine's load when the run started: on a shared box it says how noisy the figures are."""
    try:
        one, five, _ = os.getloadavg()
    except (AttributeError, OSError):
        return ""
    return f"; load average {one:.1f} (1 min), {five:.1f} (5 min)"


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} [{min(values):.2f}-{max(values):.2f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=5, help="measured pairs per workload and mode (default 5)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes and 2 pairs: a smoke run for CI")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated, from " + ",".join(WORKLOADS))
    ap.add_argument("--modes", default=None,
                    help="comma-separated subset of default,cheap,no-memory,no-follow,ep-pyinst,pyinstrument")
    ap.add_argument("--tree", default=None, metavar="REPO",
                    help="profile with the energyprof checked out at REPO (say, a previous commit), this tree's workloads")
    ap.add_argument("--cpu", action="store_true",
                    help="also print the work's CPU-time ratio (steadier than time on a loaded machine)")
    ap.add_argument("--tick-rate", action="store_true",
                    help="instead: sensor ticks per second while the program holds the GIL (loops, a 300 MB bytearray)")
    ap.add_argument("--baseline", default=None, metavar="REPO",
                    help="with --tick-rate: also measure the energyprof checked out at REPO, side by side")
    ap.add_argument("--size", type=float, default=None, help="workload scale (default 1.0, ~1-2 s; --quick: 0.05)")
    ap.add_argument("--training-args", default="", help="arguments passed to examples/lenet_cifar.py")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every pair on stderr")
    ns = ap.parse_args(argv)

    names = [w.strip() for w in ns.workloads.split(",") if w.strip()]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s): {', '.join(unknown)}")
    if ns.tick_rate:
        return tick_rate(ns.pairs, ns.baseline)
    pairs = 2 if ns.quick and ns.pairs == 5 else ns.pairs
    if pairs < 1:
        ap.error("--pairs must be at least 1")
    size = ns.size if ns.size is not None else (QUICK_SIZE if ns.quick else 1.0)
    py = sys.executable
    env = dict(os.environ)
    tree = str(Path(ns.tree).resolve()) if ns.tree else str(REPO)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONHASHSEED", "0")

    print(machine())
    if ns.tree:
        print(f"energyprof from {tree}")
    print(f"pairs: {pairs} per workload and mode after 1 warm-up pair; size {size:g}; "
          f"ratio = profiled / plain, median [min-max]")
    print(f"cheapest energyprof flags: {' '.join(CHEAP_FLAGS)}")
    tmp = Path(tempfile.mkdtemp(prefix="energyprof-bench-"))
    try:
        all_modes = modes(py, tmp)
        if ns.modes:
            wanted = [m.strip() for m in ns.modes.split(",")]
            all_modes = [m for m in all_modes if m.name in wanted]
        t_start = time.perf_counter()
        table: dict[str, dict[str, Result]] = {}
        for name in names:
            extra = ns.training_args.split() if name == "training" else []
            table[name] = bench_workload(name, size, pairs, all_modes, py, env, tmp, extra, ns.verbose)
        print()
        report(table, all_modes, cpu=ns.cpu)
        print(f"\n(benchmark took {time.perf_counter() - t_start:.0f} s)")
        if any(r.failed for results in table.values() for r in results.values()):
            return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


GIL_PROGRAMS = {
    "loops": "import sys; sys.path.insert(0, {wd!r}); import loops; loops.work(22_000_000)",
    "bytearray": "import time\nfor _ in range(5):\n    b = bytearray(300 * 1024 * 1024)\n    del b\n    time.sleep(0.05)",
}


def tick_rate(runs: int, baseline: str | None) -> int:
    """Sensor readings per second of wall time during programs that hold the GIL, read from
    the profile's timeline (one point per reading while the run has fewer than 1000)."""
    import json

    trees = [("this tree", str(REPO))] + ([("baseline", baseline)] if baseline else [])
    print(machine())
    print(f"sensor ticks per second (default 10 ms sensor interval: 100/s at most), median of {runs} runs")
    tmp = Path(tempfile.mkdtemp(prefix="energyprof-bench-"))
    try:
        for prog, code in GIL_PROGRAMS.items():
            (tmp / f"{prog}_prog.py").write_text(code.format(wd=str(WORKLOADS_DIR)))
            cells = []
            for label, tree in trees:
                rates = []
                for _ in range(runs):
                    env = dict(os.environ, PYTHONPATH=tree)
                    out = tmp / "t.json"
                    subprocess.run([sys.executable, "-m", "energyprof", "-q", "-o", str(tmp / "t.html"),
                                    "--json", str(out), str(tmp / f"{prog}_prog.py")], env=env, cwd=tmp, check=True)
                    d = json.loads(out.read_text())
                    rates.append(len(d["timeline"]["t_s"]) / d["totals"]["duration_s"])
                cells.append(f"{label}: {statistics.median(rates):.0f}/s [{min(rates):.0f}-{max(rates):.0f}]")
            print(f"{prog:10s} " + "   ".join(cells))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def report(table: dict[str, dict[str, Result]], all_modes: list[Mode], cpu: bool = False) -> None:
    titles = {"work": "work time ratio (the workload's own timer: slowdown while it runs)",
              "wall": "wall time ratio (whole process: start-up and report included)",
              "cpu": "work CPU ratio (CPU the program's process burnt during the work, a profiler's own threads"
                     " in it included: steadier than time on a loaded machine)"}
    if not cpu:
        del titles["cpu"]
    for kind, title in titles.items():
        print(f"{title}")
        head = f"{'workload':10s}" + "".join(f"{m.name:>22s}" for m in all_modes)
        print(head)
        for name, results in table.items():
            cells = []
            for m in all_modes:
                r = results[m.name]
                values = getattr(r, kind)
                cells.append("skipped" if r.skipped else "FAILED" if r.failed else fmt(values) if values else "-")
            print(f"{name:10s}" + "".join(f"{c:>22s}" for c in cells))
        print()
    print("modes:")
    for m in all_modes:
        print(f"  {m.name:12s} {m.label}")
    for name, results in table.items():
        for r in results.values():
            if r.skipped:
                print(f"{name}: {r.skipped}")
                break
        for mode, r in results.items():
            if r.failed:
                print(f"{name}/{mode}: {r.failed.splitlines()[0]}")


if __name__ == "__main__":
    raise SystemExit(main())
