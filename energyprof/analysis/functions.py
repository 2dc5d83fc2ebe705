"""Function rows: each function merged over its call paths, and what counts as a library frame. Pure."""

from __future__ import annotations

import functools
import math
import re

from ..record import field, record
from ..facts.profile import Node
from ..facts.profile import Profile

FunctionKey = tuple[str, str, int]

_LIBRARY_RE = re.compile(
    r"(site-packages|dist-packages)[/\\]"          # installed packages
    r"|[/\\]lib[/\\]python\d+(\.\d+)?t?[/\\]"      # a POSIX standard library
    r"|[/\\]Lib[/\\]"                              # a Windows standard library
    r"|^<frozen "                                  # frozen stdlib modules
)


@functools.lru_cache(maxsize=65536)
def is_library(file: str) -> bool:
    """site-packages and standard-library frames, judged from the path alone (the report may be
    rendered on another machine than the one that ran the program)."""
    return bool(file) and bool(_LIBRARY_RE.search(file))


def relative_error(samples: int) -> float | None:
    """Sampling error of a figure built from n samples: about 1/sqrt(n)."""
    return 1.0 / math.sqrt(samples) if samples > 0 else None


@record
class FunctionRow:
    """One function merged over every call path it appears on.

    Self figures add up over paths; inclusive ones count a recursive function once (a path that
    already has the function on it adds nothing more), so a row never exceeds the run's total.
    """

    function: str
    file: str
    line: int
    self_energy_j: dict[str, float] = field(default_factory=dict)
    energy_j: dict[str, float] = field(default_factory=dict)
    self_time_s: float = 0.0
    time_s: float = 0.0
    self_cpu_time_s: float = 0.0
    cpu_time_s: float = 0.0
    self_samples: int = 0
    samples: int = 0
    paths: int = 0
    # the part of `energy_j` (all sources) in backward, and its samples (analysis/phases.py); None: the
    # profile has no `[backward]` frame, so forward and backward are not told apart
    backward_j: float | None = None
    backward_samples: int = 0

    @property
    def backward_relative_error(self) -> float | None:
        return relative_error(self.backward_samples)

    @property
    def self_total_energy(self) -> float:
        return sum(self.self_energy_j.values())

    @property
    def total_energy(self) -> float:
        return sum(self.energy_j.values())

    @property
    def self_relative_error(self) -> float | None:
        """The ± that belongs beside self energy: from the function's own samples."""
        return relative_error(self.self_samples)

    @property
    def relative_error(self) -> float | None:
        """The ± that belongs beside inclusive energy."""
        return relative_error(self.samples)


def node_key(node: Node) -> FunctionKey:
    return (node.function, node.file, node.line)


def function_rows(profile: Profile, include_root: bool = True, backward: bool = False) -> list[FunctionRow]:
    """Every function of the profile once, in first-seen (pre-order) order.

    The root node (the program as a whole) is a row too: its self energy is the start-up and
    tear-down outside any Python frame, and without it the rows would not add up to the total.
    `backward`: each row also holds the part of its inclusive energy in backward (counted as the
    inclusive figure is, a recursive function once).
    """
    within = None
    if backward:  # the phases' module only for a tree whose backward was linked
        from .phases import backward_within

        within = backward_within(profile.root)
    rows: dict[FunctionKey, FunctionRow] = {}
    on_path: dict[FunctionKey, int] = {}  # how often each function is on the current call path
    path: list[FunctionKey] = []
    for node, depth in profile.walk():
        for left in path[depth:]:  # the walk left these subtrees
            on_path[left] -= 1
        del path[depth:]
        key = node_key(node)
        if depth or include_root:
            row = rows.get(key)
            if row is None:
                row = rows[key] = FunctionRow(node.function, node.file, node.line)
                if within is not None:
                    row.backward_j = 0.0
            for src, j in node.self_energy_j.items():
                row.self_energy_j[src] = row.self_energy_j.get(src, 0.0) + j
            row.self_time_s += node.self_time_s
            row.self_cpu_time_s += node.self_cpu_time_s
            row.self_samples += node.self_samples
            row.paths += 1
            if not on_path.get(key):
                for src, j in node.energy_j.items():
                    row.energy_j[src] = row.energy_j.get(src, 0.0) + j
                row.time_s += node.time_s
                row.cpu_time_s += node.cpu_time_s
                row.samples += node.samples
                if within is not None:
                    j, n = within[id(node)]
                    row.backward_j = (row.backward_j or 0.0) + j
                    row.backward_samples += n
        on_path[key] = on_path.get(key, 0) + 1
        path.append(key)
    return list(rows.values())
