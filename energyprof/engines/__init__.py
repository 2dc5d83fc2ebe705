"""The engines users already run beyond one process: Ray and Dask (torch.distributed lives in
integrations/distributed.py). What energyprof knows of each engine's processes and units of work."""
