"""The calling thread's active MLflow run, where the program has imported mlflow itself (it is never imported
here): the live export logs a window or a figure into the run the program had open. Stdlib only."""

from __future__ import annotations

import sys


def active_run_id() -> str | None:
    mlflow = sys.modules.get("mlflow")
    if mlflow is None:
        return None
    try:
        active = mlflow.active_run()
    except Exception:  # noqa: BLE001 - a half-imported or stubbed mlflow is no run
        return None
    return active.info.run_id if active is not None else None
