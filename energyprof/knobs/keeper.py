"""Putting knobs back, guaranteed: every change energyprof makes goes through a Keeper.

The keeper takes each part's original (a file, a device's field: `Part.key`) before its first change,
whichever knob's name the change came under, so two knobs over the same file (`cpu_max_freq:all` and
`cpu_max_freq:0`) share one original. It writes the originals back in reverse order of change.

In this process that happens at `restore()`/`close()` (and atexit). For every other end (a signal's
default action, `os._exit`, kill -9 of the setter) there is a keeper process
(`python -m energyprof.knobs.keeper`), started with the first change in its own session, holding the
read end of a pipe: before each part's first change its original goes down the pipe as one JSON line,
after an in-process restore a `restored` line takes it back. When the pipe closes with originals still
held (the kernel closes it, whatever killed the setter) the keeper process writes them back, newest
first, and exits. The write end is close-on-exec, and a forked child's copy is pointed at /dev/null, so
only the setter's own end keeps the pipe open. The keeper process is detached (its parent is init), so a
profiled program's processes do not include it.

Changes may belong to owners (the privileged reader's clients): a part held by one owner cannot be
changed by another, and `restore(owner)` puts back only that owner's parts.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
from typing import IO, Any, Hashable

from .base import Knob, KnobError, Part


ANY: Any = object()  # restore(): every owner's parts


class _Held:
    __slots__ = ("part", "original", "owner", "name")

    def __init__(self, part: Part, original: str, owner: Hashable, name: str) -> None:
        self.part, self.original, self.owner, self.name = part, original, owner, name


class Keeper:
    """The parts one process has changed: `set` knobs through it, `restore` or `close` it at the end."""

    def __init__(self) -> None:
        self.held: dict[str, _Held] = {}  # part key -> its original; insertion order is the order of change
        self._pipe: IO[bytes] | None = None  # the write end; the keeper process holds the read end
        self._registered = False
        self._lock = threading.RLock()

    # -- the keeper process ------------------------------------------------------------------
    def _start(self) -> None:
        """The keeper process, detached: its own session (a Ctrl-C or a SIGTERM to the setter's group does not
        reach it) and not a descendant of the setter (a profiled program's process list, CPU and energy are
        not charged with energyprof's keeper), started from / with -P so that the program's folder (a
        json.py of its own) is not on its import path, and without the sampler's bootstrap."""
        r, w = os.pipe()
        env = {k: v for k, v in os.environ.items() if k != "ENERGYPROF_AGENT"}
        safe = ["-P"] if sys.version_info >= (3, 11) else []
        argv = [sys.executable, *safe, "-m", "energyprof.knobs.keeper"]
        try:
            # a bare interpreter (-S: no site, a few ms) forks the keeper and leaves at once: the keeper's
            # parent becomes init, and it holds the pipe's read end as its stdin
            launcher = subprocess.Popen([sys.executable, "-S", *safe, "-c", _DETACH, *argv], stdin=r, env=env,
                                        start_new_session=True, close_fds=True, cwd="/")
            launcher.wait()
        finally:
            os.close(r)
        self._pipe = os.fdopen(w, "wb")
        os.register_at_fork(after_in_child=self._forget_in_child)

    def _forget_in_child(self) -> None:
        """A forked child (a DataLoader worker) must not keep the pipe open after the setter is gone."""
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            try:  # the descriptor now points at /dev/null: the file object stays valid, its later close harmless
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, pipe.fileno(), inheritable=False)
                os.close(null)
            except OSError:
                pass
            self._orphan = pipe
        self.held = {}

    def _send(self, record: dict[str, Any]) -> None:
        if self._pipe is None:
            self._start()
        assert self._pipe is not None
        try:
            self._pipe.write((json.dumps(record) + "\n").encode())
            self._pipe.flush()
        except (OSError, ValueError) as exc:  # the keeper died: changing a knob without it would risk leaving it changed
            raise KnobError(f"the process that restores knobs has gone ({getattr(exc, 'strerror', None) or exc})") from None

    # -- changes -------------------------------------------------------------------------------
    def set(self, knob: Knob, value: float, owner: Hashable = None) -> None:
        """Check `value`, keep the original of every part the knob writes that is not held yet, then write."""
        knob.check(value)
        with self._lock:
            parts = knob.parts()
            for part in parts:
                held = self.held.get(part.key)
                if held is not None and held.owner != owner:
                    raise KnobError(f"{knob.name} is set by another client until it disconnects")
            new = []
            try:
                for part in parts:
                    if part.key in self.held:
                        continue
                    original = part.read()
                    record = part.record(original)
                    if record is not None:  # before the change: a kill -9 right after still restores
                        self._send({"hold": part.key, "restore": record})
                    self.held[part.key] = _Held(part, original, owner, knob.name)
                    new.append(part.key)
                if not self._registered:
                    atexit.register(self.close)
                    self._registered = True
                knob._write(value)
            except BaseException:
                # refused (no permission, a binding's error): what this call changed goes back, and is not held
                for key in new:
                    try:
                        self.held[key].part.write(self.held[key].original)
                    except Exception:  # noqa: BLE001 - the refusal above is the error to report
                        pass
                self._forget(new)
                raise

    def _forget(self, keys: list[str]) -> None:
        for key in keys:
            self.held.pop(key, None)
            if self._pipe is not None:
                try:
                    self._send({"restored": key})
                except KnobError:
                    pass

    def release(self, owner: Hashable) -> None:
        """Leave `owner`'s parts as they are now (an optimizer told to keep its choice): nothing restores them."""
        with self._lock:
            self._forget([k for k, h in self.held.items() if h.owner == owner])

    def restore(self, owner: Hashable = ANY, knob: Knob | None = None) -> list[str]:
        """The originals back, newest change first: every part held, or those of `owner` (and of `knob`
        only, when given). One line per part that could not be restored, returned."""
        errors = []
        with self._lock:
            keys = {p.key for p in knob.parts()} if knob is not None else None
            for key in reversed(list(self.held)):
                held = self.held[key]
                if owner is not ANY and held.owner != owner:
                    continue
                if keys is not None and key not in keys:
                    continue
                try:
                    held.part.write(held.original)
                except KnobError as exc:
                    errors.append(str(exc))
                    continue
                except Exception as exc:  # noqa: BLE001 - a device's binding raising its own error: said, not raised
                    errors.append(f"{held.name}: could not restore {key}: {exc}")
                    continue
                del self.held[key]
                if self._pipe is not None:
                    try:
                        self._send({"restored": key})
                    except KnobError:
                        pass  # the keeper process is gone; the part is back anyway
        return errors

    def close(self) -> None:
        """Restore everything, then let the keeper process go (it has nothing left to hold)."""
        errors = self.restore()
        with self._lock:
            pipe, self._pipe = self._pipe, None
        if pipe is not None:
            try:
                pipe.close()  # the keeper process reads the end, has nothing held, and exits
            except OSError:
                pass
        for line in errors:
            print(f"energyprof: {line}", file=sys.stderr)


