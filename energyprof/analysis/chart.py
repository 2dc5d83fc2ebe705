"""The chart tree: call paths with library frames optionally collapsed, pruned for drawing. Pure.

The report draws the *grouped* tree (`grouped_tree`): where user code calls into a library or the
import machinery, a group box `[library: torch]` or `[import]` is put between them, and every
frame until user code appears again belongs to that group. The page folds each group's frames
into its box until the box is clicked, so the first screen shows the program's own functions.
"""

from __future__ import annotations

import re

from ..record import field, record
from ..facts.profile import Node
from ..facts.profile import Profile
from ..agent.units import UNIT_PREFIXES
from .functions import is_library

# The icicle builds one SVG element per node (~2.7 s for 5k nodes in headless Chromium), so the chart
# keeps the largest call paths and folds the rest into "other" nodes; the table keeps everything.
MAX_CHART_NODES = 1500


@record(slots=True)
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
    kind: str = "user"  # user, library, import, group (a [library: x] or [import] box)
    group: ChartNode | None = None  # the group box this library or import frame folds into

    def preorder(self) -> list[ChartNode]:
        """Every node, parents before children, without recursion (trees can be very deep)."""
        out, stack = [], [self]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(reversed(n.children))
        return out


IMPORT_GROUP = "[import]"
_STDLIB_RE = re.compile(r"[/\\]lib[/\\]python\d+(?:\.\d+)?t?[/\\](.+)$|[/\\]Lib[/\\](.+)$")
_SITE_RE = re.compile(r"(?:site-packages|dist-packages)[/\\](.+)$")
_IMPORT_FILES = re.compile(r"^<frozen importlib|[/\\]importlib[/\\]")


def library_package(file: str) -> str:
    """The top-level package a library frame belongs to: `torch` for .../site-packages/torch/nn/x.py,
    `argparse` for the standard library's argparse.py, `genericpath` for `<frozen genericpath>`."""
    m = _SITE_RE.search(file) or _STDLIB_RE.search(file)
    if m:
        rest = next(g for g in m.groups() if g).replace("\\", "/")
        if rest.startswith(("site-packages/", "dist-packages/")):
            rest = rest.split("/", 1)[1]
        head = rest.split("/", 1)[0]
        return head[:-3] if head.endswith(".py") else head
    if file.startswith("<frozen "):
        return file[len("<frozen "):].rstrip(">").split(".")[0]
    return "?"


def frame_kind(function: str, file: str, parent_file: str) -> str:
    """user, library or import. Import machinery is importlib's frames and any module body
    (`<module>`) run from inside another frame (the script's own body sits under the program,
    a process or a thread node, which have no file); everything else is judged by its path."""
    if file and _IMPORT_FILES.search(file):
        return "import"
    if function == "<module>" and parent_file:
        return "import"
    if is_library(file):
        return "library"
    return "user"


def group_label(kind: str, entry: Node) -> str:
    """A group box's label: the library and the function the caller called (`[library: torch]
    Tensor.backward`), or what was imported (`[import: torch]`), so a caller's calls into one
    library stay apart when they do different things (forward, backward, step)."""
    if kind == "import":
        if entry.function != "<module>":
            return IMPORT_GROUP
        name = library_package(entry.file) if is_library(entry.file) else \
            entry.file.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
        return f"[import: {name}]"
    return f"[library: {library_package(entry.file)}] {entry.function}"


