"""Backward's CPU work on the modules that caused it: the sampled tree's autograd-engine energy moved
beneath `[backward]`, onto the forward stacks whose ops backward differentiated. Pure.

On the CPU, autograd runs backward's ops inside C++ on the thread that called `backward()`: the sampler
sees `Tensor.backward > ... > _engine_run_backward` and nothing below. In the steps the op capture
profiled, each outermost backward op (an `evaluate_function: XBackward0` and all it holds) was timed and
linked to the forward op it differentiates (agent/kernels/autograd.py); its time went to the tree path
`caller > [backward] > the forward op's module frames and operators` (agent/kernels/reduce.py
`backward_time`), or `[backward] > torch::autograd::AccumulateGrad` and the like where no forward op
exists. Here each engine node's self figures (energy under both idle policies, time, CPU time, samples)
are split among those paths in the proportions of that measured time, and put beneath a `[backward]`
child of the engine node. Energy is moved, never made: the engine node keeps none, the paths get all.

The proportions come from the profiled steps; samples of the steps not profiled are split the same way
(extrapolated): the note says so, with the share of backward's sampled time the profiled steps measured.
A sample taken inside backward() in a profiled step goes to the backward ops that ran over its tick, each
by its time there; what no op covered of that tick is split with the rest.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..facts.profile import Node, Note
from ..agent.kernels.autograd import BACKWARD_FRAME
from ..agent.kernels.frames import Frame, Path
from ..agent.kernels.reduce import FASTEST_RUN, FORWARD_OPS, is_module_frame

ENGINE_FUNCTIONS = ("_engine_run_backward",)  # torch/autograd/graph.py: the last Python frame of backward()
ENGINE_FILE_TAIL = "graph.py"
MAX_PATHS = 20_000  # paths kept (bounded by the model's lines and modules, never by steps)


class BackwardFold:
    """Backward's CPU ns per tree path over the run's profiled steps."""

    def __init__(self, max_paths: int = MAX_PATHS) -> None:
        self.ns: dict[Path, float] = {}
        self.max_paths = max_paths
        self.dropped_ns = 0.0
        # a sample taken inside backward() in a captured step -> the paths of the backward ops in its span, with
        # their shares of the span (what they leave stays with the engine)
        self.samples: dict[int, dict[Path, float]] = {}
        self._runs: dict[Path, tuple[int, float]] = {}  # path -> (runs, fastest run ns) over all cycles

    def sample(self, k: int, path: Path, share: float = 1.0) -> None:
        shares = self.samples.setdefault(k, {})
        shares[path] = shares.get(path, 0.0) + share

    def add(self, path: Path, ns: float) -> None:
        """A cycle's time on a path (its fastest run there x its runs)."""
        if ns <= 0:
            return
        if path not in self.ns and len(self.ns) >= self.max_paths:
            self.dropped_ns += ns  # past the bound: its time is not in the proportions (said in the note)
            return
        self.ns[path] = self.ns.get(path, 0.0) + ns

    def runs(self, path: Path, names: dict[str, Any]) -> None:
        """A cycle's runs on a path and its fastest run there (`FASTEST_RUN`): the path's time becomes the
        fastest run over all cycles x all runs. Op times are wall times: on a busy machine a run the OS held
        off the CPU holds that wait; the more runs the fastest is taken over, the less likely all were held."""
        got = names.get(FASTEST_RUN)
        if got is None or path not in self.ns:
            return
        count, fastest = int(got[0]), float(got[1])
        cur = self._runs.get(path)
        self._runs[path] = (count, fastest) if cur is None else (cur[0] + count, min(cur[1], fastest))
        n, best = self._runs[path]
        self.ns[path] = n * best

    def __bool__(self) -> bool:
        return bool(self.ns) or bool(self.samples)

    def forward_by_root(self) -> dict[Frame, dict[Path, float]]:
        """The root module's frame -> (the stack from it to the module whose forward called the ops -> ns)."""
        out: dict[Frame, dict[Path, float]] = {}
        for path, ns in self.ns.items():
            if not path or path[-1] != FORWARD_OPS:
                continue
            i = next((k for k, f in enumerate(path) if is_module_frame(f)), None)
            if i is None:
                continue
            rel = out.setdefault(path[i], {})
            rel[path[i + 1:-1]] = rel.get(path[i + 1:-1], 0.0) + ns
        return out

    def by_caller(self) -> dict[Path, dict[Path, float]]:
        """caller frames -> (the path below `[backward]` -> ns)."""
        out: dict[Path, dict[Path, float]] = {}
        for path, ns in self.ns.items():
            if BACKWARD_FRAME not in path:
                continue
            i = path.index(BACKWARD_FRAME)
            rel = out.setdefault(path[:i], {})
            rel[path[i + 1:]] = rel.get(path[i + 1:], 0.0) + ns
        return out


