"""The agent: the only code that runs inside the profiled program.

Standard library only, and it imports nothing of energyprof's beyond this package, so the
bootstrap (`_boot/sitecustomize.py`) can load it by path before the program's folder is on
`sys.path`. `sampler.py` is the one hidden sampler thread (the in-process collector's, or a
spool's), with `stacks.py` (how a stack is named), `thread_book.py` (the program's threads)
and `own_charge.py` (energyprof's CPU on them); `wire.py` defines the spool records and
`spool.py` writes them; `supervised.py` is a supervised process's agent (window calls, the
supervisor's replies); `hooks.py` wraps fork and `os._exit`; `frames.py` decides which
frames belong to the program.

Siblings are imported by name (`from .wire import esc`), never as `from . import wire`:
loaded by path, this package has no parent in `sys.modules`, and a fromlist on it would go
through `__import__`, which imports energyprof's top package into the program.
"""
