"""Units of work of the engines that reuse one worker process for many tasks (Ray, Dask), and the
route's node that roots a web request's handler (`note_endpoint`, at the end).

A Ray worker runs task after task from `Worker.main_loop`, an actor's methods from its method
executor; a Dask worker runs each task from `_run_task` on a thread of its pool. The worker's
life is not the unit a user asks about: each task is. A sampled stack that runs inside such an
executor is therefore rooted at a node for its task, named for the function the engine called:

    [ray task NAME]      a Ray remote function
    [ray actor CLS.m]    a Ray actor's method
    [dask task NAME]     a Dask task (NAME is the called function: the key's prefix for
                         `submit`, `map` and `delayed`, which name keys after it)

with the task's own functions beneath. The engine's dispatch frames above the task (the worker's
loop, its executor, the pool thread's bootstrap) are dropped: they are the same for every task,
and a worker waiting for its next task keeps them, so its idle time stays apart from its tasks.
Detection reads file names and function names only (the agent is stdlib only, and a stack is
walked once, when it is first seen), so nothing of Ray or Dask is imported.
"""

from __future__ import annotations

import os

Frame = tuple[str, str, int]

_SEP = os.sep
_STDLIB = os.path.dirname(os.__file__) + os.sep
# An installed package's files: a user's own folder may be called ray (Ray's images run as
# user `ray`, in /home/ray), but only an installed engine sits under site- or dist-packages.
_RAY = (f"-packages{_SEP}ray{_SEP}",)
_DASK = (f"-packages{_SEP}distributed{_SEP}", f"-packages{_SEP}dask{_SEP}")
# (engine, kind, file part, executor function) -> the frames after it, down to the first
# frame that is not the engine's, are the engine's dispatch of one unit.
_EXECUTORS: tuple[tuple[str, str, str, str], ...] = (
    ("ray", "actor", f"{_SEP}ray{_SEP}_private{_SEP}function_manager.py", "actor_method_executor"),
    ("ray", "task", f"{_SEP}ray{_SEP}_private{_SEP}worker.py", "Worker.main_loop"),
    ("dask", "task", f"{_SEP}distributed{_SEP}worker.py", "_run_task"),
    ("dask", "task", f"{_SEP}distributed{_SEP}worker.py", "_run_task_simple"),
    ("dask", "task", f"{_SEP}distributed{_SEP}worker.py", "apply_function"),
)
UNIT_PREFIXES = ("[ray task ", "[ray actor ", "[dask task ")


def _engine_file(engine: str, filename: str) -> bool:
    return any(part in filename for part in (_RAY if engine == "ray" else _DASK))


def _executor(frame: Frame) -> tuple[str, str] | None:
    name, filename, _ = frame
    for engine, kind, part, func in _EXECUTORS:
        if filename.endswith(part) and (name == func or name.endswith("." + func)):
            return engine, kind
    return None


def _loading(frame: Frame) -> bool:
    """A module body or a module's lazy `__getattr__`: the engine importing what a task needs
    (Ray unpickles a task's function, and its imports, from inside its loop), not a task."""
    name, filename, _ = frame
    # Ray's loop also calls installed libraries itself (msgpack's packb, dataclasses while it
    # unpickles): a first frame in site- or dist-packages or the standard library is the engine's
    # work, and so is code those libraries generate with exec (a namedtuple's or a dataclass's
    # methods, a lambda: in "<string>", named `__x__` or `<lambda>`), never a task's function.
    return (name in ("<module>", "__getattr__") or filename.startswith("<frozen")
            or f"-packages{os.sep}" in filename or filename.startswith(_STDLIB) or _generated(name, filename))


def _generated(name: str, filename: str) -> bool:
    """Code a library made with exec. A task's own function may be in "<string>" too (a job given
    to `python -c`), so only the names libraries give such code count: a lambda, a dunder method,
    and Cython's patches of `inspect` and `asyncio` (`cy_wrap.<locals>.cy_isgenerator` and its
    siblings), which compiled modules such as Ray's `_raylet` install at import: Ray's loop calls
    `inspect.isgenerator` on each task's function and result, so a sample can catch it there."""
    if filename != "<string>":
        return False
    last = name.rpartition(".")[2]
    return last == "<lambda>" or (last.startswith("__") and last.endswith("__")) or name.startswith("cy_wrap.<locals>.")


def unit_name(engine: str, kind: str, function: str) -> str:
    return f"[{engine} {kind} {function}]"


