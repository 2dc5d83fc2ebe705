"""The ledger's running tallies: a stack's, a process's and a window's figures as the fold charges them,
each under both idle policies (`share`, `all`). Nothing outside the ledger reads a tally's figures but
through the ledger (`account`, `program_parts`, the tree it builds)."""

from __future__ import annotations

from typing import Any

from ..record import field, record


@record(slots=True)
class StackTally:
    """A stack's figures: its time, CPU, samples, memory, and its energy under each idle policy."""

    time_ns: int = 0
    cpu_ns: int = 0
    samples: int = 0
    peak_rss: int = 0
    rss_growth: float = 0.0
    share: list[float] = field(default_factory=list)
    all: list[float] = field(default_factory=list)
    alloc_bytes: float = 0.0  # memory=exact: net bytes tracemalloc saw allocated while it ran


@record(slots=True)
class ProcessTally:
    """One process of the job: what the ledger learnt of it from its samples."""

    share: list[float]
    all: list[float]
    cpu_ns: int = 0
    peak_rss: int = 0
    last_rss: int = 0
    last_sid: int = -1


@record(slots=True)
class WindowTally:
    """A window while the ledger charges it: the machine's energy inside it and the program's part
    under each idle policy, per source, growing with every interval it overlaps. `done`: every such
    interval is charged, so the figures are final. `Ledger.account` freezes it into a WindowAccount,
    the one shape every view reads; nothing outside the ledger reads a tally's figures."""

    name: str
    index: int | None
    start_ns: int
    machine: list[float]
    share: list[float]
    all: list[float]
    depth: int = 0
    pid: int | None = None  # several processes (ranks) mark windows of the same names, each its own nesting
    end_ns: int | None = None
    done: bool = False
    loop: dict[str, float] = field(default_factory=dict)  # what the program measured about the span
    unit: int | None = None  # a unit of work's window (a web request's): charged with its samples (Sample.unit)
    samples: int = 0  # a unit's: how many of its samples ended in the intervals charged so far
    cpu_ns: int = 0  # ... and their CPU

    def to_state(self) -> dict[str, Any]:
        """The checkpoint's JSON form (the keys checkpoints have always had)."""
        out: dict[str, Any] = {"name": self.name, "index": self.index, "start_ns": self.start_ns, "end_ns": self.end_ns,
                               "energy": self.machine, "program": self.share, "program_all": self.all,
                               "done": self.done, "depth": self.depth}
        if self.pid is not None:
            out["pid"] = self.pid
        if self.loop:
            out["loop"] = self.loop
        if self.unit is not None:
            out["unit"], out["samples"], out["cpu_ns"] = self.unit, self.samples, self.cpu_ns
        return out

    @classmethod
    def from_state(cls, raw: dict[str, Any], n: int) -> WindowTally:
        """A tally from a checkpoint's JSON form; one written before the program's parts were kept starts them at 0."""
        return cls(name=str(raw["name"]), index=raw.get("index"), start_ns=int(raw["start_ns"]),
                   machine=[float(x) for x in raw["energy"]],
                   share=[float(x) for x in raw.get("program") or [0.0] * n],
                   all=[float(x) for x in raw.get("program_all") or [0.0] * n],
                   depth=int(raw.get("depth", 0)), pid=raw.get("pid"),
                   end_ns=None if raw.get("end_ns") is None else int(raw["end_ns"]), done=bool(raw.get("done")),
                   loop={str(k): float(v) for k, v in (raw.get("loop") or {}).items()},
                   unit=None if raw.get("unit") is None else int(raw["unit"]), samples=int(raw.get("samples", 0)),
                   cpu_ns=int(raw.get("cpu_ns", 0)))
