"""The profile: the attribution tree and its totals, and its public JSON form.

Every renderer reads a `Profile` and nothing else, so this module is the contract between
collection and presentation. The JSON schema is versioned; see docs/profile-format.md.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

SCHEMA = "energyprof.profile/1"
SCHEMA_FAMILY = "energyprof.profile/"
SCHEMA_MAJOR = 1

IDLE_NODE = "[other processes and idle]"
SELF_NODE = "[energyprof]"
CHILDREN_NODE = "[child processes]"
SPECIAL_NODES = (IDLE_NODE, SELF_NODE, CHILDREN_NODE)


class ProfileFormatError(ValueError):
    """A profile file that cannot be read: corrupt, truncated, or from a future version."""


class EnergyFigures:
    """Sums shared by a tree node and a function row (a function merged over its paths)."""

    energy_j: dict[str, float]
    self_energy_j: dict[str, float]
    samples: int

    @property
    def total_energy(self) -> float:
        return sum(self.energy_j.values())

    @property
    def self_total_energy(self) -> float:
        return sum(self.self_energy_j.values())

    @property
    def relative_error(self) -> float | None:
        """Sampling error of a figure built from n samples: about 1/sqrt(n)."""
        return 1.0 / math.sqrt(self.samples) if self.samples > 0 else None


@dataclass
class Node(EnergyFigures):
    """One call path in the tree. Energies are joules per source id."""

    function: str
    file: str = ""
    line: int = 0
    time_s: float = 0.0
    self_time_s: float = 0.0
    cpu_time_s: float = 0.0
    self_cpu_time_s: float = 0.0
    samples: int = 0
    self_samples: int = 0
    energy_j: dict[str, float] = field(default_factory=dict)
    self_energy_j: dict[str, float] = field(default_factory=dict)
    peak_rss_bytes: int | None = None
    rss_growth_bytes: int | None = None
    self_rss_growth_bytes: int | None = None
    alloc_bytes: int | None = None
    carbon_g: float | None = None
    cost: float | None = None
    children: list[Node] = field(default_factory=list)

    @property
    def is_special(self) -> bool:
        return self.function in SPECIAL_NODES

    def walk(self, depth: int = 0) -> Iterator[tuple[Node, int]]:
        """Pre-order walk without recursion (trees can be deeper than Python's stack)."""
        stack: list[tuple[Node, int]] = [(self, depth)]
        while stack:
            node, d = stack.pop()
            yield node, d
            stack.extend((c, d + 1) for c in reversed(node.children))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in self.__dict__.items():
            if key == "children":
                continue
            if value is None and key in _OPTIONAL_NODE_FIELDS:
                continue
            out[key] = value
        out["children"] = [c.to_dict() for c in self.children]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Node:
        # Iterative to survive deep trees; build parents before children.
        root = cls._one(data)
        todo = [(root, data)]
        while todo:
            node, raw = todo.pop()
            for child_raw in raw.get("children", []):
                child = cls._one(child_raw)
                node.children.append(child)
                todo.append((child, child_raw))
        return root

    @classmethod
    def _one(cls, raw: dict[str, Any]) -> Node:
        kwargs = {k: raw[k] for k in _NODE_FIELDS if k in raw and k != "children"}
        if "function" not in kwargs:
            raise ProfileFormatError("a node has no 'function'")
        return cls(**kwargs)


_NODE_FIELDS = [f for f in Node.__dataclass_fields__]
_OPTIONAL_NODE_FIELDS = {
    "peak_rss_bytes", "rss_growth_bytes", "self_rss_growth_bytes", "alloc_bytes", "carbon_g", "cost",
}


@dataclass
class Profile:
    """A finished profile: what the run was, what was measured, and where it went."""

    meta: dict[str, Any]
    sources: list[dict[str, Any]]
    totals: dict[str, Any]
    root: Node
    windows: list[dict[str, Any]] = field(default_factory=list)
    timeline: dict[str, Any] = field(default_factory=dict)
    carbon: dict[str, Any] | None = None
    notes: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total_energy_j(self) -> float:
        return sum(self.totals.get("energy_j", {}).values())

    def source(self, source_id: str) -> dict[str, Any]:
        for s in self.sources:
            if s["id"] == source_id:
                return s
        raise KeyError(source_id)

    def nodes(self) -> Iterator[tuple[Node, int]]:
        return self.root.walk()

    def find(self, function: str) -> list[Node]:
        """All nodes whose function name is `function` (a function can sit on several paths)."""
        return [n for n, _ in self.nodes() if n.function == function]

    def function_totals(self, function: str) -> float:
        """Energy charged to a function over all its call paths, counting recursion once."""
        total = 0.0
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node.function == function:
                total += node.total_energy
                continue  # its children are inside its inclusive figure already
            stack.extend(node.children)
        return total

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "meta": self.meta,
            "sources": self.sources,
            "totals": self.totals,
            "root": self.root.to_dict(),
            "windows": self.windows,
            "timeline": self.timeline,
            "notes": self.notes,
        }
        if self.carbon is not None:
            out["carbon"] = self.carbon
        out.update(self.extra)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=False, separators=(",", ":"))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically: a reader never sees half a profile."""
        write_atomic(Path(path), self.to_json())

    @classmethod
    def from_dict(cls, data: Any) -> Profile:
        if not isinstance(data, dict):
            raise ProfileFormatError("not a profile: the top level is not a JSON object")
        schema = data.get("schema")
        if not isinstance(schema, str) or not schema.startswith(SCHEMA_FAMILY):
            raise ProfileFormatError(f"not an energyprof profile (schema {schema!r})")
        try:
            major = int(schema[len(SCHEMA_FAMILY):].split(".")[0])
        except ValueError:
            raise ProfileFormatError(f"unreadable schema version {schema!r}") from None
        if major > SCHEMA_MAJOR:
            raise ProfileFormatError(
                f"profile schema {schema} is newer than this energyprof reads ({SCHEMA}); upgrade energyprof"
            )
        try:
            known = {"schema", "meta", "sources", "totals", "root", "windows", "timeline", "notes", "carbon"}
            return cls(
                meta=dict(data["meta"]),
                sources=list(data["sources"]),
                totals=dict(data["totals"]),
                root=Node.from_dict(data["root"]),
                windows=list(data.get("windows", [])),
                timeline=dict(data.get("timeline", {})),
                carbon=data.get("carbon"),
                notes=list(data.get("notes", [])),
                extra={k: v for k, v in data.items() if k not in known},
            )
        except (KeyError, TypeError) as exc:
            raise ProfileFormatError(f"profile is missing or mangles a field: {exc}") from None


def load(path: str | os.PathLike[str]) -> Profile:
    """Read a saved profile. Raises ProfileFormatError with a one-line reason."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileFormatError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ProfileFormatError(f"{path} is not a text file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileFormatError(f"{path} is not valid JSON (truncated or corrupt?): {exc.msg} at line {exc.lineno}") from None
    return Profile.from_dict(data)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside `path` and rename it into place."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a report is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
