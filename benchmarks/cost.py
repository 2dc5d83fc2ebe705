"""energyprof's own CPU, whole process tree, beside py-spy's and plain python's.

    python benchmarks/cost.py                 # 7 rounds of every figure (~4 min)
    python benchmarks/cost.py --rounds 3 --fib 27
    python benchmarks/cost.py --base ../old   # also another checkout of energyprof, in the same rounds

CPU seconds are the children's rusage (user + system) of one run: the supervisor, the
program, every process it started and waited for, and py-spy's sampler. Each round runs
plain python, energyprof and py-spy back to back (the order rotating), so a figure only
compares runs taken seconds apart; the table gives the median over the rounds with min-max.

* fixed: an empty script, CPU of the tool's run minus plain python's: start-up plus report.
* proportional: `fib(N)` in the main process, and the same in a followed Python child, CPU
  over plain python's after the cost of the same run doing nothing is taken off (the empty
  script; for the child, a parent whose child runs fib(0), so what following a child costs
  once is its own row), as a share of the program's CPU. The program also writes its own
  process's CPU (`getrusage`, its sampler thread included): "in the program" is that figure
  over plain python's, the agent's part alone; the rest of the whole-tree figure is the
  supervisor's (reading sensors and spools). What a run costs once for having a call tree
  at all (~17 ms of the supervisor's here) shows as a share on short programs: fib(36) runs
  ~2.3 s.
* proportional, measured inside each run: the program also writes its main thread's CPU
  (`time.thread_time()`), so each run splits into the program's own work and everything else
  (supervisor, agent threads, report). The whole-tree figures above are differences of two runs,
  and the program's own run-to-run swing on this guest (a few % of its CPU) is as big as the
  budget; this one is a difference within each run, so the swing cancels. With it: the
  program's main thread against plain python's, which is what the agent's sampling costs the
  program's own work (GIL hand-overs, caches).
* bootstrap: what the agent adds to a Python child's start (`python -c pass` with the
  supervisor's environment, against plain; 40 runs a round).
* window: `benchmarks/monitor.py` measures one Monitor window (run it for that figure).
* `--breakdown S`: where a run's cost per second goes instead. A program that sleeps S seconds
  and one that computes, each under energyprof, against an empty script: the whole tree's
  CPU per second of the run, the program's own process (its sampler), and the rest (the
  supervisor's ticks).

energyprof's modules are compiled first, as `pip install` does: a checkout run with
PYTHONDONTWRITEBYTECODE would compile all of them in every process and measure that instead.

`--energyprof-args "--interval 0.005"` gives every energyprof run those flags.

Run it with the interpreter of a clean environment (a venv with README's install and py-spy):
energyprof runs two interpreters where plain python and py-spy run one, so whatever the
interpreter's own start does (a `.pth` file that imports a package, say) is charged to energyprof
once more. On this machine the base interpreter's site imports certifi (and pathlib, re and
importlib.resources with it) from a `.pth` file: 28 ms of every start.

py-spy (`pip install py-spy`) samples from outside at the same rate (100 Hz, `--subprocesses`
for the child); its column is left out when it is not installed.

`--base DIR` adds a column for the energyprof of another checkout (its modules compiled too), run
in the same rounds as this one, so a change is measured against its parent under the same load.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIB = """
import os, resource, time
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
fib({n})
t = resource.getrusage(resource.RUSAGE_SELF)  # this process's own CPU (its sampler thread included)
main = time.thread_time()  # the main thread's alone: the program's own work
with open(os.environ["BENCH_OWN"], "a") as fh:
    fh.write(repr(t.ru_utime + t.ru_stime) + " " + repr(main) + "\\n")
