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

from typing import Iterable

from ..record import field, record
from ..facts.profile import Profile, Window
from .training import window_program_j

WINDOWS = {"[batch prefill]": "prefill", "[batch decode]": "decode"}
REQUEST_PREFIX = "req:"


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


def split_step(energy_j: float, tokens: dict[str, float]) -> dict[str, float]:
    """A step's energy among its requests by their tokens (evenly when none added any)."""
    if not tokens:
        return {}
    total = sum(tokens.values())
    if total <= 0:
        return {r: energy_j / len(tokens) for r in tokens}
    return {r: energy_j * t / total for r, t in tokens.items()}


def token_run(windows: Iterable[Window]) -> TokenRun | None:
    """The batched steps among `windows` split per request (module docstring); None without any."""
    run = TokenRun()
    by_request: dict[str, RequestTokens] = {}
    for w in sorted(windows, key=lambda w: w.start_s):
        phase = WINDOWS.get(w.name)
        if phase is None:
            continue
        energy = window_program_j(w)
        tokens = step_tokens(w)
        run.steps += 1
        if phase == "prefill":
            run.prefill_j += energy
        else:
            run.decode_j += energy
        for request, joules in split_step(energy, tokens).items():
            row = by_request.get(request)
            if row is None:
                row = by_request[request] = RequestTokens(request)
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
    return token_run(profile.windows)
