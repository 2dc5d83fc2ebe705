"""The training-loop breakdown: fetch, preprocess, compute and stall per step, from a profile's windows. Pure."""

from __future__ import annotations

import statistics
from typing import Any


def breakdown(profile: Any, name: str = "step", epoch_window: str = "epoch") -> dict[str, Any]:
    """The fetch/compute split with energy, from a finished profile's windows (pure).

    Works on a loaded profile too. Steps are grouped by the `epoch_window` window that holds
    them (None when the script marks no epochs). Energy is summed over sources; `by_source`
    keeps each. Returns {"steps": [...], "epochs": [...], "step_energy_j": {mean, stdev}}.
    """
    def named(suffix: str) -> list[dict[str, Any]]:
        return [w for w in profile.windows if w["name"] == f"{name}.{suffix}" and w.get("index") is not None]

    epochs = [w for w in profile.windows if w["name"] == epoch_window]
    fetches, used = named("fetch"), set()
    preprocesses = named("preprocess")
    steps = []
    for c in sorted(named("compute"), key=lambda w: w["start_s"]):
        # its fetch: same index, the last one to end before it began (the end-of-data fetch of
        # the previous pass carries the same index as the next pass's first step)
        cands = [i for i, f in enumerate(fetches) if i not in used and f["index"] == c["index"]
                 and f["end_s"] <= c["start_s"] + 1e-6]
        f = fetches[max(cands, key=lambda i: fetches[i]["end_s"])] if cands else None
        if cands:
            used.add(max(cands, key=lambda i: fetches[i]["end_s"]))
        pre = [p for p in preprocesses if p["index"] == c["index"]
               and c["start_s"] - 1e-6 <= p["start_s"] and p["end_s"] <= c["end_s"] + 1e-6]
        r: dict[str, Any] = {"step": int(c["index"]), "start_s": f["start_s"] if f else c["start_s"]}
        r["fetch_s"] = f["time_s"] if f else 0.0
        r["fetch_j"] = sum(f["energy_j"].values()) if f else 0.0
        r["preprocess_s"] = sum(p["time_s"] for p in pre)
        r["preprocess_j"] = sum(sum(p["energy_j"].values()) for p in pre)
        # the preprocess windows are nested in compute: take them out so the phases are disjoint
        r["compute_s"] = max(c["time_s"] - r["preprocess_s"], 0.0)
        r["compute_j"] = max(sum(c["energy_j"].values()) - r["preprocess_j"], 0.0)
        by_source = dict(c["energy_j"])
        for sid, j in (f["energy_j"] if f else {}).items():
            by_source[sid] = by_source.get(sid, 0.0) + j
        r["by_source"] = by_source
        r["time_s"] = r["fetch_s"] + r["preprocess_s"] + r["compute_s"]
        r["energy_j"] = r["fetch_j"] + r["preprocess_j"] + r["compute_j"]
        r["stall_s"] = max(r["fetch_s"] + r["preprocess_s"] - r["compute_s"], 0.0)
        r["epoch"] = next((e["index"] for e in epochs if e["start_s"] <= r["start_s"] < e["end_s"]), None)
        steps.append(r)
    steps.sort(key=lambda r: r["start_s"])
    end_waits = [{"step": int(f["index"]), "fetch_s": f["time_s"], "fetch_j": sum(f["energy_j"].values())}
                 for i, f in enumerate(fetches) if i not in used]  # next() found the loader exhausted
    per_epoch: dict[Any, dict[str, Any]] = {}
    for r in steps:
        e = per_epoch.setdefault(r["epoch"], {"epoch": r["epoch"], "steps": 0, "fetch_s": 0.0, "preprocess_s": 0.0,
                                              "compute_s": 0.0, "stall_s": 0.0, "time_s": 0.0, "fetch_j": 0.0,
                                              "preprocess_j": 0.0, "compute_j": 0.0, "energy_j": 0.0})
        e["steps"] += 1
        for k in ("fetch_s", "preprocess_s", "compute_s", "stall_s", "time_s", "fetch_j", "preprocess_j",
                  "compute_j", "energy_j"):
            e[k] += r[k]
    energies = [r["energy_j"] for r in steps]
    return {
        "name": name,
        "steps": steps,
        "epochs": list(per_epoch.values()),
        "end_of_data_waits": [{"after_step": r["step"] - 1, "time_s": r["fetch_s"], "energy_j": r["fetch_j"]}
                              for r in end_waits],
        "step_energy_j": {"mean": statistics.fmean(energies) if energies else 0.0,
                          "stdev": statistics.stdev(energies) if len(energies) > 1 else 0.0,
                          "n": len(energies)},
        "stall_definition": "max(fetch + preprocess - compute, 0) per step",
    }
