"""`energyprof.log_metrics`: the program's own figures (a forecast after each epoch) to every live sink of
its run. In-process (`energy_profile(influx=...)`, `Monitor(...)`) they go to that export's threads; in a
program under `python -m energyprof --influx ...` they go through the spool to the supervisor, which
sends them. Nothing of the export is imported in the program where it runs supervised."""

from __future__ import annotations

import json
import math
import os
import sys

from ..agent.mlflow_run import active_run_id

EXPORT_MODULE = "energyprof.output.live.export"


def log_metrics(values: dict[str, float], step: int | None = None, method: str = "estimated") -> bool:
    """Send the program's own figures (name -> value) to every live sink of the run: InfluxDB and the
    pushgateway as `energyprof_metric` (step as a tag, `method` measured or estimated: a forecast is an
    estimate), MLflow as metrics at `step`. Never blocks and never raises; False where no live export
    runs (nothing was sent)."""
    try:
        live = sys.modules.get(EXPORT_MODULE)  # an in-process export has imported it; a program never needs to
        export = live.current() if live is not None else None
        run = active_run_id()
        if export is not None:
            export.metrics(values, step, run, method=method)
            return True
        return _to_supervisor(values, step, run, method)
    except Exception:  # noqa: BLE001 - a figure is never worth the program's run
        return False


def _to_supervisor(values: dict[str, float], step: int | None, run: str | None, method: str) -> bool:
    supervised = sys.modules.get("energyprof.agent.supervised")
    agent = supervised.current() if supervised is not None else None
    if agent is None or agent.config.get("live") != "1":
        return False
    from ..agent.wire import METRICS_FILE

    clean = {str(k): float(v) for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    line = json.dumps({"values": clean, "step": step, "run": run, "method": method}, separators=(",", ":")) + "\n"
    fd = os.open(os.path.join(agent.config["spool"], METRICS_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())  # one write of a short line: whole, whoever else appends
    finally:
        os.close(fd)
    return True
