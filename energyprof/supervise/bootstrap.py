"""The environment that starts the sampler in every Python process of the job.

`agent/_boot/` holds one `sitecustomize.py`, put first on PYTHONPATH (the user's entries kept
after it); ENERGYPROF_AGENT says where to spool and how to sample. Python children inherit
both, so multiprocessing's spawn, `subprocess` running python, and torchrun's workers start
their own sampler the same way.
"""

from __future__ import annotations

import os
import sys

from ..agent.wire import ENV
from ..facts.measurement import carbon_setting
from ..setup.options import Options

BOOT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "agent", "_boot")


def child_env(options: Options, spool: str, base: dict[str, str] | None = None,
              io_disks: set[str] | None = None) -> dict[str, str]:
    """The job's environment. `io_disks`: the disks the supervisor counts (collect/io.py), which each
    process reads with its own /proc/self/io at its windows' edges; None: no I/O at the edges."""
    env = dict(os.environ if base is None else base)
    config = {
        "python": "%d.%d" % sys.version_info[:2],  # other interpreters on PATH leave the bootstrap at once
        "spool": os.path.abspath(spool),  # a relative TMPDIR must not follow the program's chdir
        "parent": str(os.getpid()),
        "interval": repr(float(options.interval)),
        "memory": options.memory,
        "follow": "1" if options.follow and options.children else "0",
        "sampler": options.sampler,
        "sync": options.sync or "",
        "gpu_kernels": {True: "1", False: "0"}.get(options.gpu_kernels, "auto"),
        "gpu_kernel_trace": os.path.abspath(options.gpu_kernel_trace) if options.gpu_kernel_trace else "",
        "gpu_kernel_steps": options.gpu_kernel_steps or "",
        # energyprof.torch.track()'s forecast: the passes to forecast, whether to print it, the sensors' period
        "epochs": str(options.expect_epochs or ""),
        "quiet": "1" if options.quiet else "0",
        "sensor_interval": repr(float(options.sensor_interval)),
        # what a window's Measurement needs beside its energies (supervise/job.py writes those back,
        # under the run's idle policy: the agent holds no policy of its own)
        "carbon": ",".join(repr(x) for x in carbon_setting(options)),
        # the program's window() blocks say which MLflow run is active as they end; the supervisor logs them
        "mlflow": "1" if options.mlflow else "0",
        # energyprof.log_metrics in the program hands its figures to the supervisor's sinks
        "live": "1" if options.mlflow or options.influx or options.pushgateway else "0",
    }
    if io_disks is not None:
        config["io_disks"] = ",".join(sorted(io_disks))
    env[ENV] = "\x1f".join(f"{k}={v}" for k, v in config.items())
    if options.watch_cache:  # energyprof.torch.track() measures it at each pass's start and end
        from ..collect.pagecache import WATCH_ENV as WATCH_CACHE_ENV  # ctypes and subprocess: only for this flag

        env[WATCH_CACHE_ENV] = os.path.abspath(options.watch_cache)  # absolute: the program may chdir
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = BOOT_DIR + (os.pathsep + old if old else "")
    return env
