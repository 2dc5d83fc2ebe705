"""Writing one file safely: atomic replace for regular files, write-through for devices and FIFOs.

Every output goes through `write_text` (outputs.py for reports, the collector for checkpoints,
`Profile.save`); it imports nothing of energyprof's, so the facts can be saved without the views.
"""

from __future__ import annotations

import os
import stat
import tempfile


def write_text(path: str, data: str | bytes) -> None:
    """Write `data` to `path`: atomic replace for a regular file (or a new one), write-through otherwise."""
    real = os.path.realpath(path)  # follow a symlink: replace its target, keep the link
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        mode = None
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if mode is not None and not stat.S_ISREG(mode):
        with open(real, "wb") as fh:  # a device, FIFO or socket-like node: never replaced
            fh.write(raw)
        return
    folder = os.path.dirname(real) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(real)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        if mode is not None:
            os.chmod(tmp, stat.S_IMODE(mode))  # an existing file keeps its permissions
        else:
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a report is an ordinary file
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
