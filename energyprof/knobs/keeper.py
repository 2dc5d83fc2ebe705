"""Putting knobs back, guaranteed: in this process at the end, and by a keeper process if this one dies.

The first time energyprof sets a knob it starts a small keeper (`python -m energyprof.knobs.keeper`)
in its own session, holding the read end of a pipe. Before each knob's first change the original
goes down the pipe as one JSON line; after an in-process restore a `restored` line takes it back.
When the pipe closes with originals still held (energyprof exited, raised, was killed, even with
-9: the kernel closes the pipe) the keeper writes them back and exits. The pipe's write end is not
inherited by the profiled program, so only energyprof's own end matters.
"""

from __future__ import annotations

import atexit
import json
import signal
import subprocess
import sys
from typing import IO, Any

from .base import Knob, KnobError


class Keeper:
    """The knobs one process has changed: `set` them through it, `restore` them at the end."""

    def __init__(self) -> None:
        self.changed: list[Knob] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._registered = False

    def _send(self, record: dict[str, Any]) -> None:
        if self._proc is None:
            # its own session: a Ctrl-C or a SIGTERM to energyprof's group must not reach it; started in / with
            # -P so that the program's folder (a json.py of its own) is not on its import path
            safe = ["-P"] if sys.version_info >= (3, 11) else []
            self._proc = subprocess.Popen([sys.executable, *safe, "-m", "energyprof.knobs.keeper"], stdin=subprocess.PIPE,
                                          start_new_session=True, close_fds=True, cwd="/")
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write((json.dumps(record) + "\n").encode())
            self._proc.stdin.flush()
        except OSError as exc:  # the keeper died: changing a knob without it would risk leaving it changed
            raise KnobError(f"the process that restores knobs has gone ({exc.strerror or exc})") from None

    def set(self, knob: Knob, value: float) -> None:
        knob.check(value)
        if knob not in self.changed:
            knob.remember()
            self._send({"hold": knob.restore_record()})  # before the change: a kill -9 right after still restores
            self.changed.append(knob)
        if not self._registered:
            atexit.register(self.restore)
            self._registered = True
        knob.set(value)

    def restore(self) -> list[str]:
        """Every changed knob back to its original; one line per knob that could not be, returned."""
        errors = []
        for knob in reversed(self.changed):
            try:
                knob.restore()
                self._send({"restored": knob.name})
            except KnobError as exc:
                errors.append(str(exc))
        self.changed = []
        return errors

    def close(self) -> None:
        """Restore, then let the keeper go (it has nothing left to hold)."""
        errors = self.restore()
        if self._proc is not None:
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.close()
            except OSError:
                pass
            self._proc.wait()
            self._proc = None
        for line in errors:
            print(f"energyprof: {line}", file=sys.stderr)


def _apply(record: dict[str, Any]) -> None:
    if "files" in record:
        for path, text in record["files"]:
            with open(path, "w") as f:
                f.write(text)
    elif "argv" in record:
        subprocess.run(record["argv"], check=True, timeout=60, stdout=subprocess.DEVNULL)
    else:
        from .registry import find

        find(record["name"])._write(float(record["value"]))


def keep(stream: IO[bytes]) -> int:
    """Hold the originals read from `stream` until it closes, then write back those not yet restored."""
    held: dict[str, dict[str, Any]] = {}
    for line in stream:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if "hold" in msg:
            held.setdefault(msg["hold"]["name"], msg["hold"])
        elif "restored" in msg:
            held.pop(msg["restored"], None)
    failed = 0
    for name, record in held.items():
        try:
            _apply(record)
        except Exception as exc:  # one knob failing must not leave the others changed
            failed += 1
            print(f"energyprof: could not restore {name}: {exc}", file=sys.stderr)
    return 1 if failed else 0


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # only the pipe's end says when to restore
    return keep(sys.stdin.buffer)


if __name__ == "__main__":
    raise SystemExit(main())
