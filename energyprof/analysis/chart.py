"""The chart tree: call paths with library frames optionally collapsed, pruned for drawing. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..profile import Node, Profile
from .functions import is_library

# The icicle builds one SVG element per node (~2.7 s for 5k nodes in headless Chromium), so the chart
# keeps the largest call paths and folds the rest into "other" nodes; the table keeps everything.
MAX_CHART_NODES = 1500


@dataclass(slots=True)
class ChartNode:
    """A node of the chart's tree: own (self) figures, children, and values filled in bottom-up."""

    function: str
    file: str
    line: int
    self_e: dict[str, float]
    self_t: float
    samples: int
    children: list[ChartNode] = field(default_factory=list)
    energy: dict[str, float] = field(default_factory=dict)
    value_e: float = 0.0
    value_t: float = 0.0
    folded: int = 0  # >0 for an "other" node: how many call paths it stands for

    def preorder(self) -> list[ChartNode]:
        """Every node, parents before children, without recursion (trees can be very deep)."""
        out, stack = [], [self]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(reversed(n.children))
        return out


def chart_tree(profile: Profile, collapse_libraries: bool) -> ChartNode:
    """The profile's tree as ChartNodes; library frames optionally merged into their caller.

    Collapsing works as pyinstrument's "hide library frames": a library frame's own energy and time
    go to the nearest non-library caller, and the user code it calls back appears under that caller
    (merged with a sibling of the same function, file and line). Special nodes with no energy under
    the profile's policy (the idle node under `all`) are left out.
    """
    root = _chart_node(profile.root)
    todo: list[tuple[Node, ChartNode]] = [(profile.root, root)]
    while todo:
        node, target = todo.pop()
        index = {(c.function, c.file, c.line): c for c in target.children}
        pending = list(reversed(node.children))  # a stack: popping from the end keeps call order
        while pending:
            child = pending.pop()
            if child.is_special and child.total_energy <= 0 and child.time_s <= 0:
                continue
            if collapse_libraries and is_library(child.file):
                _add_self(target, child)
                pending.extend(reversed(child.children))
                continue
            key = (child.function, child.file, child.line)
            existing = index.get(key)
            if existing is None:
                existing = index[key] = _chart_node(child)
                target.children.append(existing)
            else:
                _add_self(existing, child)
                existing.samples += child.samples
            todo.append((child, existing))
    _fill_values(root)
    return root


def _chart_node(node: Node) -> ChartNode:
    return ChartNode(node.function, node.file, node.line,
                     {k: max(v, 0.0) for k, v in node.self_energy_j.items()},
                     max(node.self_time_s, 0.0), node.samples)


def _add_self(target: ChartNode, node: Node) -> None:
    for k, v in node.self_energy_j.items():
        target.self_e[k] = target.self_e.get(k, 0.0) + max(v, 0.0)
    target.self_t += max(node.self_time_s, 0.0)


def _fill_values(root: ChartNode) -> None:
    """Values = self + children, bottom-up: plotly's branchvalues "total" draws nothing when a
    parent is below the sum of its children, which rounding in the profile could cause."""
    for n in reversed(root.preorder()):
        n.energy = dict(n.self_e)
        n.value_t = n.self_t
        for c in n.children:
            for k, v in c.energy.items():
                n.energy[k] = n.energy.get(k, 0.0) + v
            n.value_t += c.value_t
        n.value_e = sum(n.energy.values())


def prune(root: ChartNode, limit: int = MAX_CHART_NODES) -> ChartNode:
    """Keep the `limit` largest call paths (by the larger of energy and time share); fold each
    node's dropped children into one "other" child so the values still add up."""
    total_e = root.value_e or 1.0
    total_t = root.value_t or 1.0
    everything = root.preorder()
    if len(everything) <= limit:
        return root

    def weight(n: ChartNode) -> float:
        return max(n.value_e / total_e, n.value_t / total_t)

    threshold = sorted((weight(n) for n in everything), reverse=True)[limit - 1]
    stack = [root]
    while stack:
        n = stack.pop()
        keep = [c for c in n.children if weight(c) > threshold]
        drop = [c for c in n.children if weight(c) <= threshold]
        if drop:
            other = ChartNode("other", "", 0, {}, 0.0, sum(c.samples for c in drop))
            other.folded = sum(len(c.preorder()) for c in drop)
            for c in drop:
                for k, v in c.energy.items():
                    other.self_e[k] = other.self_e.get(k, 0.0) + v
                other.self_t += c.value_t
            keep.append(other)
        n.children = keep
        stack.extend(c for c in keep if not c.folded)
    _fill_values(root)
    return root


def has_library_frames(profile: Profile) -> bool:
    return any(is_library(n.file) for n, _ in profile.walk())
