"""The user's code first: the program's own functions, and everything else folded into the
library or import it ran in. Pure.

A reader opens a profile to ask "which of my functions"; a ranking by self energy over every
frame answers with torch's internals and module bodies. So the summary lists the functions in
the program's folder by total (inclusive) energy, and folds every other frame's own energy
into the group it ran in, entered from the user's code: `[library: torch]`, or
`[import: torch._dynamo]` for a module body run from inside a library call (torch imports
torch._dynamo lazily in `SGD.__init__`: that energy is an import, not the optimizer).
"""

from __future__ import annotations

import os

from ..record import field, record
from ..facts.profile import SPECIAL_NODES
from ..facts.profile import Profile
from .chart import _SITE_RE, _STDLIB_RE, frame_kind, library_package
from .functions import FunctionKey, FunctionRow, is_library, node_key


@record
class Group:
    """Energy of frames outside the user's code, by the library or import it ran in."""

    label: str
    self_energy_j: dict[str, float] = field(default_factory=dict)
    self_samples: int = 0
    # every function that ran in the group: its self energy (all sources) and self samples there
    function_j: dict[FunctionKey, float] = field(default_factory=dict)
    function_samples: dict[FunctionKey, int] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.self_energy_j.values())

    @property
    def count(self) -> int:
        """How many functions ran in the group (a function that ran in two groups counts in each)."""
        return len(self.function_j)

    def heaviest(self, n: int) -> list[tuple[FunctionKey, float, int]]:
        """The n functions with the most self energy in the group: (function, joules, self samples)."""
        keys = sorted((k for k, j in self.function_j.items() if j > 0), key=lambda k: -self.function_j[k])[:n]
        return [(k, self.function_j[k], self.function_samples[k]) for k in keys]


def home_groups(groups: list[Group]) -> dict[FunctionKey, int]:
    """Each function outside the user's code once, under the group it spent the most self energy in (the
    first such group on a tie; the first it ran in when it spent none): where the function table folds it."""
    home: dict[FunctionKey, int] = {}
    best: dict[FunctionKey, float] = {}
    for g, group in enumerate(groups):
        for key, j in group.function_j.items():
            if key not in home or j > best[key]:
                home[key], best[key] = g, j
    return home


def program_folder(profile: Profile) -> str | None:
    """The folder of the program's script, when the profile names it by an absolute path."""
    target = str(profile.meta.get("target") or "")
    return os.path.dirname(target) if os.path.isabs(target) and target.endswith(".py") else None


# cloudpickle ships a function by value (the program's own `__main__` functions, its lambdas and closures)
# and names its file "<dynamic-code>": a Dask task running it runs the user's code, wherever it came from.
DYNAMIC_CODE = "<dynamic-code>"


def is_own(function: str, file: str, parent_file: str, folder: str | None) -> bool:
    """A frame of the user's code: not a library or the import machinery, and in the program's folder
    when that is known (so `<string>` and code from elsewhere are not the user's); code an engine
    shipped by value (cloudpickle's `<dynamic-code>`) is the user's."""
    if function.startswith("[") or frame_kind(function, file, parent_file) != "user":
        return False
    if file == DYNAMIC_CODE:
        return True
    if folder is None:
        return True
    return bool(file) and os.path.normpath(file).startswith(os.path.normpath(folder) + os.sep)


def short_path(file: str, folder: str | None) -> str:
    """A file as a reader names it: relative to the program's folder, `package/module.py` for
    installed code and the standard library, else as given."""
    if folder and os.path.normpath(file).startswith(os.path.normpath(folder) + os.sep):
        return os.path.relpath(file, folder)
    m = _SITE_RE.search(file) or _STDLIB_RE.search(file)
    if m:
        rest = next(g for g in m.groups() if g).replace("\\", "/")
        return rest.split("/", 1)[1] if rest.startswith(("site-packages/", "dist-packages/")) else rest
    return file


def module_name(file: str) -> str:
    """`torch._dynamo` for .../site-packages/torch/_dynamo/__init__.py; the file's stem elsewhere."""
    m = _SITE_RE.search(file) or _STDLIB_RE.search(file)
    if not m:
        return library_package(file) if is_library(file) else os.path.basename(file).removesuffix(".py")
    rest = next(g for g in m.groups() if g).replace("\\", "/")
    if rest.startswith(("site-packages/", "dist-packages/")):
        rest = rest.split("/", 1)[1]
    rest = rest.removesuffix(".py").removesuffix("/__init__")
    return rest.replace("/", ".")


def own_first(profile: Profile, rows: list[FunctionRow]) -> tuple[list[FunctionRow], list[Group]]:
    """The user's function rows by total energy (largest first), and the groups that hold every
    other frame's self energy (largest first). `rows` are the report's function rows."""
    folder = program_folder(profile)
    own: set[FunctionKey] = set()
    groups: dict[str, Group] = {}
    # per depth: the frame's file, whether it is the user's, and the group label below the last user frame
    files: list[str] = []
    labels: list[str | None] = []
    for node, depth in profile.walk():
        del files[depth:]
        del labels[depth:]
        parent_file = files[-1] if files else ""
        above = labels[-1] if labels else None
        label: str | None = None
        if depth and node.function not in SPECIAL_NODES and not node.function.startswith("["):
            if is_own(node.function, node.file, parent_file, folder):
                own.add(node_key(node))
            else:
                label = _label(node.function, node.file, parent_file, above)
                g = groups.setdefault(label, Group(label))
                for src, j in node.self_energy_j.items():
                    g.self_energy_j[src] = g.self_energy_j.get(src, 0.0) + j
                g.self_samples += node.self_samples
                key = node_key(node)
                g.function_j[key] = g.function_j.get(key, 0.0) + sum(node.self_energy_j.values())
                g.function_samples[key] = g.function_samples.get(key, 0) + node.self_samples
        files.append(node.file)
        labels.append(label)
    mine = sorted((r for r in rows if (r.function, r.file, r.line) in own), key=lambda r: -r.total_energy)
    return mine, sorted((g for g in groups.values() if g.total > 0), key=lambda g: -g.total)


def _label(function: str, file: str, parent_file: str, above: str | None) -> str:
    """The group a frame outside the user's code belongs to: the one it was entered in, except that a
    module body run from inside it starts an import of that module (the outermost one names it)."""
    if function == "<module>" and parent_file and not (above or "").startswith("[import: "):
        return f"[import: {module_name(file)}]"
    if above is not None:
        return above
    if frame_kind(function, file, parent_file) == "import":
        return "[import]"
    return f"[library: {library_package(file)}]" if is_library(file) else f"[other code: {module_name(file) or '?'}]"
