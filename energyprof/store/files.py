"""Writing one file safely: atomic replace for regular files, write-through for everything else.

Every output goes through `write_text` (outputs.py for reports, the collector for checkpoints,
`Profile.save`); it imports nothing of energyprof's, so the facts can be saved without the views.

An output never harms what it is written to:
- a regular file (or a new one) is replaced atomically: a reader never sees half a report;
- a device or FIFO (`-o /dev/null`, a pipe) is written through, never unlinked or renamed;
- an open descriptor (`--json /dev/stdout`, `/dev/fd/3`, `/proc/self/fd/3`) is written through
  that descriptor, at its offset: with stdout redirected to a file, the program's output already
  in it stays and the JSON follows it (a path re-opened with O_TRUNC, or replaced, would lose it);
- a symlink is followed to its target, which is replaced; the link stays.
"""

from __future__ import annotations

import os
import re
import stat
import sys

_FD_FOLDER = re.compile(r"/proc/(?:self|thread-self|\d+)(?:/task/\d+)?/fd|/dev/fd")
TEMP_AFFIXES = len(".") + len(".") + 8 + len(".tmp")  # what mkstemp adds to a name while it is written


def descriptor(path: str) -> tuple[int | None, int] | None:
    """(pid or None for this process, fd) when `path` names an open descriptor, else None.

    Followed link by link (/dev/stdout -> /proc/self/fd/1): resolving the whole path would name
    the file the descriptor is open on, which is what must not be replaced.
    """
    p = os.path.abspath(path)
    for _ in range(40):
        folder = os.path.realpath(os.path.dirname(p))
        name = os.path.basename(p)
        m = _FD_FOLDER.fullmatch(folder)
        if m and name.isdigit():
            owner = folder.split("/")[2] if folder.startswith("/proc/") else "self"
            pid = None if owner in ("self", "thread-self") or owner == str(os.getpid()) else int(owner)
            return pid, int(name)
        full = os.path.join(folder, name)
        try:
            if not stat.S_ISLNK(os.lstat(full).st_mode):
                return None
            p = os.path.join(folder, os.readlink(full))
        except OSError:
            return None
    return None


def is_regular_target(path: str) -> bool:
    """A write to `path` would make or replace a regular file (nothing there yet, or a regular file)."""
    if descriptor(path) is not None:
        return False
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return True
    except OSError:
        return False


def write_text(path: str, data: str | bytes) -> None:
    """Write `data` to `path`: atomic replace for a regular file (or a new one), write-through otherwise."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd_target = descriptor(path)
    if fd_target is not None:
        _write_descriptor(path, fd_target, raw)
        return
    real = os.path.realpath(path)  # follow a symlink: replace its target, keep the link
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        fd = os.open(real, os.O_WRONLY)  # a device, FIFO or socket-like node: never replaced, never created
        try:
            _write_all(fd, raw)
        finally:
            os.close(fd)
        return
    folder = os.path.dirname(real) or "."
    fd, tmp = _new_temp(folder, os.path.basename(real))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        if mode is not None:
            os.chmod(tmp, stat.S_IMODE(mode))  # an existing file keeps its permissions
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_descriptor(path: str, target: tuple[int | None, int], raw: bytes) -> None:
    pid, n = target
    if pid is None:  # our own descriptor: write at its offset, after what is already there
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None and stream.fileno() == n:
                    stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        _write_all(n, raw)
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)  # another process's: appended, never truncated
    try:
        _write_all(fd, raw)
    finally:
        os.close(fd)


def _write_all(fd: int, raw: bytes) -> None:
    view = memoryview(raw)
    while view:
        view = view[os.write(fd, view):]


def remove(path: str) -> bool:
    """Remove `path` if it is a regular file (a checkpoint that served); a device, FIFO, descriptor
    or symlink is left alone. True if it was removed."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        os.unlink(path)
        return True
    except OSError:
        return False


def _new_temp(folder: str, base: str) -> tuple[int, str]:
    """A new file beside the target, made 0666 less the umask by the kernel itself, as an ordinary
    report is. Reading the umask would mean setting it (os.umask), and for that moment a thread of
    the program would create its files under our mask, not its own."""
    for _ in range(100):
        tmp = os.path.join(folder, f".{base}.{os.urandom(4).hex()}.tmp")  # TEMP_AFFIXES long, as mkstemp's
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {base} in {folder}")
