"""A ledger saved and restored: what a checkpoint holds, so that a killed run's profile can be built
later (`energyprof report` on the checkpoint). The keys are those checkpoints have always had.

The ledger's companion, in the same package: it reads and sets the fold's held state (ticks and samples
still waiting, the watermark) as the ledger itself would; nothing outside core/ does."""

from __future__ import annotations

from typing import Any

from ..facts.policy import PolicyPair
from .ledger import Ledger
from .recording import Sample, StackTable, Tick
from .tallies import ProcessTally, StackTally, WindowTally
from .timeline import MIN_WIDTH_NS


def save(led: Ledger) -> dict[str, Any]:
    """Everything needed to finish the profile later (a checkpoint), as JSON-able data."""
    return {
        "sources": led.sources,
        "stacks": led.stacks.to_state(),
        "share_window_ns": led.share_window_ns,
        "cpus": led.cpus,
        "stats": {str(k): [v.time_ns, v.cpu_ns, v.samples, v.peak_rss, v.rss_growth, v.share, v.all,
                           v.alloc_bytes] for k, v in led.stats.items()},
        # the keys checkpoints have always had: each policy's list under its own name
        "acc": {"total": led.total, "idle": led.idle.share, "idle_all": led.idle.all, "own_share": led.own.share,
                "own_all": led.own.all, "root_share": led.root.share, "root_all": led.root.all},
        "timeline": {k: getattr(led.timeline, k)
                     for k in ("width_ns", "origin_ns", "t0", "t1", "energy", "program", "rss")}
        | {"stacks": [{str(k): v for k, v in b.items()} for b in led.timeline.stacks]},
        "windows": [w.to_state() for w in led.all_windows()],
        "ticks": [list(t[:7]) + [t.gpu_share, t.peers_cpu_ns] for t in led._ticks],
        "first_tick": list(led.first_tick[:7]) + [led.first_tick.gpu_share, led.first_tick.peers_cpu_ns]
        if led.first_tick else None,
        "node_ranks": led.node_ranks,
        "start_rss": led.start_rss,
        "anomalies": led.anomalies,
        "child_sid": {str(k): v for k, v in led._child_sid.items()},
        # samples still waiting for their intervals, and the per-process figures
        "pending": [list(p) for p in led._pending],
        "watermark": led._watermark,
        "procs": {str(k): [v.share, v.all, v.cpu_ns, v.peak_rss, v.last_rss, v.last_sid]
                  for k, v in led.procs.items()},
        "sid_proc": {str(k): v for k, v in led.sid_proc.items()},
        "process_info": {str(k): v for k, v in led.process_info.items()},
        "thread_counts": {str(k): sorted(v.items()) for k, v in led.thread_counts.items()},
        "gpu_procs": sorted(led.gpu_procs),
    }


def restore(state: dict[str, Any]) -> Ledger:
    """A ledger as `save` left it (a checkpoint's), ready to fold on or to build the profile from."""
    led = Ledger(state["sources"], StackTable.from_state(state["stacks"]), int(state["share_window_ns"]),
              cpus=int(state.get("cpus", 1)))
    for k, v in state["stats"].items():
        led.stats[int(k)] = StackTally(int(v[0]), int(v[1]), int(v[2]), int(v[3]), float(v[4]),
                                       [float(x) for x in v[5]], [float(x) for x in v[6]],
                                       float(v[7]) if len(v) > 7 else 0.0)
    acc = {k: [float(x) for x in v] for k, v in state["acc"].items()}
    z = [0.0] * led.n
    led.total = acc.get("total", list(z))
    led.idle = PolicyPair(acc.get("idle", list(z)), acc.get("idle_all", list(z)))
    led.own = PolicyPair(acc.get("own_share", list(z)), acc.get("own_all", list(z)))
    led.root = PolicyPair(acc.get("root_share", list(z)), acc.get("root_all", list(z)))
    tl = state["timeline"]
    led.timeline.width_ns, led.timeline.t0, led.timeline.t1 = tl["width_ns"] or MIN_WIDTH_NS, tl["t0"], tl["t1"]
    led.timeline.energy, led.timeline.rss = tl["energy"], tl["rss"]
    led.timeline.origin_ns = tl.get("origin_ns", tl["t0"][0] if tl["t0"] else None)
    led.timeline.program = tl.get("program") or [[0.0, 0.0] for _ in led.timeline.t0]
    led.timeline.stacks = [{int(k): float(v) for k, v in b.items()} for b in tl.get("stacks", [])] \
        or [{} for _ in led.timeline.t0]
    led.windows = [WindowTally.from_state(w, led.n) for w in state["windows"]]
    led.anomalies = dict(state.get("anomalies", {}))
    led._child_sid = {int(k): int(v) for k, v in state.get("child_sid", {}).items()}

    def tick(raw: list[Any]) -> Tick:
        return Tick(int(raw[0]), tuple(raw[1]), *(int(x) for x in raw[2:7]), raw[7],
                    int(raw[8]) if len(raw) > 8 else 0)

    if state.get("first_tick"):
        led.first_tick = tick(state["first_tick"])
    for raw in state["ticks"]:
        t = tick(raw)
        led._ticks.append(t)
        led._share_hist.append(t)
        led.last_tick = t
    led._pending = [Sample(*(bool(x) if i == 4 else int(x) for i, x in enumerate(p))) for p in state.get("pending", [])]
    led._watermark = int(state.get("watermark", -1))
    for k, v in state.get("procs", {}).items():
        led.procs[int(k)] = ProcessTally([float(x) for x in v[0]], [float(x) for x in v[1]], *(int(x) for x in v[2:6]))
    led.sid_proc = {int(k): int(v) for k, v in state.get("sid_proc", {}).items()}
    for sid in led.stats:
        led.sid_proc.setdefault(sid, 0)
        led.procs.setdefault(led.sid_proc[sid], ProcessTally([0.0] * led.n, [0.0] * led.n))
    led.process_info = {int(k): dict(v) for k, v in state.get("process_info", {}).items()}
    led.thread_counts = {int(k): {int(sid): int(n) for sid, n in v} for k, v in state.get("thread_counts", {}).items()}
    led.gpu_procs = {int(x) for x in state.get("gpu_procs", [])}
    led.node_ranks = state.get("node_ranks")
    led.start_rss = state.get("start_rss")
    live = [w for w in led.windows if not w.done]  # ended, its tail not yet charged: still live
    led._open_windows = [w for w in live if w.end_ns is None]
    led._live_windows = live
    # a unit's window still being charged goes to the book once it is; those kept before (the book's) stay listed
    led.windows = [w for w in led.windows if w.unit is None or w.done]
    return led

