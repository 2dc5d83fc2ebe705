"""The agent: the only code that runs inside the profiled program.

Standard library only, and it imports nothing of energyprof's beyond this package, so the
bootstrap (`_boot/sitecustomize.py`) can load it by path before the program's folder is on
`sys.path`. `sampler.py` is the one hidden sampler thread and its sinks (the in-process
collector, or a spool file the supervisor reads); `frames.py` decides which frames belong to
the program.
"""
