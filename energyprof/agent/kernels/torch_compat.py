"""torch's private surface that the op and kernel capture reads, in one place, with the torch versions
it was tested on. Everything here may change in any torch release: outside TESTED the capture that runs
by default turns itself off with a note (an explicit --gpu-kernels still runs, on the user's word).

- `prof.profiler.kineto_results.events()`: the cycle's events in memory (`_KinetoEvent`: name,
  activity_type, device_resource_id, start/end ns, correlation ids, sequence_nr, fwd_thread_id,
  python_id/python_parent_id, flow fields);
- `prof.profiler.kineto_results.experimental_event_tree()`: its Python calls' `extra_fields.module`
  (`_NNModuleInfo.self_ptr`, the module's id; `cls_name`), so `nn.Module: Linear_0` marks name a module;
- `torch._C._autograd._profiler_enabled()`: whether a profiler (the program's own) is on;
- `torch.profiler.profiler`'s lookup of `hasattr` in its module globals, shadowed during energyprof's own calls so
  that preparing a session does not import `torch._inductor` into the program (`_Quiet`).

- Kineto's log level, a C++ global of torch's library (`libkineto::Logger::severityLevel_`) written
  through ctypes for energyprof's own calls (`_Quiet`);
- wrappers on `torch.autograd.profiler._prepare_profiler` / `_run_on_profiler_start` and
  `torch.autograd.profiler_legacy._enable_profiler_legacy`, so the program's own profiler start ends
  energyprof's window first (`_watch_profiler_starts`).

CPython's private surface the capture uses is here too: `Py_AddPendingCall` through ctypes
(`pending_call`: the optimizer hook registered on the program's main thread, between two of its bytecodes).
"""

from __future__ import annotations

import _thread
import os
import sys

from .frames import MODULE_MARK

# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

# (major, minor) releases the capture was tested on: the CPU build of 2.13 (CI), whose event fields the
# reduction reads; the CUDA path last met real events on 2.x with Kineto's `kineto_results`.
TESTED = ((2, 13),)


def torch_version() -> tuple[int, int] | None:
    torch = sys.modules.get("torch")
    text = str(getattr(torch, "__version__", "") or "")
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def untested() -> str | None:
    """Why the default capture should stay off with this torch (one line), or None where it was tested."""
    version = torch_version()
    if version is None:
        return "the kernel capture is off: torch's version could not be read"
    if version not in TESTED:
        tested = ", ".join(f"{a}.{b}" for a, b in TESTED)
        return (f"the op and kernel capture is off by default with torch {version[0]}.{version[1]} (tested on {tested});"
                " --gpu-kernels runs it all the same")
    return None


def events(prof: Any) -> Any:
    """A finished cycle's events, in memory (no JSON)."""
    return prof.profiler.kineto_results.events()


class ModuleMarks:
    """The cycle's module-call marks (`nn.Module: Linear_0`, one name per module in a session) -> (the module's
    id, its class's name), read from torch's event tree as the reduction asks for them (`get`, as a dict's).

    The tree's children are in time order and a module's mark is named at its first call, nearly always in
    the cycle's first step: the walk, in time order, stops as soon as it has the name asked for, and goes on
    from there for the next. A cycle of 6 GPT-2 steps is read for about its first step (the whole tree was
    25-65 ms). Empty where this torch has no event tree or no module info."""

    def __init__(self, prof: Any) -> None:
        self._found: dict[str, tuple[int, str]] = {}
        try:
            self._todo: list[Any] | None = list(prof.profiler.kineto_results.experimental_event_tree())
            self._todo.reverse()
        except Exception:  # noqa: BLE001 - no event tree in this torch: modules keep their class's name
            self._todo = None

    def get(self, name: str, default: Any = None) -> Any:
        hit = self._found.get(name)
        if hit is None and self._todo:
            hit = self._walk(name)
        return default if hit is None else hit

    def any(self) -> bool:
        """The cycle has a module's mark (the walk goes as far as the first one)."""
        return bool(self._found) or (bool(self._todo) and self._walk(None) is not None)

    def _walk(self, want: str | None) -> tuple[int, str] | None:
        """On through the tree until `want`'s mark (None: any mark) is found or the tree ends."""
        todo, found = self._todo, self._found
        assert todo is not None
        while todo:
            ev = todo.pop()
            try:
                children = list(ev.children)
                if children:
                    children.reverse()
                    todo.extend(children)
                name = ev.name
                # only a module call's Python event carries module info, and torch names it `nn.Module: ...`: the
                # other events (most of a cycle's) are not asked for theirs, nor a module's later calls
                if not name.startswith(MODULE_MARK) or name in found:
                    continue
                module = getattr(ev.extra_fields, "module", None)
                if module is None:
                    continue
                got = found[name] = (int(module.self_ptr), str(module.cls_name))
            except Exception:  # noqa: BLE001 - an event of another shape: skipped
                continue
            if want is None or name == want:
                return got
        return None


