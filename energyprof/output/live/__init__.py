"""Live export: the run's power and energy while it runs, to InfluxDB and a Prometheus pushgateway, and
MLflow's live window logging, all on threads of energyprof's own. `formats.py` (line protocol, exposition
format), `sinks.py` (each sink and its bounded buffer), `export.py` (the run's export and the ledger's
figures); the targets are parsed in `setup/targets.py`, the program's `log_metrics` is
`integrations/metrics.py`."""