def grouped_tree(profile: Profile) -> ChartNode:
    """The profile's tree with a group box wherever user code enters a library or an import.

    Group boxes under the same caller with the same label merge, so two calls into torch from one
    function make one `[library: torch]` box; frames inside a group keep their own nodes (the page
    shows them when the group is expanded) and point at their group.
    """
    root = _chart_node(profile.root)
    todo: list[tuple[Node, ChartNode]] = [(profile.root, root)]
    indexes: dict[int, dict[tuple[str, str, int], ChartNode]] = {}

    def index_of(n: ChartNode) -> dict[tuple[str, str, int], ChartNode]:
        found = indexes.get(id(n))
        if found is None:
            found = indexes[id(n)] = {(c.function, c.file, c.line): c for c in n.children}
        return found

    while todo:
        node, target = todo.pop()
        index = index_of(target)
        for child in node.children:
            if child.is_special and child.total_energy <= 0 and child.time_s <= 0:
                continue
            kind = frame_kind(child.function, child.file, node.file)
            parent, group = target, (target if target.kind == "group" else
                                     target.group if target.kind in ("library", "import") else None)
            # A module body run from inside a library call is a lazy import (torch imports torch._dynamo in
            # SGD.__init__): its own group box inside the library's, named as the console names it.
            lazy = (kind == "import" and child.function == "<module>" and group is not None
                    and not group.function.startswith("[import"))
            if kind != "user" and (group is None or lazy):
                label = group_label(kind, child) if not lazy else f"[import: {module_name(child.file)}]"
                key = (label, "", 0)
                group = index.get(key)
                if group is None:
                    group = index[key] = ChartNode(label, "", 0, {}, 0.0, 0, kind="group")
                    target.children.append(group)
                group.samples += child.samples
                parent = group
            if kind == "import" and group is not None and group.function.startswith("[import") \
                    and _IMPORT_FILES.search(child.file):
                # importlib's own frames (five or six per import) say nothing to a reader: inside an
                # import group they go, their figures to the box above, their callees up with them
                _add_self(parent, child)
                todo.append((child, parent))
                continue
            p_index = index_of(parent)
            key = (child.function, child.file, child.line)
            existing = p_index.get(key)
            if existing is None:
                existing = p_index[key] = _chart_node(child)
                existing.kind = kind
                existing.group = group if kind != "user" else None
                parent.children.append(existing)
            else:
                _add_self(existing, child)
                existing.samples += child.samples
            todo.append((child, existing))
    _fill_values(root)
    _keep_heaviest_imports(root)
    if _engine_tasks_first(root):
        _fill_values(root)
    return root


# -- engines: the user's tasks first, the engine's start-up one folded box ------------------------
# A Ray or Dask worker is started by the engine (ray.init, LocalCluster), so the profile holds it, and
# every task it ran, under that call: ray.init held 92% of a chart whose tasks were out of sight. A
# task is the unit the user asks about (`[ray task burn]`, `[dask task work]`, agent/units.py), so
# the chart lifts each to the top, beside the program's own code, one box per task function (its runs
# on every worker merged); what stays under the start-up call (the daemons, each worker's own start
# and idle loop) folds into one box, `[ray start-up]` / `[dask start-up]`, until clicked.
ENGINE_PROCESS_PREFIXES = ("[ray worker ", "[ray daemon ", "[dask worker", "[processes: dask worker")


def _engine_of(unit: str) -> str:
    return unit[1:].split(" ", 1)[0]  # "[ray task burn]" -> "ray"


def _engine_tasks_first(root: ChartNode) -> bool:
    """Lift every engine unit out of where its worker was started to the root, and fold the start-up
    that held them into one box. False when the tree has no unit (nothing changed)."""
    lifted: dict[str, ChartNode] = {c.function: c for c in root.children if c.function.startswith(UNIT_PREFIXES)}
    startups: dict[int, tuple[ChartNode, str]] = {}
    stack: list[tuple[ChartNode, list[ChartNode]]] = [(root, [])]
    found: list[tuple[ChartNode, ChartNode, list[ChartNode]]] = []  # (unit, its parent, its ancestors)
    while stack:
        n, above = stack.pop()
        for c in n.children:
            if c.function.startswith(UNIT_PREFIXES) and n is not root:
                found.append((c, n, above + [n]))
            elif not c.function.startswith(UNIT_PREFIXES):
                stack.append((c, above + [n]))
    if not found:
        return False
    for unit, parent, above in found:
        parent.children = [c for c in parent.children if c is not unit]
        box = next((a for a in above if a.kind == "group"), None)
        if box is not None:
            startups.setdefault(id(box), (box, _engine_of(unit.function)))
        unit.kind, unit.group = "user", None
        held = lifted.get(unit.function)
        if held is None:
            lifted[unit.function] = unit
            root.children.append(unit)
        else:
            _merge(held, unit)
    for box, engine in startups.values():
        box.function = f"[{engine} start-up]"
        for c in [c for c in root.children if c.function.startswith(ENGINE_PROCESS_PREFIXES)]:
            root.children.remove(c)  # a daemon the engine started from a process of its own: its start-up too
            box.children.append(c)
        _fold_into(box)
    for _, _, above in found:
        _drop_empty(above)
    return True