def module_marks(prof: Any) -> ModuleMarks:
    """The cycle's module-call marks, read as they are asked for (`ModuleMarks`)."""
    return ModuleMarks(prof)


def profiler_enabled() -> bool:
    """A PyTorch profiler is on in this process (Kineto, legacy, ITT or NVTX)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch._C._autograd._profiler_enabled())
    except Exception:  # noqa: BLE001 - no such call in this torch: go on as before
        return False


def release_cycle(prof: Any) -> None:
    """A reduced cycle's session let go: the next cycle starts a fresh one. torch would otherwise reuse the
    finished session and warn, once per process, that it clears events at each cycle: once energyprof's
    schedule had used that warning up, the program's own profiler would never show it."""
    try:
        prof.profiler = None
    except Exception:  # noqa: BLE001 - another shape: the warning may show (torch's, on energyprof's cycle)
        pass


# Kineto's log level: a global of torch's library (libkineto::Logger::severityLevel_, Itanium-mangled), set
# from KINETO_LOG_LEVEL (else to ERROR) at Kineto's first start; lines at or above it go to stderr.
KINETO_LEVEL_SYMBOL = "_ZN9libkineto6Logger14severityLevel_E"
KINETO_QUIET = 6  # above USDT (5): Kineto's USDT/STAGE lines ("profiler_start") off stderr


class _Quiet:
    """Kineto's own log lines (`USDT: ... profiler_start`) off the program's stderr during energyprof's own
    start, step or stop only, without touching the program's environment: Kineto's level is raised above
    its lines for the call and set back after, to what it was, or to what Kineto set it to inside the
    call (its first start reads KINETO_LOG_LEVEL, or falls to ERROR, just before it logs: torch's start
    hook raises it again there, `_quiet_start`). The program's own profiler logs as under plain python,
    at the level the user chose. Where the level cannot be found (another build), nothing is silenced.
    torch's profiler warnings are not filtered (a filter would hide the program's own): energyprof's calls
    raise none (CPU activity alone without CUDA; each cycle's session let go once reduced, so the next
    cycle's start does not warn, once per process, that events are cleared: torch_compat.release_cycle).

    Nor do energyprof's calls import anything into the program: torch's profiler asks `hasattr(torch,
    "_inductor")` as each session is prepared, and torch's lazy `__getattr__` answers it by importing
    `torch._inductor`, and with it `torch._dynamo` and sympy (1.2 s of CPU on a CPU training step, and a
    program whose `sys.modules` is not plain python's). Inside energyprof's call, on its thread, where the program
    has not imported it, that question reads False, as it would have been answered had the import not been lazy
    (`_not_imported`); a program thread that prepares its own profiler meanwhile gets the real answer. Where the
    environment asks inductor for CUDA graphs (TORCHINDUCTOR_CUDAGRAPHS=1) torch's answer stands: it then keeps
    CUPTI set up for them."""

    depth = 0  # energyprof's calls under way (nested: a stop inside a start hook)
    restore: int | None = None  # the level to set back once the outermost call ends
    shadowed: Any = None  # torch's profiler module while its `hasattr` is energyprof's (the outermost call)
    owner: tuple[int, int] | None = None  # (pid, thread) of that call: the only one its `hasattr` answers

    def __enter__(self) -> None:
        _Quiet.depth += 1
        if _Quiet.depth == 1:
            _quiet_start()
            _Quiet.shadow()

    @staticmethod
    def shadow() -> None:
        """Inside energyprof's outermost call, torch's lazy `_inductor` hidden from its profiler (once torch is
        imported: the whole-run capture's first start imports it inside the call)."""
        if _Quiet.depth and _Quiet.shadowed is None:
            _Quiet.owner = (os.getpid(), _thread.get_ident())
            _Quiet.shadowed = _shadow_lazy_inductor()

    def __exit__(self, *exc: Any) -> None:
        _Quiet.depth -= 1
        if _Quiet.depth:
            return
        if _Quiet.shadowed is not None:
            _Quiet.shadowed.__dict__.pop("hasattr", None)
            _Quiet.shadowed = _Quiet.owner = None
        restore, _Quiet.restore = _Quiet.restore, None
        level = _kineto_level()
        if level is not None and restore is not None and level.value == KINETO_QUIET:
            level.value = restore


def _not_imported(obj: Any, name: str) -> bool:
    """`hasattr` for torch's profiler module during energyprof's call: torch's lazy `_inductor` is there only
    where the program has imported it."""
    if (name == "_inductor" and obj is sys.modules.get("torch") and "torch._inductor" not in sys.modules
            and _Quiet.owner == (os.getpid(), _thread.get_ident())):
        return False
    return hasattr(obj, name)


