"""A torch module's `forward` frame named by the module's path in its model, and torch's module-call
wrappers folded away, for the sampler's stacks and the capture's backward stacks alike.

A frame whose code is a `forward` with `self` first, and whose `self` is an `nn.Module`, is named
`<path> (<Class>)`: `transformer.h.0.attn (GPT2Attention)`, its path from the root module's
`named_modules()`, the root being the outermost module on the stack; the root itself is
`<Class> (root)`. File and first line stay the forward code's, so the frame of one module instance
is the same frame wherever it shows (its forward, and beneath `[backward]`), and two instances of one
class are two frames. `Module._wrapped_call_impl`, `Module._call_impl` and the hook runners in
torch/nn/modules/module.py are left out of the stacks, so a module's frame follows its caller's.

Stdlib only (it runs in the program, on the sampler's thread): torch is found in `sys.modules`,
never imported. Everything is cached: per code object (is it a candidate), per module class (is it a
Module), per root module (its paths, rebuilt once when a module it does not know shows up).
"""

from __future__ import annotations

import os
import sys
from types import CodeType, FrameType

# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ROOT_TAG = "root"
_MODULE_FILE = os.sep + os.path.join("torch", "nn", "modules", "module.py")
_WRAPPERS = frozenset({"_wrapped_call_impl", "_call_impl", "inner", "_slow_forward"})

_candidate: dict[int, tuple[CodeType, bool]] = {}  # id(code) -> (code, a forward taking self first)
_is_module: dict[type, bool] = {}
_roots: dict[int, tuple[Any, dict[int, str]]] = {}  # id(root) -> (weakref to it, id(module) -> path)
_path_of: dict[int, tuple[str, str, int]] = {}  # id(module) -> (its path, its root's class, the root's size): the largest root's
_MAX_ROOTS = 64


def is_wrapper(code: CodeType) -> bool:
    """torch's module-call plumbing (the call wrappers, the hook runner): not a frame of the program's."""
    return code.co_name in _WRAPPERS and code.co_filename.endswith(_MODULE_FILE)


def wrapper_file(file: str, name: str) -> bool:
    """The same, for a frame known by its file (possibly relative, as the profiler names it) and name."""
    return name in _WRAPPERS and (file.endswith(_MODULE_FILE) or file == _MODULE_FILE[1:])


def candidate(code: CodeType) -> bool:
    """A `forward` whose first argument is `self`: its frame may be a module's (cached per code)."""
    hit = _candidate.get(id(code))
    if hit is None:
        ok = (code.co_name == "forward" and code.co_argcount > 0 and code.co_varnames[:1] == ("self",)
              and not code.co_filename.endswith(_MODULE_FILE))
        hit = _candidate[id(code)] = (code, ok)
    return hit[1]


def module_of(frame: FrameType) -> Any:
    """The `nn.Module` a candidate frame runs `forward` for, or None."""
    try:
        obj = frame.f_locals.get("self")
    except Exception:  # noqa: BLE001 - a frame that cannot show its locals
        return None
    return obj if obj is not None and is_module(obj) else None


def is_module(obj: Any) -> bool:
    klass = type(obj)
    hit = _is_module.get(klass)
    if hit is None:
        mod = sys.modules.get("torch.nn.modules.module")
        base = getattr(mod, "Module", None)
        hit = bool(base is not None and isinstance(obj, base))
        if base is not None:
            _is_module[klass] = hit  # no torch loaded yet: asked again later
    return hit


def _paths(root: Any) -> dict[int, str]:
    """id(module) -> its path under `root` ("" for the root), from the root's named_modules()."""
    try:
        return {id(m): name for name, m in root.named_modules(remove_duplicate=False)}
    except Exception:  # noqa: BLE001 - the program edits its model meanwhile: the root alone, asked again later
        return {id(root): ""}


def learn_root(root: Any) -> dict[int, str]:
    """The paths under `root`, cached (a root's paths are rebuilt when asked for a module they lack)."""
    hit = _roots.get(id(root))
    if hit is not None and hit[0]() is root:
        return hit[1]
    if len(_roots) >= _MAX_ROOTS:
        for key in [k for k, (ref, _) in _roots.items() if ref() is None] or list(_roots)[:1]:
            del _roots[key]
    import weakref  # only once the program runs a model's forward: no other program's start loads it for us

    try:
        ref = weakref.ref(root)
    except TypeError:
        ref = (lambda r: (lambda: r))(None)
    paths = _paths(root)
    _roots[id(root)] = (ref, paths)
    cls = type(root).__name__
    size = len(paths)
    for mid, path in paths.items():
        known = _path_of.get(mid)
        if known is None or known[2] <= size:
            _path_of[mid] = (path, cls, size)
    return paths


def name(module: Any, root: Any) -> str:
    """A module's frame name under `root` (the outermost module on its stack)."""
    if module is root:
        return f"{type(root).__name__} ({ROOT_TAG})"
    paths = learn_root(root)
    path = paths.get(id(module))
    if path is None:  # a module added since: the root's paths once more
        _roots.pop(id(root), None)
        path = learn_root(root).get(id(module))
    if not path:
        return f"{type(module).__name__} ({type(module).__name__})"
    return f"{path} ({type(module).__name__})"


def name_by_id(module_id: int, cls_name: str, root_id: int | None) -> str:
    """A module's frame name from its id alone (the profiler's record of a module call), as `name` gives it
    for a module the sampler or the capture already learnt; else its class's name."""
    if root_id is not None and module_id == root_id:
        hit = _roots.get(root_id)
        obj = hit[0]() if hit is not None else None
        if obj is not None:
            return f"{type(obj).__name__} ({ROOT_TAG})"
        known = _path_of.get(module_id)
        if known is not None and known[0] == "":
            return f"{known[1]} ({ROOT_TAG})"
        return f"{cls_name} ({ROOT_TAG})"
    hit = _roots.get(root_id) if root_id is not None else None
    if hit is not None:
        path = hit[1].get(module_id)
        if path:
            return f"{path} ({cls_name})"
    known = _path_of.get(module_id)
    if known is not None and known[0]:
        return f"{known[0]} ({cls_name})"
    return f"{cls_name} ({cls_name})"


def learn_from_frames(frames: Any) -> None:
    """Roots found in running frames' locals (the training loop's `model`): the capture calls this as a
    cycle ends, so a module the sampler never caught inside its forward still has its path."""
    for f in frames:
        while f is not None:
            try:
                values = list(f.f_locals.values()) if f.f_code.co_flags & 0x2 else ()
            except Exception:  # noqa: BLE001
                values = ()
            for v in values:
                if v is not None and not isinstance(v, (int, float, str, bytes)) and is_module(v):
                    learn_root(v)
            f = f.f_back


def stack_names(codes: list[CodeType], mods: list[FrameType], held: list[Any]) -> list[str | None]:
    """Per code of a stack (outermost first): its module's name where a module's forward runs it. `mods`:
    the stack's candidate frames, innermost first, and `held` their modules (None: not a module's)."""
    by_code: dict[int, list[Any]] = {}
    for f, m in zip(reversed(mods), reversed(held)):  # outermost first, as `codes`
        by_code.setdefault(id(f.f_code), []).append(m)
    out: list[str | None] = []
    root = None
    for c in codes:
        queue = by_code.get(id(c))
        m = queue.pop(0) if queue else None
        if m is not None and root is None:
            root = m
        out.append(name(m, root) if m is not None else None)
    return out
