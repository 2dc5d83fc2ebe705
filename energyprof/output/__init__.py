"""The one writer of a run's outputs (the facts first, then every view) and its sinks (MLflow)."""
