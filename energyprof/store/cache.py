"""A per-user cache folder for work whose result does not change between runs.

The CPU table's answer for this machine's CPU cost a large part of a short run's start-up
(measured: about 0.18 s of CPU of an empty script's 0.55 s over plain python). It is keyed by
what it was computed from, so a stale entry is never used: the CPU model and the table's file
(its path, size and modification time).

`$ENERGYPROF_CACHE_DIR`, else `$XDG_CACHE_HOME/energyprof`, else `~/.cache/energyprof`; an
empty `ENERGYPROF_CACHE_DIR` turns the cache off. A folder that cannot be made or written
only costs the time: nothing fails for it.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any


def folder() -> str | None:
    """The cache folder, made private (0700) on first use; None when there is none to use."""
    path = os.environ.get("ENERGYPROF_CACHE_DIR")
    if path is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(base, "energyprof")
    if not path or not os.path.isabs(path):
        return None
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError:
        return None
    # Another user's folder (a shared HOME, a world-writable /tmp cache) is never trusted: what it
    # holds would decide the figures of this user's runs.
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return path


def load(name: str) -> dict[str, Any]:
    """One small JSON table of the cache; empty when absent or unreadable."""
    path = folder()
    if path is None:
        return {}
    try:
        with open(os.path.join(path, name), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def store(name: str, data: dict[str, Any]) -> None:
    """Replace one JSON table of the cache atomically; a failure is ignored (the cache is optional)."""
    path = folder()
    if path is None:
        return
    target = os.path.join(path, name)
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, target)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
