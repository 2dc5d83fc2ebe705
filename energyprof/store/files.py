"""Writing one file safely: atomic replace for regular files, write-through for everything else.

Every output goes through `write_text` (outputs.py for reports, the collector for checkpoints,
`Profile.save`); it imports nothing of energyprof's, so the facts can be saved without the views.

An output never harms what it is written to:
- a regular file (or a new one) is replaced atomically: a reader never sees half a report;
- a device or FIFO (`-o /dev/null`, a pipe) is written through, never unlinked or renamed;
- an open descriptor (`--json /dev/stdout`, `/dev/fd/3`, `/proc/self/fd/3`) is written through
  that descriptor, at its offset: with stdout redirected to a file, the program's output already
  in it stays and the JSON follows it (a path re-opened with O_TRUNC, or replaced, would lose it);
- a symlink is followed to its target, which is replaced; the link stays. Not one the kernel's
  protected_symlinks rule would refuse (a link in a world-writable sticky folder such as /tmp, owned
  by neither the writer nor the folder's owner): reading the link and opening its target would step
  around that rule, so root would write wherever another user's link points. It is refused
  (`ProtectedLink`), whatever fs.protected_symlinks says;
- a FIFO is opened without blocking: with no reader within FIFO_WAIT_S, or a reader that takes nothing
  for FIFO_STALL_S, the write fails with one line (`NoReader`) instead of holding the run's end.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import time
from typing import Any, Callable

# compiled at the first path under /proc or /dev/fd (re caches it): most runs write none
_FD_FOLDER = r"/proc/(?:self|thread-self|\d+)(?:/task/\d+)?/fd|/dev/fd"
TEMP_AFFIXES = len(".") + len(".") + 8 + len(".tmp")  # what mkstemp adds to a name while it is written
FIFO_WAIT_S = 1.0  # a FIFO with no reader for this long is not written
FIFO_STALL_S = 30.0  # nor one whose reader takes nothing for this long


class ProtectedLink(PermissionError):
    """A symlink that the kernel's protected_symlinks rule would not follow: not written through."""


class NoReader(OSError):
    """A FIFO that no process reads (or whose reader stopped taking data)."""


def why_not_writable(path: str) -> str:
    """Why `path` (a file or folder that os.access says this process cannot write) is not writable, in words
    a user can act on: a read-only file system (where even root is refused, EROFS) or permission denied."""
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except OSError:
        pass
    return "permission denied"


def protected_link(path: str) -> str | None:
    """The first symlink on the way to `path` that the kernel's protected_symlinks rule refuses to follow
    (in a world-writable sticky folder, owned neither by us nor by the folder's owner), else None."""
    return _walk_links(path)[0]


def resolve(path: str) -> str:
    """os.path.realpath(path), the links followed one by one as the kernel follows them: ProtectedLink for
    one its protected_symlinks rule refuses (realpath reads every link without that rule). The file is
    then written at the path returned, which holds no link, so a link planted afterwards is replaced
    (os.replace) or refused (O_NOFOLLOW), never followed."""
    link, real = _walk_links(path)
    if link is not None:
        raise ProtectedLink(f"{link} is a symlink of another user in a world-writable sticky folder;"
                            " not followed (the kernel's protected_symlinks rule): remove it or choose another name")
    return real


def check_link(path: str) -> None:
    """Raise ProtectedLink (one line) where writing `path` would follow another user's link in a shared folder."""
    resolve(path)


