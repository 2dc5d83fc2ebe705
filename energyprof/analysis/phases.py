"""A training step's three phases (forward, backward, optimizer) read off the attribution tree. Pure.

The capture puts backward's joules under the line that called `backward()`, then a frame named
`[backward]`, then the forward op's Python stack (core/autograd.py), on the CPU and on a GPU alike.
So a frame's phase follows from its call path:
- *backward*: the path holds `[backward]` or one of torch's `backward()` entry frames
  (`Tensor.backward`, `torch.autograd.backward`, `_engine_run_backward`): where no op was linked,
  backward's work stays on those frames, and it is still backward;
- *optimizer*: otherwise, the path holds a frame of `torch.optim` (`Adam.step`, `Optimizer.zero_grad`,
  a scheduler's step), a `zero_grad`, or the `step` of a class named `...Optimizer`;
- *forward*: everything else of the step.
Backward wins where both hold (an LBFGS closure calls `backward()` inside `optimizer.step`).

A model's modules are the Python frames of the forward ops that autograd differentiated: the frames
directly beneath `[backward]`, opened while one of them holds nearly all (a model's top module holds
its layers). Each carries its forward and its backward, the same joules the function table shows.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterable

from ..record import record
from .kinds import BACKWARD_NODE, has_backward_node  # noqa: F401 - their home is kinds.py; named here as before

if TYPE_CHECKING:
    from ..facts.profile import Node

FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"
PHASES = (FORWARD, BACKWARD, OPTIMIZER)
# torch's frames between the line that called backward() and autograd's engine
_BACKWARD_CALLS = re.compile(r"(^|[/\\])torch[/\\](_tensor\.py|autograd[/\\]__init__\.py|autograd[/\\]graph\.py)$")
_BACKWARD_NAMES = frozenset({"Tensor.backward", "backward", "_engine_run_backward"})
_OPTIM_FILE = re.compile(r"(^|[/\\])torch[/\\]optim[/\\]")
OPEN_SHARE = 0.9  # a module holding this share of its level is opened to its own modules
MODULES_SHOWN = 3
FunctionKey = tuple[str, str, int]  # (function, file, line): a function row's key, as analysis/functions.py's


def is_backward_frame(function: str, file: str) -> bool:
    """`[backward]`, or torch's own frames of a `backward()` call."""
    return function == BACKWARD_NODE or (function in _BACKWARD_NAMES and bool(_BACKWARD_CALLS.search(file)))


def is_optimizer_frame(function: str, file: str) -> bool:
    """A frame of torch.optim, any `zero_grad`, or the `step` of a class named `...Optimizer`."""
    if _OPTIM_FILE.search(file):
        return True
    owner, _, name = function.rpartition(".")
    return name == "zero_grad" or (name == "step" and owner.endswith("Optimizer"))


def node_phases(root: Node) -> dict[int, str]:
    """id(node) -> its phase, for every node of the subtree (its path decides, as the module says)."""
    out: dict[int, str] = {}
    path: list[str] = []
    for node, depth in root.walk():
        del path[depth:]
        above = path[-1] if path else FORWARD
        if above == BACKWARD or is_backward_frame(node.function, node.file):
            phase = BACKWARD
        elif above == OPTIMIZER or is_optimizer_frame(node.function, node.file):
            phase = OPTIMIZER
        else:
            phase = FORWARD
        out[id(node)] = phase
        path.append(phase)
    return out


@record
class Split:
    """Joules of each phase, and the samples under each (the ± of a figure: 1/sqrt(samples))."""

    forward_j: float = 0.0
    backward_j: float = 0.0
    optimizer_j: float = 0.0
    backward_samples: int = 0
    optimizer_samples: int = 0

    @property
    def total_j(self) -> float:
        return self.forward_j + self.backward_j + self.optimizer_j


def tree_split(root: Node) -> Split:
    """The subtree's self energy by phase (every joule once)."""
    phases = node_phases(root)
    s = Split()
    for node, _ in root.walk():
        j = node.self_total_energy
        phase = phases[id(node)]
        if phase == BACKWARD:
            s.backward_j += j
            s.backward_samples += node.self_samples
        elif phase == OPTIMIZER:
            s.optimizer_j += j
            s.optimizer_samples += node.self_samples
        else:
            s.forward_j += j
    return s


def split_span(span_j: float, backward_j: float, optimizer_j: float) -> tuple[float, float, float]:
    """THE rule for a span of training (a step, an epoch, a loop): (forward, backward, optimizer) joules.

    backward and optimizer are the span's energy under backward's and the optimizer's frames; forward is
    the rest of the span. Figures read from another account than the span's (the tree's against a window's)
    can together exceed it by their error: both are then scaled down alike to fill it, and forward is 0.
    """
    span = max(span_j, 0.0)
    b, o = max(backward_j, 0.0), max(optimizer_j, 0.0)
    if b + o > span:
        scale = span / (b + o) if b + o > 0 else 0.0
        b, o = b * scale, o * scale
    return span - b - o, b, o


def backward_within(root: Node) -> dict[int, tuple[float, int]]:
    """id(node) -> (joules, samples) of backward inside the node's inclusive figure: all of it for a node in
    backward, else what its backward descendants hold (a training step's line holds its `backward()`)."""
    phases = node_phases(root)
    out: dict[int, tuple[float, int]] = {}
    for node in reversed([n for n, _ in root.walk()]):
        if phases[id(node)] == BACKWARD:
            out[id(node)] = (node.total_energy, node.samples)
        else:
            j, n = 0.0, 0
            for c in node.children:
                cj, cn = out[id(c)]
                j += cj
                n += cn
            out[id(node)] = (j, n)
    return out


def module_keys(root: Node, energy: dict[FunctionKey, float]) -> list[FunctionKey]:
    """The model's modules as function keys, heaviest first (`energy`: each key's total, forward and
    backward). Start from the Python frames directly beneath `[backward]`; while one holds at least
    OPEN_SHARE of the level, it is the model around its layers: its own frames beneath `[backward]` take
    its place."""
    under = [n for n, _ in root.walk() if n.function == BACKWARD_NODE]
    level = _frames_beneath(under)
    seen: set[FunctionKey] = set()
    while level:
        keys = sorted(level, key=lambda k: -energy.get(k, 0.0))
        whole = sum(energy.get(k, 0.0) for k in keys)
        top = keys[0]
        inner = _frames_beneath(level[top])
        if top in seen or not inner or whole <= 0 or energy.get(top, 0.0) < OPEN_SHARE * whole:
            return keys
        seen.add(top)
        del level[top]
        for k, nodes in inner.items():
            level.setdefault(k, []).extend(nodes)
    return []


def _frames_beneath(nodes: Iterable[Node]) -> dict[FunctionKey, list[Node]]:
    """The Python frames (a file: not an operator) that are children of these nodes, by function."""
    out: dict[FunctionKey, list[Node]] = {}
    for n in nodes:
        for c in n.children:
            if c.file:
                out.setdefault((c.function, c.file, c.line), []).append(c)
    return out
