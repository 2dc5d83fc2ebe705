"""Profiles built by hand for the report and export tests (a helper module, not a conftest).

Trees are written as nested `spec` tuples with self figures only; `build` fills in the inclusive
ones bottom-up, the same invariant attribution guarantees, so the tests depend on nothing but the
data model.
"""

from __future__ import annotations

from typing import Any

from energyprof.facts.profile import IDLE_NODE
from energyprof.facts.profile import SELF_NODE
from energyprof.facts.profile import Node
from energyprof.facts.profile import Profile

XSS_FUNCTION = "</script><script>window.pwned=1</script>"
XSS_FILE = "/tmp/<img src=x onerror=window.pwned=2>/evil.py"

# (function, file, self energy per source, self time, self samples, children)
Spec = tuple[str, str, dict[str, float], float, int, list]


def build(spec: Spec, line: int = 1) -> Node:
    function, file, self_e, self_t, self_n, children = spec
    kids = [build(c, line + 10 * (i + 1)) for i, c in enumerate(children)]
    node = Node(function=function, file=file, line=line if file else 0, self_time_s=self_t,
                self_cpu_time_s=self_t * 0.9, self_samples=self_n, self_energy_j=dict(self_e))
    node.children = kids
    node.time_s = self_t + sum(k.time_s for k in kids)
    node.cpu_time_s = node.self_cpu_time_s + sum(k.cpu_time_s for k in kids)
    node.samples = self_n + sum(k.samples for k in kids)
    energy = dict(self_e)
    for k in kids:
        for src, j in k.energy_j.items():
            energy[src] = energy.get(src, 0.0) + j
    node.energy_j = energy
    return node


def profile_from(root: Node, sources: list[dict[str, Any]], **extra: Any) -> Profile:
    """A Profile whose totals agree with its tree (energy = sum of self energies)."""
    energy = dict(root.energy_j)
    idle = {s["id"]: 0.0 for s in sources}
    own = {s["id"]: 0.0 for s in sources}
    for node, _ in root.walk():
        if node.function == IDLE_NODE:
            idle = dict(node.self_energy_j)
        if node.function == SELF_NODE:
            own = dict(node.self_energy_j)
    attributed = {k: v - idle.get(k, 0.0) - own.get(k, 0.0) for k, v in energy.items()}
    duration = max(root.time_s, 1e-9)
    meta = {"target": "example.py", "argv": ["example.py", "--epochs", "2"], "command": "example.py --epochs 2",
            "started_at": "2026-01-01T00:00:00+00:00", "duration_s": duration, "sampler": "threads",
            "idle_policy": "share", "interval_s": 0.005, "sensor_interval_s": 0.01, "energyprof_version": "0.1.0",
            "python": "3.11.7", "host": {"cpu_model": "Test CPU", "cores": 4, "platform": "Linux", "memory_bytes": 2**34},
            "sensor_notes": ["rapl: permission denied on energy_uj (fix: chmod o+r)"], "exit": {"status": "completed"}}
    meta.update(extra.pop("meta", {}))
    totals = {"energy_j": energy, "attributed_j": attributed, "energyprof_j": own, "idle_j": idle,
              "duration_s": duration, "cpu_time_s": root.cpu_time_s, "energyprof_cpu_time_s": 0.001}
    totals.update(extra.pop("totals", {}))
    return Profile(meta=meta, sources=sources, totals=totals, root=root, **extra)


CPU = {"id": "cpu", "component": "cpu", "method": "measured", "sensor": "rapl", "detail": {"zone": "package-0"}}
GPU = {"id": "gpu:0", "component": "gpu:0", "method": "estimated", "sensor": "model", "detail": "TDP 70 W"}
STDLIB = "/usr/lib/python3.11/json/encoder.py"
SITE = "/venv/lib/python3.11/site-packages/numpy/core/fromnumeric.py"