def _shadow_lazy_inductor() -> Any:
    """torch's profiler module with its `hasattr` shadowed (`_not_imported`), or None where nothing is to do:
    the program imported `torch._inductor` already, the environment asks inductor for CUDA graphs (torch's
    answer then keeps CUPTI set up for them), or the module has a `hasattr` of its own."""
    if "torch" not in sys.modules or "torch._inductor" in sys.modules or os.environ.get("TORCHINDUCTOR_CUDAGRAPHS") == "1":
        return None
    try:
        import torch.profiler.profiler as mod  # energyprof's call is about to import it (the capture's first start)
    except Exception:  # noqa: BLE001 - another torch: its profiler asks what it asks
        return None
    if "hasattr" in mod.__dict__:
        return None
    mod.hasattr = _not_imported
    return mod


def _quiet_start() -> None:
    """Inside energyprof's call: Kineto's level above its lines, the level found kept to set back after.
    Called as the call begins, and from torch's start hook just before a profiler is enabled (after
    Kineto's first start has set its level from the environment)."""
    level = _kineto_level() if _Quiet.depth else None
    if level is not None and level.value != KINETO_QUIET:
        _Quiet.restore = level.value
        level.value = KINETO_QUIET


_LEVEL: list[Any] = []  # [Kineto's level as a ctypes int, or None where it is not found], looked up once


def _kineto_level() -> Any:
    """Kineto's log level in torch's loaded library (none is loaded that is not already); None before torch
    is imported (looked up again later) or where no library holds it."""
    if _LEVEL:
        return _LEVEL[0]
    torch = sys.modules.get("torch")
    if torch is None or not getattr(torch, "__file__", None):
        return None
    found = None
    try:
        import ctypes
        import glob

        libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
        mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 0)
        for path in sorted(glob.glob(os.path.join(libdir, "libtorch_cpu.*"))) + sorted(
                glob.glob(os.path.join(libdir, "lib*kineto*"))) + sorted(glob.glob(os.path.join(libdir, "libtorch*"))):
            try:
                found = ctypes.c_int.in_dll(ctypes.CDLL(path, mode=mode), KINETO_LEVEL_SYMBOL)
                break
            except (OSError, ValueError, AttributeError):
                continue
    except Exception:  # noqa: BLE001 - no ctypes, an odd torch: Kineto's lines are left as they are
        found = None
    _LEVEL.append(found)
    return found


_WATCHED: list[Any] = []  # the capture whose profiler is watched for the program's own starts (one)


def _watch_profiler_starts(capture: Any) -> None:
    """The program starting its own PyTorch profiler while energyprof's records: torch's profile calls
    `torch.autograd.profiler._prepare_profiler` then `_run_on_profiler_start` just before it enables a
    profiler (Kineto; ITT and NVTX the latter only), so energyprof's is stopped there first (each wrapped
    once; the original always runs after, and nothing raises from the wrapper). Two sessions on one
    thread would stop each other, and the program's trace would come back empty."""
    _WATCHED[:] = [capture]
    for module, name in (("torch.autograd.profiler", "_prepare_profiler"),
                         ("torch.autograd.profiler", "_run_on_profiler_start"),
                         ("torch.autograd.profiler_legacy", "_enable_profiler_legacy")):  # the legacy profiler
        mod = sys.modules.get(module)
        original = getattr(mod, name, None)
        if original is not None and not getattr(original, "_energyprof", False):
            setattr(mod, name, _watching(original))


def _watching(original: Callable[..., Any]) -> Callable[..., Any]:
    def watched(*args: Any, **kwargs: Any) -> Any:
        try:
            _quiet_start()  # energyprof's own start (a no-op otherwise): after Kineto's first start set its level
            for cap in _WATCHED:
                cap._program_starts()
        except Exception:  # noqa: BLE001 - never into the program
            pass
        return original(*args, **kwargs)

    watched._energyprof = True  # type: ignore[attr-defined]
    watched.__name__ = getattr(original, "__name__", "watched")
    return watched


# -- CPython -------------------------------------------------------------------------------------------------
# The C callbacks made, one per function, kept: C may call them until the process ends.
_C_CALLBACKS: dict[Callable[[Any], int], Any] = {}


def pending_call(func: Callable[[Any], int]) -> bool:
    """Have the main thread run `func(None)` between two of its bytecodes (CPython's `Py_AddPendingCall`,
    through ctypes); False where CPython's queue is full (ask again later). Raises where this Python has
    no ctypes or no such call."""
    import ctypes

    callback = _C_CALLBACKS.get(func)
    if callback is None:
        callback = _C_CALLBACKS[func] = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(func)
    return bool(ctypes.pythonapi.Py_AddPendingCall(callback, None) == 0)
