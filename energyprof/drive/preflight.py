"""File-system checks before a workload starts: outputs writable and distinct, traces readable, lookups known.

`preflight(options)` is called by the CLI before the program starts and by the API when a profile
starts, so a ten-hour run never ends in "cannot write". Options validation itself is pure
(options.py); everything here looks at files.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import stat
import sys
from typing import TextIO

from ..store.files import TEMP_AFFIXES
from ..store.files import descriptor
from ..store.files import ProtectedLink
from ..store.files import check_link
from ..store.files import why_not_writable
from ..setup.options import OUTPUTS
from ..setup.options import Options
from ..setup.options import OptionError
from ..setup.options import flag


def preflight(options: Options, inputs: tuple[str, ...] = (), keep_checkpoint: bool = True,
              stream: TextIO | None = None) -> None:
    """Raise OptionError (one line) for anything that would fail later.

    `inputs` are files read by this command (`energyprof report p.json`): an output on one of
    them is refused. With `keep_checkpoint`, an earlier run's checkpoint at the checkpoint path
    (a run that was killed) is moved to a free name and said so on `stream`, never overwritten.
    """
    if options.gpu_kernels:
        from ..collect.kernels.capture import unavailable

        why = unavailable()
        if why:
            raise OptionError(why)
    if options.gpu_kernel_trace and not (os.path.isdir(options.gpu_kernel_trace)
                                         and os.access(options.gpu_kernel_trace, os.W_OK | os.X_OK)):
        raise OptionError(f"--gpu-kernel-trace: {options.gpu_kernel_trace} is not a folder energyprof can write in")
    seen: dict[str, str] = {os.path.realpath(p): "the input" for p in inputs}
    for name in OUTPUTS + ("checkpoint",):
        path = getattr(options, name)
        if path is None:
            continue
        check_writable(path, flag(name))
        real = os.path.realpath(path)
        if real in seen and not _is_sink(real):
            raise OptionError(f"{flag(name)} {path}: the same file as {seen[real]}; one of them would be lost")
        seen.setdefault(real, flag(name))
    if options.watch_cache is not None and not os.path.exists(options.watch_cache):
        raise OptionError(f"--watch-cache: {options.watch_cache}: no such file or folder")
    if options.emissions_csv is not None:
        check_writable(options.emissions_csv, "--emissions-csv")
        _check_appendable(options.emissions_csv, "--emissions-csv")
        from ..output.emissions import check_header

        try:
            check_header(options.emissions_csv)
        except ValueError as exc:
            raise OptionError(f"--emissions-csv: {exc}") from None
    for name in ("power_trace", "carbon_intensity_trace"):
        path = getattr(options, name)
        if path is not None and not os.path.isfile(path):
            raise OptionError(f"{flag(name)}: {path} is not a file")
    if options.power_trace is not None:
        from ..collect.sensors.replay import TraceError, load_trace

        try:
            load_trace(options.power_trace)
        except TraceError as exc:
            raise OptionError(str(exc)) from None
    if options.powercap_root is not None and not os.path.isdir(options.powercap_root):
        raise OptionError(f"--powercap-root: {options.powercap_root} is not a directory")
    if options.country is not None or options.region is not None or options.cloud is not None \
            or options.carbon_intensity_trace is not None:
        from ..carbon import intensity

        try:
            intensity.validate(options)
        except ValueError as exc:
            raise OptionError(str(exc)) from None
    if options.mlflow:
        if importlib.util.find_spec("mlflow") is None:
            raise OptionError("--mlflow needs mlflow: pip install 'energyprof[mlflow]'")
        from ..output.mlflow import StoreError
        from ..output.mlflow import check_store

        try:
            check_store()
        except StoreError as exc:
            raise OptionError(str(exc)) from None
    if keep_checkpoint and options.checkpoint is not None:
        kept = keep_old_checkpoint(options.checkpoint)
        if kept is not None:
            print(f"energyprof: an earlier run's checkpoint was at {options.checkpoint}; kept it as {kept}"
                  f" (energyprof report {kept} renders it)", file=stream or sys.stderr)


def is_regular_file(path: str) -> bool:
    """A regular file itself, not a link to one."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _is_sink(real: str) -> bool:
    """A device or FIFO (such as /dev/null) can take several outputs: nothing is replaced."""
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _name_max(folder: str) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def name_fits(path: str) -> bool:
    """A regular file of this name can be written atomically in its folder (its temporary name,
    a few bytes longer, fits too)."""
    real = os.path.realpath(path)
    folder = os.path.dirname(real) or "."
    name = os.path.basename(real)
    return bool(name) and len(os.fsencode(name)) + TEMP_AFFIXES <= _name_max(folder)