def is_engine(node: Node) -> bool:
    return node.function.endswith(ENGINE_FUNCTIONS) and node.file.endswith(ENGINE_FILE_TAIL)


def same_frame(node: Node, frame: Frame) -> bool:
    """A sampled node (qualified name, full path) and a profiler frame (code name, path less its sys.path
    entry) are one frame: same first line, the name or its last part, the file or its tail."""
    fn, file, line = frame
    if node.function != fn and not node.function.endswith("." + fn):
        return False
    if node.file != file and not (file and node.file.endswith(("/" + file, "\\" + file))):
        return False
    return node.line == line or fn == "<module>"


def _engines(root: Node, with_self: bool = True) -> list[tuple[list[Node], Node]]:
    """The engine nodes (with self figures, unless `with_self` is False), each with the nodes above it
    (root first, itself last)."""
    out = []
    todo: list[tuple[Node, list[Node]]] = [(root, [])]
    while todo:
        node, above = todo.pop()
        chain = above + [node]
        if is_engine(node) and (not with_self or any(node.self_energy_j.values()) or node.self_time_s):
            out.append((chain, node))
        todo.extend((c, chain) for c in node.children if not c.is_special)
    return out


def _score(chain: list[Node], caller: Path) -> int:
    """How many of the caller's frames the sampled chain holds."""
    return sum(1 for f in caller if any(same_frame(n, f) for n in chain))


def _names(root: Node) -> dict[tuple[str, int], list[str]]:
    """(file, first line) -> the sampled tree's names of that frame, so a profiler frame is named as the
    sampler names it (qualified name) and a module's frame is the same frame forward and backward."""
    out: dict[tuple[str, int], list[str]] = {}
    todo = [root]
    while todo:
        node = todo.pop()
        if node.file:
            names = out.setdefault((node.file, node.line), [])
            if node.function not in names:
                names.append(node.function)
        todo.extend(node.children)
    return out


def _as_sampled(frame: Frame, names: dict[tuple[str, int], list[str]]) -> Frame:
    fn, file, line = frame
    for name in names.get((file, line), ()):
        if name == fn or name.endswith("." + fn):
            return (name, file, line)
    return frame


def _child(node: Node, frame: Frame) -> Node:
    for c in node.children:
        if (c.function, c.file, c.line) == frame:
            return c
    child = Node(function=frame[0], file=frame[1], line=frame[2], other_policy_self_energy_j={})
    node.children.append(child)
    return child


