"""A synthetic one-hour run fed through the Ledger: memory, attribution time, report time.

    python benchmarks/longrun.py            # 1 h (3.6 M samples) and 10 h (36 M samples)
    python benchmarks/longrun.py --scale 0.01 --no-10x     # a few seconds, for CI

The events take the collector's code path: samples are folded with `Ledger.add_sample`
before each sensor tick (`Ledger.add_tick`), as `Collector.tick` drains its queue, then
`Ledger.finish`, `build_profile`, and the HTML renderer. Nothing is materialised: the
stream is generated lazily, one tick's worth of samples at a time, so the process holds
only what energyprof itself keeps.

The stream (one hour at scale 1):
* 3.6 M main-thread samples, back to back, 1 ms +- 25 us each (a 1 kHz sampler), each
  with 70-100 % of its wall time as CPU time;
* 360,000 ticks, 10 ms apart with jitter: two sources (cpu package, dram) whose power
  drifts between 20 and 65 W, process and machine CPU clocks (the machine's in /proc/stat
  10 ms steps), RSS that wanders up and down;
* 5,000 distinct stacks, 4 to 40 frames deep, made as paths of one random call tree (they
  share prefixes, like a real program's), over about 2,000 distinct frames;
* locality: a stack persists for a geometric run of samples (mean 20 ms); the next one is
  a neighbour of the current one in the tree order half the time (a phase of the
  program), one of 50 hot stacks a third of the time, otherwise any of the 5,000 (so every
  stack occurs).

Each size runs in a fresh subprocess so its added RSS is its own. Added RSS = peak RSS
(VmHWM, reset through /proc/self/clear_refs when allowed) minus RSS just before the run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from energyprof.core.ledger import Ledger  # noqa: E402
from energyprof.core.tree import build_profile  # noqa: E402
from energyprof.core.recording import Frame, Sample, StackTable, Tick  # noqa: E402

HOUR_SAMPLES = 3_600_000
HOUR_TICKS = 360_000
N_STACKS = 5_000
SAMPLE_NS = 1_000_000
TICK_NS = 10_000_000
SOURCES = [
    {"id": "cpu", "component": "cpu", "method": "measured", "sensor": "rapl", "detail": {}},
    {"id": "dram", "component": "dram", "method": "measured", "sensor": "rapl", "detail": {}},
]
TARGETS = {"added_rss_mb": 150.0, "attribution_s": 10.0, "report_s": 3.0, "memory_ratio_10x": 2.0}


# -- the synthetic program ------------------------------------------------------------------
def make_stacks(table: StackTable, n: int, rng: random.Random) -> list[int]:
    """`n` distinct stacks as paths of one random call tree, in depth-first-ish order."""
    modules = [f"/srv/app/pkg{m}/mod{m % 7}.py" for m in range(60)]
    frames: list[Frame] = [(f"func_{i}", modules[i % len(modules)], 10 + (i * 37) % 900) for i in range(2000)]
    stacks: list[tuple[Frame, ...]] = [(frames[0],)]
    seen = {stacks[0]}
    while len(stacks) < n:
        parent = stacks[-1] if rng.random() < 0.6 else rng.choice(stacks)
        if len(parent) >= 40:
            parent = parent[: rng.randint(4, 12)]
        child = parent + (rng.choice(frames),)
        if len(child) < 4:
            child = child + tuple(rng.choice(frames) for _ in range(4 - len(child)))
        if child not in seen:
            seen.add(child)
            stacks.append(child)
    return [table.intern(list(s)) for s in stacks]


def stream(n_samples: int, n_ticks: int, sids: list[int], seed: int = 1) -> Iterator[tuple[list[Sample], Tick]]:
    """One tick's worth of samples, then the tick; lazily, so nothing grows with run time."""
    rng = random.Random(seed)
    rand = rng.random
    n = len(sids)
    hot = [sids[rng.randrange(n)] for _ in range(50)]
    per_tick = max(1, n_samples // n_ticks)
    sample_ns = TICK_NS // per_tick if per_tick > 1 else SAMPLE_NS
    idx = 0
    cur = sids[0]
    t = 1_000_000_000  # the shared clock starts somewhere arbitrary
    t_sample = t
    energy = [0.0, 0.0]
    power = [35.0, 4.0]
    proc = own = busy = 0
    busy_exact = 0
    rss = 300 << 20
    emitted = 0
    for k in range(n_ticks + 1):
        t_tick = t + k * TICK_NS + (int(rand() * 200_000) if k else 0)
        chunk: list[Sample] = []
        while emitted < n_samples and t_sample + sample_ns <= t_tick:
            t1 = t_sample + sample_ns + int((rand() - 0.5) * 50_000)
            if rand() > 0.95:  # end of a run of the same stack
                r = rand()
                if r < 0.5:
                    idx = min(n - 1, max(0, idx + int(rand() * 17) - 8))
                    cur = sids[idx]
                elif r < 0.83:
                    cur = hot[int(rand() * 50)]
                else:
                    idx = int(rand() * n)
                    cur = sids[idx]
            dt = t1 - t_sample
            chunk.append(Sample(t_sample, t1, cur, int(dt * (0.7 + 0.3 * rand())), True))
            proc += dt
            t_sample = t1
            emitted += 1
        if k:
            power[0] = min(65.0, max(20.0, power[0] + (rand() - 0.5) * 2.0))
            power[1] = min(8.0, max(2.0, power[1] + (rand() - 0.5) * 0.2))
            energy[0] += power[0] * TICK_NS / 1e9
            energy[1] += power[1] * TICK_NS / 1e9
            own += int(rand() * 200_000)
            busy_exact += TICK_NS + int(rand() * 4_000_000)
            busy = busy_exact // 10_000_000 * 10_000_000  # /proc/stat counts in 10 ms ticks
            rss = max(100 << 20, rss + int((rand() - 0.5) * (2 << 20)))
        yield chunk, Tick(t_tick, (energy[0], energy[1]), proc + own, own, max(busy, proc + own), rss, 0, None)


# -- one measured run (child process) ---------------------------------------------------
def rss_now() -> int:
    with open("/proc/self/statm", "rb") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_peak() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return rss_now()


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def measure(n_samples: int, n_ticks: int, render: bool) -> dict[str, float | int | bool | str]:
    """Feed one run through a Ledger and report times and memory (run in a fresh process)."""
    from energyprof.analysis.report import build  # imported before the baseline
    from energyprof.render import html as html_mod
    from energyprof.render import page  # noqa: F401 - the renderer's import, also before the baseline

    gc.collect()
    peak_reset = reset_peak()
    base = rss_now()
    table = StackTable()
    sids = make_stacks(table, N_STACKS, random.Random(0))
    ledger = Ledger(SOURCES, table, cpus=2)
    add_sample, add_tick = ledger.add_sample, ledger.add_tick
    fold = 0.0
    clock = time.perf_counter
    samples = 0
    for chunk, tick in stream(n_samples, n_ticks, sids):
        t0 = clock()
        for s in chunk:
            add_sample(s)
        add_tick(tick)
        fold += clock() - t0
        samples += len(chunk)
    t0 = clock()
    ledger.finish()
    fold += clock() - t0
    rss_after_fold = rss_now()
    t0 = clock()
    profile = build_profile(ledger, "share", {"target": "longrun.py"})
    t_build = clock() - t0
    peak_before_render = rss_peak() if peak_reset else rss_now()
    t_render = 0.0
    html_bytes = 0
    render_error = ""
    if render:
        t0 = clock()
        try:
            html_bytes = len(html_mod.render_html(build(profile)).encode())
        except Exception as exc:  # noqa: BLE001 - the renderer is being rewritten; report, do not die
            render_error = f"{type(exc).__name__}: {exc}"
        t_render = clock() - t0
    peak = rss_peak() if peak_reset else max(rss_now(), rss_after_fold)
    total = sum(profile.totals["energy_j"].values())
    attributed = sum(profile.root.energy_j.values())
    return {
        "samples": samples, "ticks": n_ticks, "stacks": len(ledger.stats),
        "attribution_s": fold, "build_profile_s": t_build, "render_html_s": t_render,
        "report_s": t_build + t_render, "html_bytes": html_bytes, "render_error": render_error,
        "added_rss_mb": (peak - base) / 2**20, "rss_after_fold_mb": (rss_after_fold - base) / 2**20,
        "added_rss_before_render_mb": (peak_before_render - base) / 2**20,
        "peak_reset": peak_reset, "conservation_error_j": abs(total - attributed), "energy_j": total,
    }


def child(n_samples: int, n_ticks: int, render: bool) -> dict[str, float | int | bool | str]:
    cmd = [sys.executable, __file__, "--child", str(n_samples), str(n_ticks)] + ([] if render else ["--no-render"])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"longrun child failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def show(label: str, r: dict[str, float | int | bool | str]) -> None:
    print(f"{label}: {r['samples']:,} samples, {r['ticks']:,} ticks, {r['stacks']:,} stacks")
    print(f"  attribution (add_sample/add_tick/finish): {r['attribution_s']:.2f} s "
          f"({float(r['attribution_s']) / max(1, int(r['samples'])) * 1e6:.2f} us per sample)")
    print(f"  report: build_profile {r['build_profile_s']:.2f} s + render_html {r['render_html_s']:.2f} s "
          f"= {r['report_s']:.2f} s ({int(r['html_bytes']) / 2**20:.1f} MB of HTML)")
    if r["render_error"]:
        print(f"  render_html failed: {r['render_error']}")
    print(f"  added RSS: {r['added_rss_mb']:.1f} MB peak; {r['added_rss_before_render_mb']:.1f} MB peak before"
          f" the renderer; {r['rss_after_fold_mb']:.1f} MB held after the fold"
          + ("" if r["peak_reset"] else " [peak not resettable: RSS at the end]"))
    print(f"  conservation: |total - attributed| = {r['conservation_error_j']:.2e} J of {r['energy_j']:.0f} J")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--child":
        print(json.dumps(measure(int(args[1]), int(args[2]), "--no-render" not in args)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the one-hour run (default 1)")
    ap.add_argument("--no-10x", dest="tenx", action="store_false", help="skip the ten-times-the-samples run")
    ns = ap.parse_args(args)
    n_samples = max(100, int(HOUR_SAMPLES * ns.scale))
    n_ticks = max(10, int(HOUR_TICKS * ns.scale))
    try:
        load = os.getloadavg()[0]
        print(f"machine load average (1 min): {load:.1f} on {os.cpu_count()} logical CPUs")
    except (AttributeError, OSError):
        pass
    print(f"synthetic run: {n_samples:,} samples over {N_STACKS:,} stacks, {n_ticks:,} sensor ticks "
          f"({n_ticks * TICK_NS / 3.6e12:.2f} h at 100 Hz sensors, 1 kHz samples)")
    one = child(n_samples, n_ticks, render=True)
    show("1x", one)
    ok = [
        ("added RSS", float(one["added_rss_mb"]), TARGETS["added_rss_mb"], "MB"),
        ("attribution", float(one["attribution_s"]), TARGETS["attribution_s"], "s"),
        ("report build", float(one["report_s"]), TARGETS["report_s"], "s"),
    ]
    if ns.tenx:
        ten = child(n_samples * 10, n_ticks * 10, render=True)
        show("10x", ten)
        ratio = float(ten["added_rss_mb"]) / max(1e-9, float(one["added_rss_mb"]))
        print(f"memory ratio 10x / 1x: {ratio:.2f}")
        ok.append(("10x memory ratio", ratio, TARGETS["memory_ratio_10x"], "x"))
    print("targets (scale 1 only):")
    for name, value, limit, unit in ok:
        verdict = "met" if value < limit else "MISSED"
        print(f"  {name}: {value:.2f} {unit} (target < {limit:g} {unit}) {verdict if ns.scale == 1 else 'n/a'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
