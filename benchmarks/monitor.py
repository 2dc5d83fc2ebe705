"""The cost of one window: Monitor's begin_window + end_window, against an empty `with` block
and against an in-process Profiler's window (which waits for its energy to be charged).

    python benchmarks/monitor.py            # 3000 Monitor windows per sensor set, 40 Profiler windows
    python benchmarks/monitor.py --quick    # a few hundred: the smoke run

Each figure is the median (with the 10th and 90th percentiles) of one window's cost in
microseconds, measured with perf_counter_ns around begin + end of an empty window, on
whatever else the machine is doing: medians, not extremes. A Measurement's figures are worked
out at their first read: the "read at once" rows pay that too.

Back to back, the windows share their reads of /proc/stat (the machine's busy CPU, which moves in
10 ms ticks: a read less than 1 ms old is reused) and of each RAPL zone (a reading less than 0.5 ms
old, half the counter's update); the "2 ms apart" rows pay those reads at each edge, as the steps
of a training loop do.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from energyprof import Monitor, Profiler  # noqa: E402


def fake_rapl(root: Path) -> None:
    """A powercap tree like a real one (a package and a dram zone), for the read cost of sysfs-like files."""
    for name, label in (("intel-rapl:0", "package-0"), ("intel-rapl:0:0", "dram")):
        z = root / name
        z.mkdir(parents=True)
        (z / "name").write_text(label + "\n")
        (z / "energy_uj").write_text("123456789\n")
        (z / "max_energy_range_uj").write_text("262143328850\n")


def timed(n: int, one: Callable[[], Any], gap_s: float = 0.0) -> list[float]:
    out = []
    for _ in range(n):
        if gap_s:
            time.sleep(gap_s)
        t = time.perf_counter_ns()
        one()
        out.append((time.perf_counter_ns() - t) / 1e3)
    return out


def row(label: str, us: list[float]) -> str:
    q = statistics.quantiles(us, n=10)
    return f"| {label} | {statistics.median(us):.1f} | {q[0]:.1f} - {q[-1]:.1f} | {len(us)} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n, n_prof = (300, 5) if args.quick else (3000, 40)
    print(f"python {platform.python_version()}, {os.cpu_count()} logical CPUs, load {os.getloadavg()[0]:.1f}")
    print("| window | median us | p10 - p90 us | windows |\n|---|---|---|---|")

    @contextlib.contextmanager
    def nothing() -> Any:
        yield

    def empty() -> None:
        with nothing():
            pass

    print(row("empty `with` (reference)", timed(n, empty)))
    print(row("empty `with` (reference), 2 ms apart", timed(n // 10, empty, 0.002)))
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "t.csv"
        trace.write_text("t_s,cpu\n0,40\n")
        rapl = Path(tmp) / "powercap"
        fake_rapl(rapl)
        setups = [("Monitor, replayed trace", dict(power_trace=str(trace))),
                  ("Monitor, model (estimated cpu + ram)", dict(powercap_root=str(Path(tmp) / "none"), gpus=False)),
                  ("Monitor, RAPL files (package + dram)", dict(powercap_root=str(rapl), gpus=False))]
        for label, kw in setups:
            with Monitor(**kw) as mon:
                def one(mon: Monitor = mon) -> None:
                    with mon.window("w"):
                        pass
                timed(n // 10, one)  # warm-up
                print(row(label, timed(n, one)))
                def begin_end(mon: Monitor = mon) -> None:
                    mon.begin_window("w")
                    mon.end_window("w")
                print(row(label + ", begin/end_window", timed(n, begin_end)))
                print(row(label + ", begin/end_window, 2 ms apart", timed(n // 10, begin_end, 0.002)))

                def read(mon: Monitor = mon) -> None:
                    with mon.window("w") as m:
                        pass
                    m.total_j  # noqa: B018 - the first read works the window's account out

                print(row(label + ", read at once", timed(n, read)))
        prof = Profiler(power_trace=str(trace), quiet=True).start()
        try:
            def pw() -> None:
                with prof.window("w"):
                    pass

            def pw_read() -> None:
                with prof.window("w") as m:
                    pass
                m.total_j  # noqa: B018 - the first read waits until the ledger has charged the window

            print(row("Profiler.window, Measurement not read", timed(n, pw)))
            print(row("Profiler.window, read at once (waits for the ledger)", timed(n_prof, pw_read)))
        finally:
            prof.stop()


if __name__ == "__main__":
    main()
