"""torch's private surface in agent/kernels/torch_compat.py, on stand-ins for what torch hands back: the module
marks read lazily from the event tree, and the `hasattr` energyprof's own profiler calls see."""

from __future__ import annotations

import random
import sys
import threading
import types

import pytest

from energyprof.agent.kernels import torch_compat
from energyprof.agent.kernels.frames import MODULE_MARK


class _Module:
    def __init__(self, ptr: int, cls: str) -> None:
        self.self_ptr, self.cls_name = ptr, cls


class _Ev:
    def __init__(self, name: str, children: list[_Ev], module: _Module | None = None, broken: bool = False) -> None:
        self.name, self._children, self._broken = name, children, broken
        self.extra_fields = types.SimpleNamespace(module=module) if module is not None else types.SimpleNamespace()

    @property
    def children(self) -> list[_Ev]:
        if self._broken:
            raise RuntimeError("an event of another shape")
        return self._children


def _prof(roots: list[_Ev]) -> object:
    results = types.SimpleNamespace(experimental_event_tree=lambda: roots)
    return types.SimpleNamespace(profiler=types.SimpleNamespace(kineto_results=results))


def _tree(rng: random.Random, depth: int = 0) -> list[_Ev]:
    out = []
    for _ in range(rng.randint(0, 4 if depth < 4 else 0)):
        k = rng.randint(0, 9)
        if k < 3:  # a module's call: a mark named per module, carrying its id
            n = rng.randint(0, 5)
            ev = _Ev(f"{MODULE_MARK}Linear_{n}", _tree(rng, depth + 1), _Module(1000 + n, "Linear"))
        elif k == 3:  # a mark without module info
            ev = _Ev(f"{MODULE_MARK}Odd_{rng.randint(0, 2)}", _tree(rng, depth + 1))
        elif k == 4 and depth:
            ev = _Ev("aten::mm", [], broken=True)
        else:
            ev = _Ev(rng.choice(["aten::addmm", "train.py(3): step", "<built-in method len>"]), _tree(rng, depth + 1))
        out.append(ev)
    return out


def _full_walk(roots: list[_Ev]) -> dict[str, tuple[int, str]]:
    """What the reduction was given before: every mark of the whole tree."""
    out: dict[str, tuple[int, str]] = {}
    todo = list(roots)
    while todo:
        ev = todo.pop()
        try:
            todo.extend(ev.children)
        except RuntimeError:
            continue
        module = getattr(ev.extra_fields, "module", None)
        if ev.name.startswith(MODULE_MARK) and module is not None:
            out[ev.name] = (module.self_ptr, module.cls_name)
    return out


def test_module_marks_read_lazily_are_the_whole_trees() -> None:
    """On 500 random trees, asked in any order, for names there and not there, the lazy walk answers what the
    whole tree holds; `any()` says whether it holds a mark at all, asked first or after a walk to the end."""
    for seed in range(500):
        rng = random.Random(seed)
        roots = _tree(rng)
        want = _full_walk(roots)
        marks = torch_compat.module_marks(_prof(roots))
        asked = [*want, f"{MODULE_MARK}Absent_0", f"{MODULE_MARK}Odd_1"]
        rng.shuffle(asked)
        if rng.random() < 0.5:
            assert marks.any() == bool(want), seed
        for name in asked:
            assert marks.get(name) == want.get(name), (seed, name)
        assert marks.any() == bool(want), seed


def test_module_marks_without_an_event_tree_are_empty() -> None:
    def no_tree() -> list[_Ev]:
        raise AttributeError("no event tree in this torch")

    prof = types.SimpleNamespace(profiler=types.SimpleNamespace(
        kineto_results=types.SimpleNamespace(experimental_event_tree=no_tree)))
    marks = torch_compat.module_marks(prof)
    assert not marks.any() and marks.get(f"{MODULE_MARK}Linear_0") is None


class _LazyTorch(types.ModuleType):
    """torch's lazy modules: asking for `_inductor` imports it (here: counts the asking)."""

    asked = 0

    def __getattr__(self, name: str) -> object:
        if name == "_inductor":
            _LazyTorch.asked += 1
            return types.ModuleType("torch._inductor")
        raise AttributeError(name)


@pytest.fixture
def lazy_torch(monkeypatch: pytest.MonkeyPatch) -> _LazyTorch:
    fake = _LazyTorch("torch")
    profiler_mod = types.ModuleType("torch.profiler.profiler")
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setitem(sys.modules, "torch.profiler", types.ModuleType("torch.profiler"))
    monkeypatch.setitem(sys.modules, "torch.profiler.profiler", profiler_mod)
    monkeypatch.delitem(sys.modules, "torch._inductor", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CUDAGRAPHS", raising=False)
    monkeypatch.setattr(torch_compat, "_kineto_level", lambda: None)
    _LazyTorch.asked = 0
    return fake


def test_energyprofs_call_hides_the_lazy_compiler_from_its_own_thread_only(lazy_torch: _LazyTorch) -> None:
    profiler_mod = sys.modules["torch.profiler.profiler"]
    seen: list[bool] = []
    with torch_compat._Quiet():
        ask = profiler_mod.hasattr  # the profiler module's global: what its `prepare_trace` calls
        assert ask(lazy_torch, "_inductor") is False and _LazyTorch.asked == 0
        assert ask(lazy_torch, "version") is False  # every other question: the builtin's answer
        other = threading.Thread(target=lambda: seen.append(ask(lazy_torch, "_inductor")))
        other.start()
        other.join()
    assert seen == [True] and _LazyTorch.asked == 1  # a program thread's own profiler: torch's real answer
    assert "hasattr" not in vars(profiler_mod)  # put back once energyprof's call ends


def test_cuda_graphs_asked_of_the_compiler_keep_torchs_answer(lazy_torch: _LazyTorch,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """TORCHINDUCTOR_CUDAGRAPHS=1: torch reads the compiler's setting to keep CUPTI set up for CUDA graphs."""
    monkeypatch.setenv("TORCHINDUCTOR_CUDAGRAPHS", "1")
    with torch_compat._Quiet():
        assert "hasattr" not in vars(sys.modules["torch.profiler.profiler"])