def small_profile() -> Profile:
    """Two sources, library frames, a user callback under a library frame, windows, RSS."""
    e = lambda c, g=0.0: {"cpu": c, "gpu:0": g}  # noqa: E731
    spec: Spec = ("example.py", "", e(0.0), 0.0, 0, [
        ("<module>", "example.py", e(0.1), 0.01, 1, [
            ("train", "example.py", e(0.5, 2.0), 0.1, 10, [
                ("forward", "model.py", e(3.0, 6.0), 0.6, 60, []),
                ("dumps", STDLIB, e(0.2), 0.05, 5, [
                    ("default", "example.py", e(0.4), 0.05, 5, []),
                ]),
                ("sum", SITE, e(1.0), 0.2, 20, [
                    ("callback", "example.py", e(0.3), 0.03, 3, []),
                ]),
            ]),
            ("fib", "example.py", e(0.2), 0.02, 2, [("fib", "example.py", e(0.4), 0.04, 4, [])]),
        ]),
        (SELF_NODE, "", e(0.05), 0.0, 0, []),
        (IDLE_NODE, "", e(2.0, 1.0), 0.0, 0, []),
    ])
    root = build(spec)
    n = 20
    d = root.time_s / n
    timeline = {"t_s": [d * (i + 0.5) for i in range(n)], "start_s": [d * i for i in range(n)],
                "end_s": [d * (i + 1) for i in range(n)],
                "power_w": {"cpu": [10.0 + i % 5 for i in range(n)], "gpu:0": [20.0 + (i % 3) for i in range(n)]},
                "program_w": {"share": [15.0 + i % 4 for i in range(n)], "all": [25.0 + i % 4 for i in range(n)]},
                "rss_bytes": [100 * 2**20 + i * 2**20 for i in range(n)]}
    windows = [{"name": "epoch 0", "index": 0, "depth": 0, "start_s": 0.0, "end_s": root.time_s / 2,
                "time_s": root.time_s / 2, "energy_j": {"cpu": 1.0}},
               {"name": "epoch 1", "index": 1, "depth": 0, "start_s": root.time_s / 2, "end_s": root.time_s,
                "time_s": root.time_s / 2, "energy_j": {"cpu": 1.0}}]
    return profile_from(root, [CPU, GPU], timeline=timeline, windows=windows,
                        totals={"peak_rss_bytes": 120 * 2**20, "baseline_rss_bytes": 100 * 2**20})


def hostile_profile() -> Profile:
    """Program strings that are HTML and script: they must come out as text everywhere."""
    spec: Spec = ("<b>target</b>", "", {"cpu": 0.0}, 0.0, 0, [
        ("<module>", "x.py", {"cpu": 0.1}, 0.01, 1, [
            (XSS_FUNCTION, XSS_FILE, {"cpu": 2.0}, 0.2, 20, []),
            ("ok & <fine>", "a;b\nc.py", {"cpu": 1.0}, 0.1, 10, []),
        ]),
    ])
    return profile_from(build(spec), [CPU], meta={"target": XSS_FUNCTION, "command": XSS_FILE,
                                                  "sensor_notes": [XSS_FUNCTION]},
                        notes=[{"kind": "test", "message": XSS_FILE}])


def big_profile(functions: int = 50_000, modules: int = 100) -> Profile:
    """`functions` distinct leaf functions in `modules` files, uneven energies (deterministic)."""
    per_module = functions // modules
    mods = []
    for m in range(modules):
        leaves = [(f"mod{m}_function_{j}", f"pkg/mod{m}.py", {"cpu": ((m * 31 + j * 17) % 97 + 1) * 1e-3},
                   ((j * 7) % 13 + 1) * 1e-4, (j % 5) + 1, []) for j in range(per_module)]
        mods.append((f"run_{m}", f"pkg/mod{m}.py", {"cpu": 0.01}, 0.001, 1, leaves))
    spec: Spec = ("big.py", "", {"cpu": 0.0}, 0.0, 0, [
        ("<module>", "big.py", {"cpu": 0.0}, 0.0, 0, [("main", "big.py", {"cpu": 0.1}, 0.01, 1, mods)]),
        (IDLE_NODE, "", {"cpu": 5.0}, 0.0, 0, []),
    ])
    return profile_from(build(spec), [CPU])
