"""What an engine's process is, read from its command line: a Ray worker or one of Ray's daemons.

Ray starts its workers and daemons itself (the raylet, the GCS, the dashboard and its agents), so
their command lines name them; a node that says `[ray worker 4242]` or `[ray daemon raylet]`
tells the user what the process was without the 200-character command. Dask's workers are
spawned by multiprocessing (`python -c "from multiprocessing.spawn ..."`), which names nothing:
their agent names them once multiprocessing hands it its process object (`[processes: dask worker]`,
one node for a nanny's workers, counted), and their tasks name themselves (agent/units.py).
"""

from __future__ import annotations

import os

# (a part of the command line, the role): the first that matches names the process.
_RAY = (
    (f"ray{os.sep}_private{os.sep}workers{os.sep}default_worker.py", "ray worker"),
    (f"ray{os.sep}dashboard{os.sep}agent.py", "ray daemon dashboard agent"),
    (f"ray{os.sep}dashboard{os.sep}dashboard.py", "ray daemon dashboard"),
    (f"ray{os.sep}_private{os.sep}runtime_env{os.sep}agent", "ray daemon runtime_env agent"),
    (f"ray{os.sep}_private{os.sep}log_monitor.py", "ray daemon log_monitor"),
    (f"ray{os.sep}autoscaler{os.sep}_private{os.sep}monitor.py", "ray daemon monitor"),
)
_RAY_BINARIES = {"raylet": "ray daemon raylet", "gcs_server": "ray daemon gcs_server"}


def engine_role(command: str) -> str | None:
    """`ray worker`, `ray daemon raylet`, ... or None for a process of no engine known here."""
    parts = command.split()
    if not parts:
        return None
    binary = _RAY_BINARIES.get(os.path.basename(parts[0]))
    if binary is not None and f"{os.sep}ray{os.sep}" in parts[0]:
        return binary
    for part, role in _RAY:
        if part in command:
            return role
    return None


def node_name(pid: int, command: str) -> str | None:
    role = engine_role(command)
    if role is None:
        return None
    return f"[{role} {pid}]" if role.endswith("worker") else f"[{role}]"


# A process's label, as its agent gave it, -> its role (the processes table's name for it).
_LABEL_ROLES = (("[processes: dask worker", "dask worker"),)


def process_role(command: str, label: str = "") -> str | None:
    """An engine process's role from its agent's label or its command line (`dask worker`, `ray worker`,
    `ray daemon raylet`); None for a process of no engine known here."""
    for prefix, role in _LABEL_ROLES:
        if label.startswith(prefix):
            return role
    return engine_role(command)
