"""`energyprof sweep --ray ADDRESS`: each run of a sweep as a Ray task, on whichever machine of the cluster
Ray places it. Ray is imported only here, and only when a sweep asks for it.

A task runs the same `python -m energyprof ... --json` command line a local sweep runs, in the sweep's
folder (a path the cluster's machines share, as a Ray job's working files usually are), so the run
sets its knobs on the machine it runs on, restores them there, and measures that machine: each
trial's energy is its own, read by its own supervisor. Runs without knobs go to the cluster at once
(each takes a CPU); runs that set knobs go one at a time, since a knob is a whole machine's. The
profile comes back to the driver as text and is written where a local sweep writes it, with the
machine it ran on.
"""

from __future__ import annotations

import os
import socket
import subprocess
from typing import Any, Sequence

# What a run needs of the sweep's environment on another machine: energyprof's own settings.
_PASSED = ("ENERGYPROF_", "PYTHONPATH")


def _run(argv: Sequence[str], cwd: str, env: dict[str, str], json_path: str) -> tuple[int, str, str, str]:
    """(exit status, the profile's JSON text or "", stderr's tail, the machine) of one run."""
    full = {**os.environ, **env}
    done = subprocess.run(list(argv), cwd=cwd, env=full, capture_output=True, text=True)
    try:
        with open(json_path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        text = ""
    return done.returncode, text, done.stderr[-2000:], socket.gethostname()


class Trials:
    """Runs submitted as Ray tasks (one CPU each), collected in the order they were submitted."""

    def __init__(self, address: str, cpus: float = 1.0) -> None:
        try:
            import ray
        except ImportError:
            raise RuntimeError("--ray needs Ray: pip install 'energyprof[ray]'") from None
        self.ray = ray
        if not ray.is_initialized():
            if address == "local":
                ray.init(include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        self.remote = ray.remote(num_cpus=cpus)(_run)
        self.pending: list[Any] = []
        self.done: list[tuple[int, str, str, str]] = []

    def submit(self, argv: Sequence[str], cwd: str, json_path: str, alone: bool) -> None:
        """`alone`: the run sets knobs, which are the machine's: it waits until the runs before it are
        done (two runs on one machine would set one knob to two values at once)."""
        env = {k: v for k, v in os.environ.items() if k.startswith(_PASSED)}
        if alone and self.pending:
            self.done.extend(self.ray.get(self.pending))
            self.pending = []
        self.pending.append(self.remote.remote(list(argv), cwd, env, json_path))
        if alone:
            self.done.extend(self.ray.get(self.pending))
            self.pending = []

    def results(self) -> list[tuple[int, str, str, str]]:
        out = self.done + self.ray.get(self.pending)
        self.pending, self.done = [], []
        return out

    def close(self) -> None:
        self.ray.shutdown()
