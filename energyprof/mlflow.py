"""`energyprof.mlflow.log_profile(profile)`: the MLflow integration under a short public name.

The code lives in `energyprof.output.mlflow`; mlflow itself is imported only when a profile is logged.
"""

from __future__ import annotations

from .output.mlflow import log_model, log_profile, metrics, params  # noqa: F401

__all__ = ["log_profile", "log_model", "metrics", "params"]
