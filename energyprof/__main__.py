"""`python -m energyprof`: the command line, with the current folder taken off sys.path first.

`python -m` puts the current folder first on sys.path; the program's files (a json.py, an
argparse.py) must never stand in for the modules energyprof imports. The package's
`__init__` imports nothing, so this runs before any import that could be shadowed (`sys` is
built in, `os` already loaded), as pip's `__main__` does.
"""

import gc
import os
import sys

# Start-up makes tens of thousands of objects that live as long as the process (modules, classes,
# functions) and almost no garbage: the cyclic collector's passes over them were about 5 ms of
# every run. The command line turns it back on (cli.main), for `run` once the program starts.
gc.disable()

# sys.flags.safe_path (-P) is 3.11's; before it the folder is always first under -m.
if not getattr(sys.flags, "safe_path", False) and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from .cli import main  # noqa: E402


def _leave(code: int) -> None:
    """End with `code`, the program's status, as Python's exit would, less its last step: the teardown
    of every module and object the run made (5 ms of CPU on an empty script, after the program has ended).
    What comes before it is done here, in its order: no thread left to wait for (else the ordinary exit),
    the exit handlers (MLflow's, coverage's, a .pth file's) run, stdout and stderr flushed."""
    import atexit
    import threading

    run_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_handlers is None or any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        raise SystemExit(code)
    run_handlers()  # each once: the list is empty afterwards, so an ordinary exit below runs none twice
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except Exception:  # noqa: BLE001 - a closed pipe: Python's own exit reports it, as it would have
        raise SystemExit(code) from None
    os._exit(code)


if __name__ == "__main__":
    _leave(main())
