"""The ledger's one typed account of a window (read from facts/policy.py as well, where the policy
it is written in lives). Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from .policy import IdlePolicy, PolicyPair


@dataclass(frozen=True)
class WindowAccount:
    """One window as the ledger charged it: the one shape every view of a window (the profile's
    Window, a Measurement, the line the supervisor hands back to the program) is built from.

    Energies are per source, in the order of `sources`: the machine's inside the window, and the
    program's part of it under each policy. `estimated`: some source is an estimate, not a reading.
    `done`: every interval the window overlaps is charged, so the figures are final."""

    name: str
    index: int | None
    depth: int
    pid: int | None
    start_ns: int
    end_ns: int
    sources: tuple[str, ...]
    machine_j: tuple[float, ...]
    program_j: PolicyPair[tuple[float, ...]]
    estimated: bool = False
    done: bool = False
    loop: tuple[tuple[str, float], ...] = ()  # what the program measured about the span, as (name, value)

    @property
    def time_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def machine(self) -> dict[str, float]:
        """The machine's energy inside the window, by source id."""
        return dict(zip(self.sources, self.machine_j))

    def program(self, policy: IdlePolicy) -> dict[str, float]:
        """The program's part under `policy`, by source id."""
        return dict(zip(self.sources, self.program_j.pick(policy)))
