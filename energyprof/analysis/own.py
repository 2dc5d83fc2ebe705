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
from dataclasses import dataclass, field

from ..facts.profile import SPECIAL_NODES
from ..facts.profile import Profile
from .chart import _SITE_RE, _STDLIB_RE, frame_kind, library_package
from .functions import FunctionKey, FunctionRow, is_library, node_key


@dataclass
class Group:
    """Energy of frames outside the user's code, by the library or import it ran in."""

    label: str
    self_energy_j: dict[str, float] = field(default_factory=dict)
    self_samples: int = 0

    @property
    def total(self) -> float:
        return sum(self.self_energy_j.values())


def program_folder(profile: Profile) -> str | None:
    """The folder of the program's script, when the profile names it by an absolute path."""
    target = str(profile.meta.get("target") or "")
    return os.path.dirname(target) if os.path.isabs(target) and target.endswith(".py") else None


def is_own(function: str, file: str, parent_file: str, folder: str | None) -> bool:
    """A frame of the user's code: not a library or the import machinery, and in the program's folder
    when that is known (so `<string>` and code from elsewhere are not the user's)."""
    if function.startswith("[") or frame_kind(function, file, parent_file) != "user":
        return False
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
                if node.self_energy_j:
                    g = groups.setdefault(label, Group(label))
                    for src, j in node.self_energy_j.items():
                        g.self_energy_j[src] = g.self_energy_j.get(src, 0.0) + j
                    g.self_samples += node.self_samples
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