"""
#: (the program, the same run doing nothing, its label): each figure is the first over the second
WORK_AND_NOTHING = (("fib.py", "empty.py", "main process"), ("parent.py", "parent0.py", "followed child"))
PARENT = """
import subprocess, sys
subprocess.run([sys.executable, "{script}"], check=True)
"""


def cpu_of(cmd: list[str], cwd: Path, env: dict[str, str], check: bool = True) -> float:
    """CPU seconds (user + system) of a command and every descendant it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, cwd=cwd, env=env, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def tools(work: Path, base: Path | None = None) -> dict[str, list[str]]:
    ep = [sys.executable, "-m", "energyprof", "-q", "-o", str(work / "r.html"), "--json", str(work / "p.json")]
    out = {"plain": [sys.executable], "energyprof": ep}
    if base is not None:
        out["energyprof (base)"] = ep
    # The py-spy installed beside this interpreter first: on PATH there may be a version manager's
    # shim (pyenv's is a bash script), which cost 55-65 ms of CPU a run here, charged to py-spy.
    beside = Path(sys.executable).with_name("py-spy")
    spy = str(beside) if os.access(beside, os.X_OK) else shutil.which("py-spy")
    if spy:
        out["py-spy"] = [spy, "record", "-r", "100", "--subprocesses", "-o", str(work / "spy.txt"), "-f", "raw", "--",
                         sys.executable]
    try:  # pyinstrument with its HTML renderer, as energyprof writes its page (it is a dependency of energyprof's)
        import pyinstrument  # noqa: F401
    except ImportError:
        pass
    else:
        out["pyinstrument"] = [sys.executable, "-m", "pyinstrument", "-r", "html", "-o", str(work / "pi.html")]
    return out


def last_own(work: Path) -> tuple[float, float]:
    """(the process's own CPU, its main thread's) as the program last wrote them; a script that
    writes one figure gives it for both."""
    figures = [float(x) for x in (work / "own.txt").read_text().splitlines()[-1].split()]
    return figures[0], figures[-1]


def share(part: float, whole: float) -> float:
    """part / whole, 0 where a program too small for the clocks measured no CPU at all."""
    return part / whole if whole > 0 else 0.0


def median_range(values: list[float], scale: float = 1.0, fmt: str = "{:.3f}") -> str:
    v = [x * scale for x in values]
    return f"{fmt.format(statistics.median(v))} [{fmt.format(min(v))}-{fmt.format(max(v))}]"


def bootstrap_ms(work: Path, env: dict[str, str], runs: int) -> float:
    """Median over `runs` of (CPU of `python -c pass` with the agent's environment) - (without), in ms."""
    spool = Path(tempfile.mkdtemp(prefix="spool-", dir=work))
    sys.path.insert(0, str(REPO))
    from energyprof.setup.options import Options
    from energyprof.supervise.bootstrap import child_env

    agent_env = child_env(Options.from_kwargs({}), str(spool), env)
    diffs = []
    for i in range(runs):
        pair = [(agent_env, 1), (env, -1)] if i % 2 else [(env, -1), (agent_env, 1)]
        d = 0.0
        for e, sign in pair:
            d += sign * cpu_of([sys.executable, "-c", "pass"], work, e)
        diffs.append(d)
        for f in spool.iterdir():
            f.unlink()
    return statistics.median(diffs) * 1e3


def per_sample_us(samples: int = 5000) -> float:
    """CPU microseconds of one agent sample here: two threads (the main one and one waiting 30
    frames deep), a spool flush every fourth sample as at the default rate."""
    import threading

    sys.path.insert(0, str(REPO))
    from energyprof.agent.sampler import Sampler
    from energyprof.agent.spool import Spool

    folder = tempfile.mkdtemp(prefix="energyprof-sample-")
    spool = Spool(os.path.join(folder, "1-1.spool"))
    sampler = Sampler(spool, 0.005)
    done = threading.Event()

    def deep(n: int) -> None:
        if n:
            return deep(n - 1)
        done.wait()

    t = threading.Thread(target=deep, args=(30,))
    t.start()
    try:
        sampler._thread_cpu_deltas(sys._current_frames(), first=True)
        c = time.process_time_ns()
        for i in range(samples):
            sampler._one(0, 1, sys._current_frames(), 1000, 1000, 0)
            if i % 4 == 0:
                spool.flush()
        return (time.process_time_ns() - c) / samples / 1e3
    finally:
        done.set()
        t.join()
        shutil.rmtree(folder, ignore_errors=True)