def units(frames: list[Frame]) -> list[Frame]:
    """The stack rooted at its unit of work, or unchanged when it runs no engine's task and no route's
    handler.

    The innermost executor wins: an actor's method executor sits below the worker's loop, and
    a task that itself runs an engine's task locally is named for the inner one.
    """
    found = None
    for i, frame in enumerate(frames):
        hit = _executor(frame)
        if hit is not None:
            found = (i, *hit)
    if found is None:
        return _in_route(frames) if _endpoints else frames
    i, engine, kind = found
    j = i + 1
    while j < len(frames) and _engine_file(engine, frames[j][1]):
        j += 1
    if j >= len(frames) or _loading(frames[j]):
        return frames  # the executor itself is running (between tasks, or loading a task's code): no unit
    return [(unit_name(engine, kind, frames[j][0]), "", 0), *frames[j:]]


# -- web requests ---------------------------------------------------------------------------------
REQUEST_PREFIX = "[request "
# A route's handler, as a frame names it -> `[request GET /items/{item_id}]`: a stack that runs it is
# rooted there (the first route that named a handler keeps it), so a route's work is one node whether
# it ran on the event loop or on a worker thread. Learnt when routing first chooses the route, before
# the handler runs: its stacks are first seen (and named, once) after that.
_endpoints: dict[Frame, str] = {}


def note_endpoint(func: object, route: str) -> None:
    """Routing chose `func` (a route's handler, decorators unwrapped) for `route`."""
    for _ in range(8):
        inner = getattr(func, "__wrapped__", None)
        if inner is None:
            break
        func = inner
    code = getattr(func, "__code__", None)
    if code is None:
        return
    key = (code.co_qualname if hasattr(code, "co_qualname") else _learnt(func, code), code.co_filename,
           code.co_firstlineno)
    if key not in _endpoints:
        _endpoints[key] = f"{REQUEST_PREFIX}{route}]"


def _learnt(func: object, code: object) -> str:
    from .qualnames import learn_function, qualname  # 3.10: names learnt from the function object

    learn_function(func)  # type: ignore[arg-type]
    return qualname(code)  # type: ignore[arg-type]


def _in_route(frames: list[Frame]) -> list[Frame]:
    for j, frame in enumerate(frames):
        node = _endpoints.get(frame)
        if node is not None:
            return [(node, "", 0), *frames[j:]]
    return frames


# -- which request a sample ran -------------------------------------------------------------------
# Which request a sample ran, the sampler asks here (`unit_of`) for a stack that may run one (holding a registered
# frame's code); on a thread a request holds, every sample is that request's. A request runs where its frames are
# (agent/requests.py registers them as the request begins and forgets them as it ends), so its samples are all its
# work (routing, middleware, its handler, its response), and no other's:
#   on an event loop, its application's outermost coroutine frame, and the coroutine frame of each route's
#   `handle` (a middleware may run the route in a task of its own): a task's frames are on the loop's
#   stack only while that task runs, so a request that awaits is sampled in none of them;
#   in anyio's thread pool (a sync handler, dependency or response validation of Starlette's or FastAPI's), the
#   worker thread, for as long as it runs a call the request handed it (agent/in_request.py);
#   on a WSGI server's thread, the thread itself, for as long as the request runs there.
# Nothing here reads a frame's locals: on Python <= 3.12 that leaves a snapshot of them on the frame, which would
# keep the program's objects alive after the program dropped them.
# A unit is the request's window index as it began (agent/window_facts.PENDING): -1, none.
running_frames: dict[int, tuple[object, int]] = {}  # id(frame) -> (the frame, kept alive so its id stays its own; unit)
# The code of every frame ever registered (an application's `__call__`, a route's `handle`): a stack that runs one
# may run a request, so the sampler asks `unit_of` for it (learnt before any such stack is seen: a request's frame
# is registered before its coroutine first runs)
running_codes: dict[int, object] = {}
running_threads: dict[int, int] = {}  # thread ident -> unit


def unit_of(ident: int, frame: object) -> int:
    """The unit the thread `ident` runs with `frame` innermost: its request's index, or -1 where none is known."""
    f = frame
    while f is not None:
        hit = running_frames.get(id(f))
        if hit is not None and hit[0] is f:
            return hit[1]
        f = f.f_back  # type: ignore[attr-defined]
    return running_threads.get(ident, -1)
