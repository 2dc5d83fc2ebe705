"""The idle policy: the one vocabulary for who pays for the energy no process used.

`share`: the program pays its CPU share of the machine's busy CPU (the machine counted idle below
IDLE_FLOOR of its capacity); `all`: the program pays for the whole machine (a dedicated one), less
energyprof's own part. The chosen policy is one value that travels with a run: the options, the
ledger, the profile's `meta.idle_policy`, a join of ranks and `energyprof merge` all read it from here.
Pure: no I/O.
"""

# No `from __future__ import annotations`: NamedTuple would turn each of WindowAccount's string annotations
# into a ForwardRef, compiling it, on every run's start; the fields' types are evaluated as written instead.
from typing import TYPE_CHECKING, Any, Generic, Literal, NamedTuple, TypeVar

if TYPE_CHECKING:
    IdlePolicy = Literal["share", "all"]
else:
    IdlePolicy = str  # to type checkers the literal above
#: Every policy, the default first.
IDLE_POLICIES: tuple[IdlePolicy, ...] = ("share", "all")
DEFAULT_POLICY: IdlePolicy = "share"
IDLE_FLOOR = 0.05  # below 5% of all cores busy, the machine counts as idle

T = TypeVar("T")


class PolicyError(ValueError):
    """An idle policy that is not one of IDLE_POLICIES; its message is one line."""


def check_policy(policy: object) -> IdlePolicy:
    """`policy` itself when it is one of IDLE_POLICIES; PolicyError otherwise."""
    if policy not in IDLE_POLICIES:
        raise PolicyError(f"idle policy must be one of {', '.join(IDLE_POLICIES)}, not {policy!r}")
    return policy  # type: ignore[return-value]


def other(policy: IdlePolicy) -> IdlePolicy:
    """The policy a profile keeps beside its own."""
    return "all" if check_policy(policy) == "share" else "share"


class PolicyPair(Generic[T]):
    """One figure under both policies, so that a view can be chosen after the run.

    Immutable, compared and hashed by value, as a frozen record would be; written out because
    the options' vocabulary is read from here by `energyprof --help`, which makes no records."""

    __slots__ = ("share", "all")
    share: T
    all: T

    def __init__(self, share: T, all: T) -> None:  # noqa: A002 - the policy's own name
        object.__setattr__(self, "share", share)
        object.__setattr__(self, "all", all)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")

    def __repr__(self) -> str:
        return f"PolicyPair(share={self.share!r}, all={self.all!r})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.share, self.all) == (other.share, other.all)  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((self.share, self.all))

    def pick(self, policy: IdlePolicy) -> T:
        return self.share if check_policy(policy) == "share" else self.all


def common_policy(policies: list[str]) -> IdlePolicy:
    """The one policy several profiles of a job were run under (a join keeps it); the default
    when they disagree or say nothing, since each holds figures for both."""
    chosen = {p for p in policies if p in IDLE_POLICIES}
    return chosen.pop() if len(chosen) == 1 else DEFAULT_POLICY  # type: ignore[return-value]


def cpu_share(proc_ns: float, busy_ns: float, capacity_ns: float) -> float:
    """The program's share of a CPU-class source over one span: its CPU over the machine's busy
    CPU (the larger of the two: /proc/stat moves in 10 ms ticks), the machine idle below
    IDLE_FLOOR of capacity; in [0, 1]."""
    # max() and min() written out: a Monitor works this out for every window it is asked about
    proc = proc_ns if proc_ns > 0 else 0.0
    denom = proc if proc >= busy_ns else busy_ns
    floor = IDLE_FLOOR * capacity_ns
    if floor > denom:
        denom = floor
    if denom <= 0:
        return 0.0
    share = proc / denom
    return share if share < 1.0 else 1.0


class WindowAccount(NamedTuple):
    """One window as the ledger charged it: the one shape every view of a window (the profile's
    Window, a Measurement, the line the supervisor hands back to the program) is built from.
    Immutable; a named tuple, like the ledger's Tick and Sample, because a Monitor makes one per
    window on the program's own time (a frozen dataclass cost it 1.2 us more).

    Energies are per source, in the order of `sources`: the machine's inside the window, and the
    program's part of it under each policy. `estimated`: some source is an estimate, not a reading.
    `done`: every interval the window overlaps is charged, so the figures are final. `policies`: those
    whose program figures it holds; the ledger's hold both, a Monitor under `all` reads no machine
    CPU (the share's cost) and holds `all` only: asked for another, `program` refuses."""

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
    policies: tuple[IdlePolicy, ...] = IDLE_POLICIES

    @property
    def time_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def machine(self) -> dict[str, float]:
        """The machine's energy inside the window, by source id."""
        return dict(zip(self.sources, self.machine_j))

    def program(self, policy: IdlePolicy) -> dict[str, float]:
        """The program's part under `policy`, by source id."""
        if policy not in self.policies:
            raise PolicyError(f"window {self.name!r} holds the program's part under {', '.join(self.policies)} only, "
                              f"not {policy!r}")
        pair = self.program_j  # the policy is one of IDLE_POLICIES here: no second check
        return dict(zip(self.sources, pair.share if policy == "share" else pair.all))