SLEEPER = """
import os, time
time.sleep({s})
with open(os.environ["BENCH_OWN"], "a") as fh:
    fh.write(repr(time.process_time()) + "\\n")
"""


def breakdown(work: Path, env: dict[str, str], rounds: int, seconds: float, fib: int, extra: list[str]) -> None:
    """CPU per second of run: energyprof's whole tree over plain python's, split into the
    program's own process (its sampler thread: the agent) and the rest (supervisor, report)."""
    (work / "sleep.py").write_text(SLEEPER.format(s=seconds))
    (work / "nothing.py").write_text(SLEEPER.format(s=0))
    ep = [*tools(work)["energyprof"], *extra]
    rows: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for r in range(rounds):
        for script in ("nothing.py", "sleep.py", "fib.py"):
            for name, cmd in (("plain", [sys.executable]), ("energyprof", ep))[::1 if r % 2 else -1]:
                t = time.perf_counter()
                total = cpu_of([*cmd, script], work, env)
                wall = time.perf_counter() - t
                own = last_own(work)[0]
                rows.setdefault((name, script), []).append((total, own, wall))
        print(f"round {r + 1}/{rounds}", file=sys.stderr)
    med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in rows.items()}
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    print(f"rounds: {rounds}; energyprof {' '.join(extra) or '(defaults)'}; medians; ms of CPU per second of the run")
    print()
    print("| program | whole tree over plain | its own process over plain (the agent) | the rest (the supervisor) |")
    print("|---|---|---|---|")
    nothing = med[("energyprof", "nothing.py")]
    for script, label in (("sleep.py", f"sleeps {seconds:g} s"), ("fib.py", f"fib({fib})")):
        e, p = med[("energyprof", script)], med[("plain", script)]
        secs = p[2]
        whole = (e[0] - nothing[0]) - (p[0] - med[("plain", "nothing.py")][0])
        agent = e[1] - p[1]
        print(f"| {label} | {1e3 * whole / secs:.1f} | {1e3 * agent / secs:.1f} | {1e3 * (whole - agent) / secs:.1f} |")


