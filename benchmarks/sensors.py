"""Each sensor backend's own CPU cost per reading, in the profiler's process.

    python benchmarks/sensors.py            # 2000 readings per backend (~15 s)
    python benchmarks/sensors.py --quick    # 200: the smoke run

A reading's cost is the CPU time (`time.thread_time_ns`, this thread only: what the collector
thread spends) of one `read()`; for the backends that read a child tool, also the CPU time
their reader thread spends parsing one record (the tool itself runs in its own process). Where
there is no such hardware here, the backend reads what the tests read: a fake powercap tree
(real file reads), a software perf event through the real perf_event_open (a real syscall),
the privileged reader over a real Unix socket, the injected amdsmi binding (energyprof's own
code only), stand-in tools' recorded records. Medians with the 10th and 90th percentiles,
measured on whatever else the machine is doing. The budget is 1 ms of the profiler's CPU
per reading.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from energyprof.collect.sensors import estimate, perf, rapl, served  # noqa: E402
from energyprof.collect.sensors.gpu import amdsmi  # noqa: E402
from energyprof.collect.sensors.soc import macmon, powermetrics, rails, tegrastats  # noqa: E402
from monitor import fake_rapl  # noqa: E402  (benchmarks/monitor.py: the same fake powercap tree)
from sensor_standins import env_for, install, load_module  # noqa: E402  (tests/: the stand-ins the tests use)

FIX = ROOT / "tests" / "fixtures" / "sensors"
BUDGET_US = 1000.0


def cost_us(call: Callable[[], Any], n: int) -> tuple[float, float, float]:
    """(median, p10, p90) CPU microseconds of one call, over n calls."""
    samples = []
    for _ in range(n):
        t = time.thread_time_ns()
        call()
        samples.append((time.thread_time_ns() - t) / 1000)
    samples.sort()
    return statistics.median(samples), samples[n // 10], samples[(9 * n) // 10]


def reads(sensors: list[Any]) -> Callable[[], None]:
    t0 = time.perf_counter_ns()
    for s in sensors:
        s.start(t0)

    def call() -> None:
        t = time.perf_counter_ns()
        for s in sensors:
            s.read(t)
    return call


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    n = 200 if ap.parse_args().quick else 2000
    rows: list[tuple[str, str, tuple[float, float, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        fake_rapl(tmpd / "powercap")
        found = rapl.discover(str(tmpd / "powercap"))
        rows.append(("rapl", "read() of cpu + dram (two sysfs reads)", cost_us(reads(found.sensors), n)))

        pmu = tmpd / "power" / "events"
        pmu.mkdir(parents=True)
        (tmpd / "power" / "type").write_text("1\n")  # a software event: the same syscall and read path
        (tmpd / "power" / "cpumask").write_text("0\n")
        (pmu / "energy-pkg").write_text("event=0x00\n")
        (pmu / "energy-pkg.scale").write_text("1e-9\n")
        found_perf = perf.discover(str(tmpd / "power"), explicit=True)
        if found_perf.sensors:
            rows.append(("perf", "read() of one perf event fd", cost_us(reads(found_perf.sensors), n)))
        else:
            print("perf: skipped:", "; ".join(found_perf.notes))

        sock = tmpd / "rapl.sock"
        server = subprocess.Popen([sys.executable, "-m", "energyprof", "sensors", "serve", "--socket", str(sock),
                                   "--powercap-root", str(tmpd / "powercap")], stderr=subprocess.PIPE, cwd=ROOT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            server.stderr.readline()  # type: ignore[union-attr]
            found_served = served.discover(str(sock))
            rows.append(("rapl via `sensors serve`", "read() of cpu + dram: one socket round trip",
                         cost_us(reads(found_served.sensors), n)))
            for s in found_served.sensors:
                s.close()
        finally:
            server.terminate()
            server.wait()

        os.environ["FAKE_AMDSMI_GPUS"] = json.dumps([{"bdf": "0000:03:00.0", "name": "fake", "watts": 100.0},
                                                     {"bdf": "0000:04:00.0", "name": "fake", "watts": 100.0,
                                                      "counter": "none"}])
        fake = load_module("fake_amdsmi")
        found_amd = amdsmi.discover(fake, env={}, check_s=0.05, explicit=True)
        rows.append(("amdsmi (injected binding)", "read() of one counter GPU and one polled GPU: energyprof's code only",
                     cost_us(reads(found_amd.sensors), n)))

        model = estimate.discover(65.0)
        rows.append(("model", "read() of cpu + ram (reads /proc/stat)", cost_us(reads(model.sensors), n)))

    line = [ln.split("\t", 1)[1] for ln in (FIX / "tegrastats_tx2_l4t32.txt").read_text().splitlines()][0]
    rows.append(("tegrastats, parsing", "one line to sources (reader thread)",
                 cost_us(lambda: rails.sources_watts(rails.parse_line(line)), n)))
    doc = (FIX / "powermetrics_macos14.plist").read_bytes().split(b"\0")[0]
    rows.append(("powermetrics, parsing", "one plist document (reader thread)",
                 cost_us(lambda: list(powermetrics.parse_plist(iter([doc + b"\0"]))), n)))
    mac_line = (FIX / "macmon.jsonl").read_text().splitlines()[0]
    rows.append(("macmon, parsing", "one JSON line (reader thread)", cost_us(lambda: macmon.reading(json.loads(mac_line)), n)))
    text = (FIX / "powermetrics_macos14.txt").read_bytes()
    block = b"*** Sampled" + text.split(b"*** Sampled")[1]
    rows.append(("powermetrics, parsing", "one text sample (reader thread)",
                 cost_us(lambda: list(powermetrics.parse_text(iter([block]))), n)))


    with tempfile.TemporaryDirectory() as tmp:
        bin_dir = Path(tmp) / "bin"
        install(bin_dir, "tegrastats")
        os.environ.update(env_for(bin_dir, "tegrastats_orin_nano_jp6.txt", "tegrastats"))
        found_tegra = tegrastats.discover(explicit=True)
        rows.append(("tegrastats", "read() of every rail: a lookup, the tool runs in its own process",
                     cost_us(reads(found_tegra.sensors), n)))
        for s in found_tegra.sensors:
            s.close()
    for s in found.sensors + found_perf.sensors + found_amd.sensors + model.sensors:
        s.close()

    print(f"# {platform.node()} {platform.machine()} Python {platform.python_version()}, {n} readings each")
    print(f"{'backend':<28} {'median us':>9} {'p10':>7} {'p90':>7}  what")
    for name, what, (med, lo, hi) in rows:
        flag = "" if med < BUDGET_US else "  OVER BUDGET"
        print(f"{name:<28} {med:>9.1f} {lo:>7.1f} {hi:>7.1f}  {what}{flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