def _move(src: Node, targets: list[tuple[Node, float]]) -> None:
    """The source's self figures shared among targets by weight (weights sum to 1); samples by largest remainder."""
    for sid, e in list(src.self_energy_j.items()):
        for node, w in targets:
            node.self_energy_j[sid] = node.self_energy_j.get(sid, 0.0) + e * w
        src.self_energy_j[sid] = 0.0
    other = src.other_policy_self_energy_j
    if other is not None:
        for sid, e in list(other.items()):
            for node, w in targets:
                if node.other_policy_self_energy_j is None:
                    node.other_policy_self_energy_j = {}
                node.other_policy_self_energy_j[sid] = node.other_policy_self_energy_j.get(sid, 0.0) + e * w
            other[sid] = 0.0
    for node, w in targets:
        node.self_time_s += src.self_time_s * w
        node.self_cpu_time_s += src.self_cpu_time_s * w
    src.self_time_s = src.self_cpu_time_s = 0.0
    quotas = [(src.self_samples * w, i) for i, (_, w) in enumerate(targets)]
    given = [int(q) for q, _ in quotas]
    left = src.self_samples - sum(given)
    for _, i in sorted(quotas, key=lambda qi: -(qi[0] - int(qi[0])))[:max(0, left)]:
        given[i] += 1
    for (node, _), n in zip(targets, given):
        node.self_samples += n
    src.self_samples = 0


def split(engine: Node, shares: dict[Path, float], names: dict[tuple[str, int], list[str]]) -> None:
    """One engine node's self figures onto `[backward]` > each path, in proportion to its ns."""
    total = sum(shares.values())
    if total <= 0:
        return
    _move(engine, _targets(_child(engine, BACKWARD_FRAME), shares, total, names))


def _targets(base: Node, shares: dict[Path, float], total: float, names: dict[tuple[str, int], list[str]]
             ) -> list[tuple[Node, float]]:
    """Each path below `base` (made where missing) with its share of `total`."""
    out = []
    for rel, ns in sorted(shares.items(), key=lambda kv: tuple(map(str, kv[0]))):
        node = base
        for frame in rel:
            node = _child(node, _as_sampled(frame, names))
        out.append((node, ns / total))
    return out


SAMPLE_FRAME = "[sample]"  # the sampler's stack for a sample inside backward() in a captured step: `[backward] > [sample] k`


def _resolve_samples(root: Node, fold: BackwardFold, names: dict[tuple[str, int], list[str]]) -> float:
    """Each captured sample's node (`engine > [backward] > [sample] k`) onto the paths of the backward ops that
    ran in its span, each its share of the sample's figures; what they leave of the span (and a sample the
    capture could not place) goes back to its engine node, to be split with the rest. Returns the energy
    placed."""
    placed = 0.0
    for _, engine in _engines(root, with_self=False):
        back = next((c for c in engine.children if (c.function, c.file, c.line) == BACKWARD_FRAME), None)
        if back is None:
            continue
        for node in list(back.children):
            if node.function != SAMPLE_FRAME or node.file:
                continue
            shares = {p: w for p, w in fold.samples.get(node.line, {}).items() if BACKWARD_FRAME in p and w > 0}
            covered = sum(shares.values())
            total = min(1.0, covered)  # ops of several threads over one tick: never more than the whole sample
            scale = total / covered if covered else 0.0
            targets = []
            for path, w in sorted(shares.items(), key=lambda kv: tuple(map(str, kv[0]))):
                target = back
                for frame in path[path.index(BACKWARD_FRAME) + 1:]:
                    target = _child(target, _as_sampled(frame, names))
                targets.append((target, w * scale))
            if total < 1.0:
                targets.append((engine, 1.0 - total))
            placed += sum(node.self_energy_j.values()) * total
            _move(node, targets)
        back.children[:] = [c for c in back.children if not (c.function == SAMPLE_FRAME and not c.file)]
    return placed


