"""The drivers' shared ground: what the supervised run, the Profiler and the Monitor each need alike."""
