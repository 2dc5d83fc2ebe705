"""`python -m energyprof`: the program runs as a child process, energyprof stays outside.

supervisor.py runs it and writes the outputs however it ends; launch.py starts it so that it
never outlives energyprof; signals.py forwards signals and mirrors the ending; bootstrap.py
prepares the environment that starts the sampler in every Python process of the job
(_boot/sitecustomize.py); stream.py reads what those samplers spool; follow.py finds the job's
processes and reads their CPU (/proc, or psutil); job.py merges it all into the ledger.
"""
