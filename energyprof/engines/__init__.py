"""The engines users already run beyond one process: torch.distributed (distributed.py), Ray and Dask.
What energyprof knows of each engine's processes and units of work, and how a job's pieces are gathered."""
