"""The privileged reader, `energyprof sensors serve`: a root service that hands RAPL's counters (and,
for its group, the machine's power knobs) to users without root. docs/sensors.md says how to run it."""