def check_writable(path: str, what: str) -> None:
    """Fail now, not after a ten-hour run, if an output cannot be written."""
    if not path:
        raise OptionError(f"{what} needs a file name, not ''")
    if "\0" in path:
        raise OptionError(f"{what}: a file name cannot hold a NUL character")
    if descriptor(path) is not None:
        return  # an open descriptor (/dev/stdout) is written through; nothing is created
    try:
        check_link(path)  # another user's link in a shared sticky folder (/tmp) is not followed
    except ProtectedLink as exc:
        raise OptionError(f"{what}: {exc}") from None
    try:
        real = os.path.realpath(path)  # a symlink is written through to its target
        if _is_dir(real):
            raise OptionError(f"{what}: {path} is a directory")
    except OSError as exc:  # a name or path too long for the system, a loop of links
        raise OptionError(f"{what}: {path[:80]}{'...' if len(path) > 80 else ''}: {exc.strerror or exc}") from None
    parent, name = os.path.split(real)
    if name in ("", ".", ".."):
        raise OptionError(f"{what}: {path} is a directory")
    if not os.path.isdir(parent):
        raise OptionError(f"{what}: folder {os.path.dirname(path.rstrip(os.sep) or path) or '.'} does not exist")
    if os.path.exists(real):
        if not os.access(real, os.W_OK):
            raise OptionError(f"{what}: cannot write to {path} ({why_not_writable(real)})")
        if not os.path.isfile(real):
            return  # a device or FIFO is written through; its folder need not be writable
    limit = _name_max(parent)
    size = len(os.fsencode(name))
    if size + TEMP_AFFIXES > limit:
        raise OptionError(f"{what}: the file name is too long ({size} bytes; this folder takes names of up to"
                          f" {limit - TEMP_AFFIXES} for a file written safely)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OptionError(f"{what}: cannot write to {path} ({why_not_writable(parent)})")


def _is_dir(path: str) -> bool:
    """A folder, as pathlib's is_dir says: no such path is not one, but a name too long for the system
    raises its OSError (reported in one line), where os.path.isdir would say False."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP):
            return False
        raise
    except ValueError:
        return False


def _check_appendable(path: str, what: str) -> None:
    """A log that is appended to and whose header is read back (the emissions CSV): a regular file, a new
    one or a device; a FIFO or socket would block or fail only at the run's end."""
    if descriptor(path) is not None:
        return
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket"
        raise OptionError(f"{what}: {path} is {kind}; the log is appended to and its header read back: give a file")


def keep_old_checkpoint(path: str) -> str | None:
    """Move a checkpoint left by an earlier run to the first free `NAME.N.json`; None if none was there."""
    if not is_regular_file(path):  # a device, a descriptor (/dev/stdout), a link: never moved
        return None
    folder, name = os.path.split(path.rstrip(os.sep) or path)  # `..` kept: it is read after symlinks
    stem = name[:-len(".json")] if name.endswith(".json") else name
    for n in range(1, 10_000):
        candidate = os.path.join(folder, f"{stem}.{n}.json")
        if not os.path.exists(candidate):
            try:
                os.link(path, candidate)  # never replaces an existing file, unlike rename
                os.unlink(path)
            except OSError as exc:
                raise OptionError(f"--checkpoint: an earlier run's checkpoint is at {path} and cannot be kept"
                                  f" ({exc.strerror or exc}); move it or choose another --checkpoint") from None
            return candidate
    raise OptionError(f"--checkpoint: too many earlier checkpoints beside {path}; move them")
