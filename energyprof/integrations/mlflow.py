"""MLflow: log a profile's figures, per-window energies and the report to a tracking run.

    from energyprof.integrations.mlflow import log_profile
    log_profile(profile)            # the active run, or a new one under MLFLOW_TRACKING_URI

mlflow (`pip install 'energyprof[mlflow]'`, the light `mlflow-skinny` client is enough) is
imported only when something is logged. Everything goes to one run through `MlflowClient`, so
logging into a run other than the active one never changes which run is active.
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path
from typing import Any

PREFIX = "energyprof"
_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")  # what MLflow accepts in a metric or param name


# -- the profile's facts this module reads (one place) -------------------------------------------
def _machine_j(profile: Any) -> float:
    return float(sum(profile.totals.get("energy_j", {}).values()))


def _program_j(profile: Any) -> float:
    return float(sum(profile.totals.get("attributed_j", {}).values()))


def _duration_s(profile: Any) -> float:
    return float(profile.totals.get("duration_s", 0.0))


def _carbon_g(profile: Any) -> float | None:
    value = profile.totals.get("carbon_g")
    return float(value) if value is not None else None


def _intensity(profile: Any) -> tuple[float | None, str | None]:
    c = profile.carbon or {}
    return c.get("intensity_g_per_kwh"), c.get("source")


def _windows(profile: Any) -> list[dict[str, Any]]:
    return list(profile.windows)


def _key(name: str) -> str:
    return _KEY.sub("_", name)


def params(profile: Any) -> dict[str, str]:
    """What the run measured and how: sources with their method, idle policy, carbon intensity."""
    out = {f"{PREFIX}.source.{_key(s['id'])}": f"{s.get('method', '')} ({s.get('sensor', s.get('component', ''))})"
           for s in profile.sources}
    out[f"{PREFIX}.idle_policy"] = str(profile.meta.get("idle_policy", ""))
    intensity, source = _intensity(profile)
    if intensity is not None:
        out[f"{PREFIX}.intensity_g_per_kwh"] = f"{intensity:g}"
        out[f"{PREFIX}.intensity_source"] = str(source or "")
    out[f"{PREFIX}.estimated"] = str(any(s.get("method") != "measured" for s in profile.sources))
    return out


def metrics(profile: Any) -> list[tuple[str, float, int]]:
    """(key, value, step): the run's totals (step 0), then each window's energy at step = its index."""
    out = [(f"{PREFIX}.energy_j", _machine_j(profile), 0), (f"{PREFIX}.program_energy_j", _program_j(profile), 0),
           (f"{PREFIX}.duration_s", _duration_s(profile), 0)]
    carbon = _carbon_g(profile)
    if carbon is not None:
        out.append((f"{PREFIX}.carbon_g", carbon, 0))
    seen: dict[str, int] = {}
    for w in sorted(_windows(profile), key=lambda w: w.get("start_s", 0.0)):
        name = _key(str(w["name"]))
        step = w.get("index")
        if step is None:  # unnumbered windows: in the order they ran
            step = seen.get(name, 0)
        seen[name] = int(step) + 1
        out.append((f"{PREFIX}.window.{name}.energy_j", float(sum(w["energy_j"].values())), int(step)))
        program = w.get("program_energy_j")  # the program's share, where the profile has it
        if program is not None:
            out.append((f"{PREFIX}.window.{name}.program_energy_j",
                        float(sum(program.values()) if isinstance(program, dict) else program), int(step)))
    return out


def log_profile(profile: Any, run: Any = None, artifacts: bool = True) -> str:
    """Log `profile` to `run` (an mlflow Run or ActiveRun, or a run id), else the active run, else a new
    one under MLFLOW_TRACKING_URI (ended again here). Returns the run id.

    Artifacts under `energyprof/`: the profile (profile.json) and the report (report.html)."""
    import mlflow
    from mlflow.entities import Metric, Param

    started = False
    if run is None:
        active = mlflow.active_run()
        if active is None:
            active, started = mlflow.start_run(), True
        run_id = active.info.run_id
    else:
        run_id = run if isinstance(run, str) else run.info.run_id
    client = mlflow.MlflowClient()
    try:
        now = int(time.time() * 1000)
        ms = [Metric(k, v, now, step) for k, v, step in metrics(profile)]
        ps = [Param(k, v) for k, v in params(profile).items()]
        for i in range(0, max(len(ms), 1), 1000):  # log_batch takes at most 1000 metrics
            client.log_batch(run_id, metrics=ms[i:i + 1000], params=ps if i == 0 else [])
        if artifacts:
            _log_artifacts(client, run_id, profile)
    finally:
        if started:
            mlflow.end_run()
    return run_id


def _log_artifacts(client: Any, run_id: str, profile: Any) -> None:
    from ..render.html import write_html

    with tempfile.TemporaryDirectory(prefix="energyprof-mlflow-") as tmp:
        profile.save(Path(tmp) / "profile.json")
        write_html(profile, str(Path(tmp) / "report.html"))
        client.log_artifacts(run_id, tmp, artifact_path=PREFIX)