def startup(work: Path, ts: dict[str, list[str]], env: dict[str, str], envs: dict[str, dict[str, str]],
            rounds: int) -> None:
    """The empty script alone, every tool in each round (order rotating): CPU over plain python's."""
    cpu: dict[str, list[float]] = {}
    for r in range(rounds):
        names = list(ts)
        for name in names[r % len(names):] + names[:r % len(names)]:
            cpu.setdefault(name, []).append(cpu_of([*ts[name], "empty.py"], work, envs.get(name, env), name != "py-spy"))
    over = {t: [x - p for x, p in zip(cpu[t], cpu["plain"])] for t in ts}
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}; {rounds} rounds")
    print("| figure | " + " | ".join(ts) + " |")
    print("|---|" + "---|" * len(ts))
    print("| empty script, CPU s | " + " | ".join(median_range(cpu[t]) for t in ts) + " |")
    print("| start-up over plain, CPU s | " + " | ".join(median_range(over[t]) for t in ts) + " |")
    if "pyinstrument" in ts:
        print("| over pyinstrument's (same round), x | " + " | ".join(
            median_range([x / max(1e-9, p) for x, p in zip(over[t], over["pyinstrument"])], 1, "{:.2f}")
            if t != "plain" else "-" for t in ts) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--fib", type=int, default=36,
                    help="fib(N) for the proportional cost (36: ~2.3 s of CPU here; below ~1 s, what a run costs once"
                         " for having a call tree at all, ~17 ms of the supervisor's, shows as a share)")
    ap.add_argument("--boot-runs", type=int, default=40)
    ap.add_argument("--base", type=Path, help="another checkout of energyprof, measured in the same rounds")
    ap.add_argument("--breakdown", type=float, metavar="S", help="CPU per second of a run, by process (see above)")
    ap.add_argument("--startup", action="store_true",
                    help="the empty script only: start-up CPU over plain python's, and over pyinstrument's")
    ap.add_argument("--energyprof-args", default="", help="flags for every energyprof run, one string (e.g. other intervals)")
    a = ap.parse_args()
    # What pip does at install: every module compiled once (with PYTHONDONTWRITEBYTECODE set,
    # a source checkout would otherwise compile all of energyprof in every run and process). Forced: compileall
    # takes a .pyc as fresh by its source's modification second alone, the import system by its size too, so a
    # file edited within the second of its last compile was compiled again in every run (6 ms for record.py).
    for tree in (REPO, *([a.base.resolve()] if a.base else [])):
        subprocess.run([sys.executable, "-m", "compileall", "-f", "-q", str(tree / "energyprof")], check=True,
                       stdout=subprocess.DEVNULL)
    work = Path(tempfile.mkdtemp(prefix="energyprof-cost-"))
    env = dict(os.environ, PYTHONPATH=str(REPO) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
    env.pop("ENERGYPROF_AGENT", None)
    env["BENCH_OWN"] = str(work / "own.txt")
    envs = {"energyprof (base)": dict(env, PYTHONPATH=str(a.base.resolve()) + env["PYTHONPATH"][len(str(REPO)):])} \
        if a.base else {}
    # The empty script writes its own CPU too (fib(0)): "in the program" is then what the agent adds
    # while the program works, its start and end (the same for any script) taken off.
    (work / "empty.py").write_text(FIB.format(n=0))
    (work / "fib.py").write_text(FIB.format(n=a.fib))
    (work / "parent.py").write_text(PARENT.format(script="fib.py"))
    # A child that does nothing: what following a child costs once (its bootstrap, its agent's start
    # and end, its stream and its rows in the report) is not a share of the program's CPU.
    (work / "parent0.py").write_text(PARENT.format(script="empty.py"))
    ts = tools(work, a.base)
    extra = a.energyprof_args.split()
    for name in ts:
        if name.startswith("energyprof"):
            ts[name] = [*ts[name], *extra]
    if a.startup:
        try:
            startup(work, ts, env, envs, a.rounds)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    if a.breakdown is not None:
        try:
            breakdown(work, env, a.rounds, a.breakdown, a.fib, extra)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    cpu: dict[tuple[str, str], list[float]] = {}
    boot: list[float] = []
    own: dict[tuple[str, str], list[float]] = {}
    main_cpu: dict[tuple[str, str], list[float]] = {}  # the program's main thread (the child's, for a parent)
    try:
        for r in range(a.rounds):
            names = list(ts)
            names = names[r % len(names):] + names[:r % len(names)]  # rotate the order each round
            for script in ("empty.py", "fib.py", "parent0.py", "parent.py"):
                for name in names:
                    # py-spy exits 1 when the program ends before it attached (an empty script): its CPU counts all the same
                    cpu.setdefault((name, script), []).append(cpu_of([*ts[name], script], work, envs.get(name, env),
                                                                      name != "py-spy"))
                    process, main = last_own(work)
                    if script in ("empty.py", "fib.py"):
                        own.setdefault((name, script), []).append(process)
                    main_cpu.setdefault((name, script), []).append(main)
            boot.append(bootstrap_ms(work, env, a.boot_runs))
            print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{t} {s} {v[-1]:.3f}" for (t, s), v in cpu.items())
                  + f", bootstrap {boot[-1]:.1f} ms", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    n = a.rounds
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    print(f"rounds: {n}; fib({a.fib}); medians [min-max] over the rounds; CPU seconds, whole process tree")
    print()
    print(f"| figure | {' | '.join(ts)} |")
    print("|---|" + "---|" * len(ts))
    for script, label in (("empty.py", "empty script, CPU s"), ("fib.py", f"fib({a.fib}) in the main process, CPU s"),
                          ("parent.py", f"fib({a.fib}) in a followed child, CPU s")):
        print(f"| {label} | " + " | ".join(median_range(cpu[(t, script)]) for t in ts) + " |")
    plain_empty = cpu[("plain", "empty.py")]
    print("| fixed cost (empty script) over plain, CPU s | " + " | ".join(
        median_range([x - y for x, y in zip(cpu[(t, "empty.py")], plain_empty)]) for t in ts) + " |")
    print("| a followed child's start and end (it runs fib(0)) over plain, CPU ms | " + " | ".join(
        median_range([(c0 - e) - (pc0 - pe) for c0, e, pc0, pe in zip(
            cpu[(t, "parent0.py")], cpu[(t, "empty.py")], cpu[("plain", "parent0.py")], plain_empty)], 1e3, "{:.1f}")
        for t in ts) + " |")
    for script, empty, label in WORK_AND_NOTHING:
        base, plain0 = cpu[("plain", script)], cpu[("plain", empty)]
        shares = {t: [share((x - e) - (b - pe), b - pe) for x, e, b, pe in
                      zip(cpu[(t, script)], cpu[(t, empty)], base, plain0)] for t in ts}
        print(f"| proportional cost, {label}, % of the program's CPU | "
              + " | ".join(median_range(shares[t], 100, "{:.1f}") for t in ts) + " |")
    for script, empty, label in WORK_AND_NOTHING:
        # Everything but the program's main thread, from the same run: the supervisor, the agent's
        # threads, the report. Measured inside each run, so the program's own run-to-run swing
        # (a few % of its CPU on this guest, as big as the budget) cancels instead of landing in it.
        def outside(t: str, s: str) -> list[float]:
            return [c - m for c, m in zip(cpu[(t, s)], main_cpu[(t, s)])]
        plain_work = [m - m0 for m, m0 in zip(main_cpu[("plain", script)], main_cpu[("plain", empty)])]
        print(f"| proportional cost, {label}, measured inside each run: CPU outside the program's main thread,"
              " over the same for the do-nothing run and over plain python's, % of the program's CPU | "
              + " | ".join(median_range([share((o - o0) - (p - p0), w) for o, o0, p, p0, w in zip(
                  outside(t, script), outside(t, empty), outside("plain", script), outside("plain", empty), plain_work)],
                  100, "{:.1f}") for t in ts) + " |")
    print("| the program's main thread: its CPU over plain python's (the do-nothing run's taken off), main process, % | "
          + " | ".join(median_range([share((m - m0) - (p - p0), p - p0) for m, m0, p, p0 in zip(
              main_cpu[(t, "fib.py")], main_cpu[(t, "empty.py")], main_cpu[("plain", "fib.py")],
              main_cpu[("plain", "empty.py")])], 100, "{:.1f}") for t in ts) + " |")
    plain_own = [f - e for f, e in zip(own[("plain", "fib.py")], own[("plain", "empty.py")])]
    print("| in the program: its own process's CPU over plain python's (empty script's taken off), main process, % | "
          + " | ".join(median_range([share((f - e) - b, b) for f, e, b in zip(own[(t, "fib.py")], own[(t, "empty.py")],
                                                                           plain_own)], 100, "{:.1f}")
                       for t in ts) + " |")
    rest = " - |" * (len(ts) - 2)  # this checkout's figures only
    print(f"| one agent sample in-process, CPU us (two threads, a flush every fourth) | - | {per_sample_us():.1f} |" + rest)
    print(f"| a Python child's bootstrap, CPU ms (median of {a.boot_runs} pairs a round) | - | "
          + median_range(boot, 1, "{:.1f}") + " |" + rest)


if __name__ == "__main__":
    main()