_shared: Keeper | None = None


def shared() -> Keeper:
    """This process's keeper (the in-program optimizer's, and any other setter in the program)."""
    global _shared
    if _shared is None:
        _shared = Keeper()
    return _shared


# ---------------------------------------------------------------- the keeper process

# Run by `python -S -c`: fork the keeper (argv[1:]) and leave; the keeper keeps stdin (the pipe's read end).
_DETACH = "import os, sys\nif os.fork() == 0:\n    os.execv(sys.argv[1], sys.argv[1:])\nos._exit(0)\n"


def _apply(record: dict[str, Any]) -> None:
    if "files" in record:
        for path, text in record["files"]:
            with open(path, "w") as f:
                f.write(text)
    elif "argv" in record:
        subprocess.run(record["argv"], check=True, timeout=60, stdout=subprocess.DEVNULL)
    elif "nvml" in record:
        from .nvml import restore_limit

        restore_limit(record["nvml"], record["mw"], record["binding"])
    else:
        from .registry import find

        find(record["name"])._write(float(record["value"]))


def keep(stream: IO[bytes]) -> int:
    """Hold the originals read from `stream` until it closes, then write back those not yet restored,
    newest first."""
    held: dict[str, dict[str, Any]] = {}
    for line in stream:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if "hold" in msg:
            held.setdefault(msg["hold"], msg["restore"])  # the first original of a part is the one kept
        elif "restored" in msg:
            held.pop(msg["restored"], None)
    failed = 0
    for key in reversed(list(held)):
        try:
            _apply(held[key])
        except Exception as exc:  # noqa: BLE001 - one part failing must not leave the others changed
            failed += 1
            print(f"energyprof: could not restore {key}: {exc}", file=sys.stderr)
    return 1 if failed else 0


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # only the pipe's end says when to restore
    return keep(sys.stdin.buffer)


if __name__ == "__main__":
    raise SystemExit(main())
