"""Energy per request and per token from batched steps (energyprof.batch, a batched `generate`). Pure.

The rule. Each step is a window `[batch prefill]` or `[batch decode]` whose facts are the tokens
each of its requests added (`req:<id>`). A step's energy E (the program's part of the window,
the run's headline kind of figure) goes to its requests in proportion to their tokens:
request r gets E * t_r / sum(t). Prefill steps and decode steps are split apart, each by its
own tokens (a prompt token costs a prefill far less than a generated token costs a decode, so one
pool split by all tokens would charge long prompts for others' generation). A step whose
requests added no tokens splits its energy evenly among them.

A request's output tokens: one for its prefill (that forward emits the first new token) plus
one per decode token. J per output token = (prefill J + decode J) / output tokens.

Against the ML.ENERGY method: the ML.ENERGY benchmark gives each request the steady-state
energy per output token (here the decode steps' energy over their tokens) times its output
tokens. The run's table puts that figure beside the split, per request and in total: where
prompts are long or batches ragged, the two differ, and the split is the one whose requests'
energies add up to the steps' energy.
"""

from __future__ import annotations

from typing import Callable, Iterable

from ..record import field, record
from ..facts.profile import Profile, Window
from ..agent.unit_names import CALL_FACT, DECODES_PREFIX, REQUEST_PREFIX, ROWS_WINDOW, WINDOWS
from .tests_table import window_edge_error_j
from .kinds import is_batch_window, window_program_j  # noqa: F401 - is_batch_window: named here as before


@record
class RequestTokens:
    """One request's share of the batched steps that served it."""

    request: str
    prefill_j: float = 0.0
    decode_j: float = 0.0
    prefill_tokens: float = 0.0
    decode_tokens: float = 0.0
    prefill_steps: int = 0
    decode_steps: int = 0
    mlenergy_j: float | None = None  # what the ML.ENERGY method would give it
    error_j: float = 0.0  # its token share of each of its steps' bars, added
    pid: int | None = None  # the process that served it: requests are told apart by (pid, request)

    @property
    def energy_j(self) -> float:
        return self.prefill_j + self.decode_j

    @property
    def output_tokens(self) -> float:
        return (1.0 if self.prefill_steps else 0.0) + self.decode_tokens

    @property
    def j_per_output_token(self) -> float | None:
        return self.energy_j / self.output_tokens if self.output_tokens else None


@record
class TokenRun:
    """The run's batched steps together: per request, and per token."""

    requests: list[RequestTokens] = field(default_factory=list)
    prefill_j: float = 0.0
    decode_j: float = 0.0
    steps: int = 0
    error_j: float = 0.0  # the steps' bars added (analysis/tests_table.py: where each step's edges fall)
    estimated: bool = False  # any source's figures estimated, not measured

    @property
    def energy_j(self) -> float:
        return self.prefill_j + self.decode_j

    @property
    def output_tokens(self) -> float:
        return sum(r.output_tokens for r in self.requests)

    @property
    def j_per_token(self) -> float | None:
        """All the steps' energy over all output tokens."""
        return self.energy_j / self.output_tokens if self.output_tokens else None

    @property
    def steady_j_per_token(self) -> float | None:
        """The decode steps' energy over their tokens: the ML.ENERGY method's steady-state figure."""
        tokens = sum(r.decode_tokens for r in self.requests)
        return self.decode_j / tokens if tokens else None

    @property
    def mlenergy_j(self) -> float | None:
        """What the ML.ENERGY method would apportion to the requests in all."""
        if self.steady_j_per_token is None:
            return None
        return sum(r.mlenergy_j or 0.0 for r in self.requests)


def step_tokens(w: Window) -> dict[str, float]:
    """A step's requests and the tokens each added, from its window's facts."""
    return {k[len(REQUEST_PREFIX):]: v for k, v in w.loop.items() if k.startswith(REQUEST_PREFIX)}


def steps(windows: Iterable[Window]) -> list[tuple[Window, str, dict[str, float]]]:
    """Every batched step among `windows`, in time order: its window, its phase, its requests' tokens.
    A batched `generate`'s steps read their rows' tokens from their call's `[batch rows]` window
    (energyprof/unit_names.py): the prefill adds each row's prompt, the k-th decode one token for each row
    that took part in at least k decodes; a call without that window is left out. Calls are told apart by
    process."""
    ordered = sorted(windows, key=lambda w: w.start_s)
    rows: dict[tuple[int | None, float], Window] = {
        (w.pid, w.loop.get(CALL_FACT, -1.0)): w for w in ordered if w.name == ROWS_WINDOW}
    decodes: dict[tuple[int | None, float], int] = {}
    out = []
    for w in ordered:
        phase = WINDOWS.get(w.name)
        if phase is None:
            continue
        tokens = step_tokens(w)
        call = w.loop.get(CALL_FACT)
        if not tokens and call is not None:
            key = (w.pid, call)
            summary = rows.get(key)
            if summary is None:  # a call whose rows were never read (it failed, or changed shape): not split
                continue
            prompts = step_tokens(summary)
            if phase == "prefill":
                tokens = prompts
            else:
                decodes[key] = k = decodes.get(key, 0) + 1
                tokens = {r: 1.0 for r in prompts if summary.loop.get(DECODES_PREFIX + r, 0.0) >= k}
        out.append((w, phase, tokens))
    return out


def split_step(energy_j: float, tokens: dict[str, float]) -> dict[str, float]:
    """A step's energy among its requests by their tokens (evenly when none added any)."""
    if not tokens:
        return {}
    total = sum(tokens.values())
    if total <= 0:
        return {r: energy_j / len(tokens) for r in tokens}
    return {r: energy_j * t / total for r, t in tokens.items()}


def token_run(windows: Iterable[Window], bar: Callable[[Window, float], float] | None = None,
              estimated: bool = False) -> TokenRun | None:
    """The batched steps among `windows` split per request (module docstring); None without any.
    Requests are told apart by process: two processes' `g0.0` are two requests. `bar`: a step's bar from
    its window and energy (none without it); a request's bar is its token share of its steps' bars."""
    run = TokenRun(estimated=estimated)
    by_request: dict[tuple[int | None, str], RequestTokens] = {}
    for w, phase, tokens in steps(windows):
        energy = window_program_j(w)
        error = bar(w, energy) if bar is not None else 0.0
        run.error_j += error
        run.steps += 1
        if phase == "prefill":
            run.prefill_j += energy
        else:
            run.decode_j += energy
        errors = split_step(error, tokens)
        for request, joules in split_step(energy, tokens).items():
            row = by_request.get((w.pid, request))
            if row is None:
                row = by_request[(w.pid, request)] = RequestTokens(request, pid=w.pid)
            row.error_j += errors[request]
            if phase == "prefill":
                row.prefill_j += joules
                row.prefill_tokens += tokens[request]
                row.prefill_steps += 1
            else:
                row.decode_j += joules
                row.decode_tokens += tokens[request]
                row.decode_steps += 1
    if not run.steps:
        return None
    run.requests = list(by_request.values())
    steady = run.steady_j_per_token
    for row in run.requests:
        row.mlenergy_j = None if steady is None else steady * row.output_tokens
    return run


def profile_tokens(profile: Profile) -> TokenRun | None:
    """The profile's batched steps, each with the tests' edge bar, measured or estimated as its sources are."""
    interval = float(profile.meta.get("sensor_interval_s") or 0.05)
    return token_run(profile.windows, lambda w, energy: window_edge_error_j(profile, w, energy, interval),
                     any(s.method != "measured" for s in profile.sources))
