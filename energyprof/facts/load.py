"""The machine's load during a run: its busy CPU, the program's and energyprof's, so `compare` can tell the
neighbours' doing from the code's."""

from __future__ import annotations

from typing import Any

from ..record import record
from .records import ProfileFormatError, _Record, integer, number

MACHINE_LOAD_FIELD = "machine_load"


@record
class MachineLoad(_Record):
    """How busy the machine was over the run (between its first and last reading): its busy CPU (all
    cores, /proc/stat), the program's CPU (children in, energyprof out) and energyprof's, on `cpus` logical
    CPUs over `span_s`. Other processes' share is what the neighbours used: under `share` it moves the
    program's part of idle power, so `compare` reads it before calling a change the code's."""

    cpus: int
    span_s: float
    busy_cpu_s: float
    program_cpu_s: float
    energyprof_cpu_s: float = 0.0

    @property
    def capacity_s(self) -> float:
        return self.span_s * self.cpus

    @property
    def usage(self) -> float:
        """The machine's busy share of its CPU capacity, 0 to 1."""
        return min(1.0, self.busy_cpu_s / self.capacity_s) if self.capacity_s > 0 else 0.0

    @property
    def others_share(self) -> float:
        """Other processes' share of the machine's CPU capacity, 0 to 1."""
        if self.capacity_s <= 0:
            return 0.0
        others = self.busy_cpu_s - self.program_cpu_s - self.energyprof_cpu_s
        return min(1.0, max(0.0, others / self.capacity_s))

    @property
    def program_share(self) -> float:
        """The program's share of the machine's CPU capacity (not of its busy time), 0 to 1."""
        return min(1.0, self.program_cpu_s / self.capacity_s) if self.capacity_s > 0 else 0.0


def read_machine_load(raw: Any) -> MachineLoad:
    w = MACHINE_LOAD_FIELD
    if not isinstance(raw, dict):
        raise ProfileFormatError(f"{w} must be an object")
    cpus = integer(raw.get("cpus"), f"{w}.cpus")
    if not cpus or cpus < 1:
        raise ProfileFormatError(f"{w}.cpus must be at least 1")
    return MachineLoad(cpus=cpus, span_s=number(raw.get("span_s"), f"{w}.span_s"),
                       busy_cpu_s=number(raw.get("busy_cpu_s"), f"{w}.busy_cpu_s"),
                       program_cpu_s=number(raw.get("program_cpu_s"), f"{w}.program_cpu_s"),
                       energyprof_cpu_s=number(raw.get("energyprof_cpu_s", 0.0), f"{w}.energyprof_cpu_s"))
