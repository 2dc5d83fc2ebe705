"""A built Profile is never edited: a change is a copy (`with_policy`, `with_meta`, `with_live_export`).
Checked on the source (every module of energyprof, parsed), and on the copies themselves."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from energyprof.facts.profile import Profile
from energyprof.record import fields

ROOT = Path(__file__).resolve().parent.parent / "energyprof"
FIELDS = frozenset(f.name for f in fields(Profile))
# names a Profile goes by in energyprof's code; `self.profile` (the Profiler's) too
RECEIVERS = frozenset({"profile", "prof", "joined", "merged", "built", "job_profile"})
MUTATORS = frozenset({"append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear", "remove",
                      "sort", "reverse", "__setitem__", "__delitem__"})


def _is_profile(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id in RECEIVERS) or (
        isinstance(node, ast.Attribute) and node.attr == "profile")


def _touches(node: ast.AST) -> bool:
    """Whether `node` (an assignment's target, a mutating call's receiver) reaches into a Profile's field:
    `profile.meta`, `profile.meta["k"]["j"]`, `profile.meta.setdefault(...)["k"]`, `profile.notes`."""
    while True:
        if isinstance(node, ast.Attribute):
            if node.attr in FIELDS and _is_profile(node.value):
                return True
            if _is_profile(node):  # `profile.x = ...` for a field of its own
                return False
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        else:
            return False


def edits(source: str) -> list[int]:
    """The lines of `source` that assign into, delete from or mutate a Profile's fields."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets = [node.func.value]
        for t in targets:
            for leaf in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(leaf, ast.Attribute) and leaf.attr in FIELDS and _is_profile(leaf.value) or _touches(leaf):
                    found.append(node.lineno)
    return sorted(set(found))


@pytest.mark.parametrize("source", [
    'profile.meta["live_export"] = summary',
    'profile.notes.append(Note("live-export", line))',
    'profile.meta.setdefault("settings", {})["storage"] = storage(path)',
    'joined.meta["distributed"]["gathered"] = {}',
    'self.profile.windows += more',
    'profile.totals, x = t, 1',
    'del prof.extra["io"]',
])
def test_the_scan_sees_an_edit(source: str) -> None:
    assert edits(source) == [1]


@pytest.mark.parametrize("source", [
    'profile = profile.with_live_export(summary, lost)',
    'meta = {**profile.meta, "page_cache": pages}',
    'notes = [*profile.notes, note]',
    'found.notes.append("RAPL: not found")',
    'self.profile = self._build(status)',
])
def test_the_scan_lets_copies_and_other_objects_be(source: str) -> None:
    assert edits(source) == []


def test_no_module_of_energyprof_edits_a_built_profile() -> None:
    """Outside facts/profile.py (which builds them), no line edits a Profile's fields."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "facts" / "profile.py":
            continue
        lines = edits(path.read_text())
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert found == {}


def test_the_copies_leave_the_profile_as_it_was() -> None:
    from energyprof.facts.profile import Node
    from energyprof.facts.records import Totals

    root = Node("<root>", "", 0)
    p = Profile({"idle_policy": "share", "settings": {"cpu": 1}}, [], Totals({}, {}), root)
    before = (dict(p.meta), list(p.notes))
    q = p.with_live_export({"run": "r", "sinks": []}, "influx: 3 dropped")
    r = p.with_meta(page_cache=[1], settings={**p.meta["settings"], "storage": "ssd"})
    assert (dict(p.meta), list(p.notes)) == before
    assert q.meta["live_export"] == {"run": "r", "sinks": []} and [n.kind for n in q.notes] == ["live-export"]
    assert r.meta["settings"] == {"cpu": 1, "storage": "ssd"} and p.meta["settings"] == {"cpu": 1}
    assert q.root is p.root and r.root is p.root  # the tree is shared, never copied: nothing edits it
    assert p.with_live_export({"run": "r", "sinks": []}).notes == []
