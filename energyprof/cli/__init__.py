"""`python -m energyprof` / `energyprof`: one module per subcommand.

    energyprof [options] script.py [args...]      run.py
    energyprof [options] -m module [args...]
    energyprof [options] -- COMMAND [args...]
    energyprof report PROFILE.json                report.py
    energyprof compare A.json B.json              compare.py
    energyprof merge A.json B.json -o JOB.json    merge.py
    energyprof sensors [record | serve]           sensors.py
    energyprof gpu-trace TRACE --power-trace CSV  gpu_trace.py
    energyprof sweep --grid ... --knob ... -- CMD sweep.py
    energyprof cache {drop,status} PATH           cache.py
    energyprof estimate {fit,predict} ...         estimate.py
"""

from __future__ import annotations

import gc
import sys
from typing import Sequence

from ..setup.choices import OptionError
from .common import PROG, UsageError


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("report", "compare", "merge", "sensors", "gpu-trace", "sweep", "cache", "estimate"):
        gc.enable()  # __main__ turned it off for start-up; only `run` keeps it off until the program starts
    try:
        if argv and argv[0] == "report":
            from .report import report

            return report(argv[1:])
        if argv and argv[0] == "compare":
            from .compare import compare_cmd

            return compare_cmd(argv[1:])
        if argv and argv[0] == "merge":
            from .merge import merge_cmd

            return merge_cmd(argv[1:])
        if argv and argv[0] == "sensors":
            from .sensors import sensors_cmd

            return sensors_cmd(argv[1:])
        if argv and argv[0] == "gpu-trace":
            from .gpu_trace import gpu_trace_cmd

            return gpu_trace_cmd(argv[1:])
        if argv and argv[0] == "sweep":
            from .sweep import sweep_cmd

            return sweep_cmd(argv[1:])
        if argv and argv[0] == "cache":
            from .cache import cache_cmd

            return cache_cmd(argv[1:])
        if argv and argv[0] == "estimate":
            from .estimate import estimate_cmd

            return estimate_cmd(argv[1:])
        from .run import run

        return run(argv)
    except (UsageError, OptionError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