def graft_backward(root: Node, fold: BackwardFold) -> list[Note]:
    """The captured samples onto the backward ops that ran in their spans; then every engine node of the sampled
    tree split onto its backward paths (the caller's proportions that its own frames match best, else all
    callers' together). Returns the note that says how."""
    names = _names(root)
    placed = _resolve_samples(root, fold, names) if fold.samples else 0.0
    groups = fold.by_caller()
    if not groups:
        return []
    pooled: dict[Path, float] = {}
    for rel in groups.values():
        for path, ns in rel.items():
            pooled[path] = pooled.get(path, 0.0) + ns
    engines = _engines(root)
    sampled_s = sum(node.self_time_s for _, node in engines)
    extrapolated = sum(sum(node.self_energy_j.values()) for _, node in engines)
    for chain, node in engines:
        best = max(groups, key=lambda c: (_score(chain, c), sum(groups[c].values())))
        shares = groups[best] if _score(chain, best) > 0 else pooled
        split(node, shares, names)
    measured_s = sum(pooled.values()) / 1e9
    share = min(1.0, measured_s / sampled_s) if sampled_s > 0 else 0.0
    placed_share = placed / (placed + extrapolated) if placed + extrapolated > 0 else 0.0
    text = (f"backward's CPU work is under [backward], on the modules whose forward ops it differentiates: in the"
            f" captured steps each sample goes to the backward ops that ran over its tick, by their time in it"
            f" ({placed_share:.1%} of backward's energy); the other steps' backward samples (and what no backward"
            f" op covered of a captured tick) are split in the proportions of the backward"
            f" ops' time the profiler measured ({measured_s:.3f} s, about {share:.0%} of backward's sampled time):"
            " extrapolated")
    if fold.dropped_ns:
        text += f"; {fold.dropped_ns / 1e9:.3f} s of backward ops past the bound on paths are not in the proportions"
    return [Note("backward-split", text, {"captured_s": measured_s, "sampled_s": sampled_s, "captured_share": share,
                                          "placed_share": placed_share, "method": "extrapolated",
                                          "engines": len(engines)})]


def _root_modules(node: Node, inside: bool = False) -> Iterable[Node]:
    """The sampled tree's outermost module frames (a model's root), never below `[backward]`."""
    if (node.function, node.file, node.line) == BACKWARD_FRAME or node.is_special:
        return
    module = is_module_frame((node.function, node.file, node.line))
    if module and not inside:
        yield node
        return
    for c in node.children:
        yield from _root_modules(c, inside or module)


def _module_nodes(node: Node) -> Iterable[Node]:
    if is_module_frame((node.function, node.file, node.line)):
        yield node
    for c in node.children:
        if not c.is_special:
            yield from _module_nodes(c)


def graft_forward(root: Node, fold: BackwardFold) -> list[Note]:
    """Each model's forward: the self figures of its module frames (samples whose innermost frame is a
    module's `forward`: the ops it calls) pooled, and shared among its modules in the proportions of the
    forward ops' time the captured steps measured (fastest run x runs, as backward's). A periodic sampler
    meets a periodic training step at aliased instants; the measured op time does not. Python frames
    that are not modules' keep their samples. Energy is moved, never made."""
    groups = fold.forward_by_root()
    if not groups:
        return []
    names = _names(root)
    moved = measured = 0.0
    for node in list(_root_modules(root)):
        key = next((f for f in groups if same_frame(node, f)), None)
        if key is None:
            continue
        shares = groups[key]
        total = sum(shares.values())
        if total <= 0:
            continue
        pool = Node(function="", file="", line=0, other_policy_self_energy_j={})
        for src in _module_nodes(node):
            _move(src, [(pool, 1.0)])
        moved += sum(pool.self_energy_j.values())
        measured += total
        _move(pool, _targets(node, shares, total, names))
    if not measured:
        return []
    text = (f"each model's forward energy in its modules' own frames ({moved:.4g} J) is shared among its modules in"
            f" the proportions of the forward ops' time the profiler measured in the captured steps"
            f" ({measured / 1e9:.3f} s): extrapolated")
    return [Note("forward-split", text, {"captured_s": measured / 1e9, "moved_j": moved, "method": "extrapolated"})]


def paths_below(node: Node) -> Iterable[Node]:
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        todo.extend(n.children)


def backward_total(root: Node) -> dict[str, Any]:
    """Energy beneath every `[backward]` node, per source (for checks and figures)."""
    out: dict[str, float] = {}
    for n in paths_below(root):
        if n.function == BACKWARD_FRAME[0]:
            for m in paths_below(n):
                for sid, e in m.self_energy_j.items():
                    out[sid] = out.get(sid, 0.0) + e
    return out