def _walk_links(path: str) -> tuple[str | None, str]:
    """(the first link the protected_symlinks rule refuses or None, the path with every link resolved)."""
    whole = path if path.startswith("/") else os.path.join(os.getcwd(), path)  # not abspath: ".." after a link
    todo = whole.split("/")[::-1]                                              # is the link target's parent
    resolved = "/"
    hops = 0
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            resolved = os.path.dirname(resolved)
            continue
        candidate = os.path.join(resolved, name)
        try:
            st = os.lstat(candidate)
        except OSError:  # not there (yet): the rest is a name, as realpath takes it
            resolved = candidate
            continue
        if not stat.S_ISLNK(st.st_mode):
            resolved = candidate
            continue
        hops += 1
        try:
            folder = os.stat(resolved)
            target = os.readlink(candidate)
        except OSError:
            return None, os.path.realpath(path)
        sticky_shared = folder.st_mode & stat.S_ISVTX and folder.st_mode & stat.S_IWOTH
        if sticky_shared and uid is not None and st.st_uid not in (uid, folder.st_uid):
            return candidate, candidate
        if hops > 40:
            return None, os.path.realpath(path)  # a loop: opening it fails with ELOOP
        if target.startswith("/"):
            resolved = "/"
        todo.extend(target.split("/")[::-1])
    return None, resolved


def descriptor(path: str) -> tuple[int | None, int] | None:
    """(pid or None for this process, fd) when `path` names an open descriptor, else None.

    Followed link by link (/dev/stdout -> /proc/self/fd/1): resolving the whole path would name
    the file the descriptor is open on, which is what must not be replaced.
    """
    p = os.path.abspath(path)
    for _ in range(40):
        folder = os.path.realpath(os.path.dirname(p))
        name = os.path.basename(p)
        m = folder.startswith(("/proc/", "/dev/fd")) and re.fullmatch(_FD_FOLDER, folder)
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


class FileBytes:
    """A part of `write_text`'s data that is a file's bytes as they are on disk: copied by the kernel where it
    can (the report page's plotly.js, 1.2 MB, never read into the process: about 1 ms of every run's CPU with
    the page faults of holding it), else read and written."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> bytes:
        with open(self.path, "rb") as fh:
            return fh.read()


def write_text(path: str, data: str | bytes | tuple[bytes | FileBytes, ...]) -> None:
    """Write `data` to `path`: atomic replace for a regular file (or a new one), write-through otherwise.
    A tuple of parts is written part after part, as their concatenation would be (the report page: plotly.js's
    1.2 MB copied from its file, never read into one object first)."""
    # A lone surrogate (a name read from a program, undecodable bytes) has no UTF-8 form: it is written
    # as its escape (\udc80), never a reason to lose the file.
    raw = data if isinstance(data, tuple) else (data.encode("utf-8", "backslashreplace") if isinstance(data, str)
                                                else data,)
    parts = _Parts(raw)
    try:
        _write_to(path, parts)
    finally:
        parts.close()


def _write_to(path: str, parts: _Parts) -> None:
    fd_target = descriptor(path)
    if fd_target is not None:
        _write_descriptor(path, fd_target, parts)
        return
    real = resolve(path)  # follow a symlink (not another user's in a shared folder): replace its target, keep the link
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        # a device, FIFO or socket-like node: never replaced, never created
        fd = parts.opening(lambda: open_through(real, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0)))
        try:
            parts.write(fd)
        finally:
            os.close(fd)
        return
    folder = os.path.dirname(real) or "."
    fd, tmp = parts.opening(lambda: _new_temp(folder, os.path.basename(real)))
    try:
        try:
            parts.write(fd)
        finally:
            os.close(fd)
        if mode is not None:
            os.chmod(tmp, stat.S_IMODE(mode))  # an existing file keeps its permissions
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class _Source:
    """A FileBytes part, opened."""

    __slots__ = ("fd",)

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def read_and_close(self) -> bytes:
        try:
            chunks, at = [], 0
            while chunk := os.pread(self.fd, 1 << 20, at):
                chunks.append(chunk)
                at += len(chunk)
            return b"".join(chunks)
        finally:
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Parts:
    """A write's parts, each FileBytes opened before the destination is. A copy holds two descriptors at once
    where reading the file first held one: under a limit that leaves room for one only (ulimit -n), the files
    are read through the descriptors already open and closed, and the destination opened then."""

    def __init__(self, raw: tuple[bytes | FileBytes, ...]) -> None:
        self.items: list[bytes | _Source] = []
        try:
            for part in raw:
                self.items.append(_Source(part.path) if isinstance(part, FileBytes) else part)
        except BaseException:
            self.close()
            raise

    def opening(self, opener: Callable[[], Any]) -> Any:
        """`opener()`, the destination's open; again with the files in memory if no descriptor was left for it."""
        try:
            return opener()
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE) or not any(isinstance(p, _Source) for p in self.items):
                raise
        for i, part in enumerate(self.items):
            if isinstance(part, _Source):
                self.items[i] = part.read_and_close()
        return opener()

    def write(self, fd: int) -> None:
        for part in self.items:
            if isinstance(part, _Source):
                _copy_file(fd, part.fd)
            else:
                _write_all(fd, part)

    def close(self) -> None:
        for part in self.items:
            if isinstance(part, _Source):
                part.close()