def _merge(into: ChartNode, other: ChartNode) -> None:
    """`other`'s figures and children into `into` (same call path): children matched by function, file and line."""
    for k, v in other.self_e.items():
        into.self_e[k] = into.self_e.get(k, 0.0) + v
    into.self_t += other.self_t
    into.samples += other.samples
    mine = {(c.function, c.file, c.line, c.kind): c for c in into.children}
    for c in other.children:
        twin = mine.get((c.function, c.file, c.line, c.kind))
        if twin is None or c.folded or twin.folded:
            into.children.append(c)
        else:
            _merge(twin, c)
            for n in c.preorder():  # frames that pointed at the merged group box point at its twin
                if n.group is c:
                    n.group = twin
    for n in into.preorder():
        if n.group is other:
            n.group = into


def _fold_into(box: ChartNode) -> None:
    """Every frame under `box` folds into it (the page draws a folded group as one box): the workers'
    and daemons' nodes, their own imports and libraries, the user code a worker imported to start."""
    for n in box.preorder():
        if n is box:
            continue
        if n.kind == "group" or n.kind == "user":
            n.kind = "library" if n.kind == "user" or not n.function.startswith("[import") else "import"
        n.group = box


def _drop_empty(nodes: list[ChartNode]) -> None:
    """Remove, innermost first, the nodes a lift left with nothing (no self figures, no children)."""
    for i in range(len(nodes) - 1, 0, -1):
        n, parent = nodes[i], nodes[i - 1]
        if not n.children and not any(n.self_e.values()) and n.self_t <= 0 and n in parent.children:
            parent.children = [c for c in parent.children if c is not n]


IMPORT_PATHS = 3  # an opened import group shows its few heaviest imports at each level, the rest as "other"


def _keep_heaviest_imports(root: ChartNode) -> None:
    """Inside import groups, keep each node's IMPORT_PATHS heaviest children (by energy, then time)."""
    for n in root.preorder():
        inside = n.function.startswith("[import") if n.kind == "group" else (
            n.group is not None and n.group.function.startswith("[import"))
        if inside and len(n.children) > IMPORT_PATHS:
            ranked = sorted(n.children, key=lambda c: (-c.value_e, -c.value_t))
            _fold(n, ranked[:IMPORT_PATHS], ranked[IMPORT_PATHS:])
    _fill_values(root)


def module_name(file: str) -> str:
    """The dotted module a file is: `torch.nn.functional` for .../site-packages/torch/nn/functional.py,
    `json.decoder` for the standard library's, the file's name for the program's own."""
    m = _SITE_RE.search(file) or _STDLIB_RE.search(file)
    rest = next(g for g in m.groups() if g) if m else file.replace("\\", "/").rsplit("/", 1)[-1]
    rest = rest.replace("\\", "/").removesuffix(".py").removesuffix("/__init__")
    if rest.startswith(("site-packages/", "dist-packages/")):
        rest = rest.split("/", 1)[1]
    if file.startswith("<frozen "):
        return file[len("<frozen "):].rstrip(">")
    return rest.replace("/", ".")


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
        _fold(n, keep, drop)
        stack.extend(c for c in n.children if not c.folded)
    _fill_values(root)
    return root


def _fold(n: ChartNode, keep: list[ChartNode], drop: list[ChartNode]) -> None:
    """`n` keeps `keep`; `drop` becomes one "other" child holding their values (call _fill_values after)."""
    if drop:
        other = ChartNode("other", "", 0, {}, 0.0, sum(c.samples for c in drop),
                          kind=n.kind if n.kind in ("library", "import") else "user",
                          group=n.group if n.kind in ("library", "import") else (n if n.kind == "group" else None))
        other.folded = sum(len(c.preorder()) for c in drop)
        for c in drop:
            for k, v in c.energy.items():
                other.self_e[k] = other.self_e.get(k, 0.0) + v
            other.self_t += c.value_t
        keep = [*keep, other]
    n.children = keep


def has_library_frames(profile: Profile) -> bool:
    return any(is_library(n.file) for n, _ in profile.walk())