def append_text(path: str, data: str | bytes) -> None:
    """Append `data` to `path` (created if new): an open descriptor or a device is written through, a FIFO
    without blocking, a link only where the kernel's own rule would follow it."""
    raw = data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data
    fd_target = descriptor(path)
    if fd_target is not None:
        parts = _Parts((raw,))
        _write_descriptor(path, fd_target, parts)
        return
    real = resolve(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = open_through(real, flags, 0o666)
    try:
        _write_all(fd, raw)
    finally:
        os.close(fd)


def open_through(path: str, flags: int, mode: int = 0o666) -> int:
    """os.open that never blocks on a FIFO: its open waits at most FIFO_WAIT_S for a reader (NoReader after),
    and the descriptor stays non-blocking, so a write waits for the reader in _write_all, bounded too."""
    nonblock = getattr(os, "O_NONBLOCK", 0)
    deadline = time.monotonic() + FIFO_WAIT_S
    while True:
        try:
            fd = os.open(path, flags | nonblock, mode)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: a FIFO with no reader (or a device that is not there)
                raise
            try:
                fifo = stat.S_ISFIFO(os.stat(path).st_mode)
            except OSError:
                fifo = False
            if not fifo:
                raise
            if time.monotonic() >= deadline:
                raise NoReader(f"no process is reading the FIFO {path}") from None
            time.sleep(0.01)
    if nonblock and not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.set_blocking(fd, True)  # a device or file: as an ordinary open would have it
    return fd


def _write_descriptor(path: str, target: tuple[int | None, int], parts: _Parts) -> None:
    pid, n = target
    if pid is None:  # our own descriptor: write at its offset, after what is already there
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None and stream.fileno() == n:
                    stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        parts.write(n)
        return
    fd = parts.opening(lambda: os.open(path, os.O_WRONLY | os.O_APPEND))  # another process's: appended, never truncated
    try:
        parts.write(fd)
    finally:
        os.close(fd)


def _copy_file(fd: int, src: int) -> None:
    """The file open at `src` written whole to `fd` at its offset: by `copy_file_range` (in the kernel, file to
    file on Linux), and what it could not copy (another system, a FIFO, a device, a file system that refuses)
    read and written."""
    size = os.fstat(src).st_size
    done = 0
    if hasattr(os, "copy_file_range"):
        try:
            while done < size:
                n = os.copy_file_range(src, fd, size - done, done)
                if n == 0:
                    break
                done += n
        except OSError:
            pass  # the rest below, from where the kernel stopped
    while chunk := os.pread(src, 1 << 20, done):
        _write_all(fd, chunk)
        done += len(chunk)


def _write_all(fd: int, raw: bytes) -> None:
    view = memoryview(raw)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:  # a non-blocking FIFO whose reader has not taken the last write yet
            if not _writable_within(fd, FIFO_STALL_S):
                raise NoReader(f"the FIFO's reader took nothing for {FIFO_STALL_S:.0f} s") from None


def _writable_within(fd: int, seconds: float) -> bool:
    import select  # only for a FIFO whose reader is slower than the writer

    if hasattr(select, "poll"):  # select() cannot take a descriptor past FD_SETSIZE (1024)
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return bool(poller.poll(seconds * 1000))
    return bool(select.select([], [fd], [], seconds)[1])


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
