"""Tokens in a batch: which requests a batched step serves, and how many tokens each adds.

    with energyprof.batch(requests=["a", "b"], tokens=[12, 7], phase="prefill"):
        logits = model(batch)                  # one step for both requests

Each step is a window, `[batch prefill]` or `[batch decode]`, whose facts are the tokens each
request added in it (`req:<id>` -> tokens). The report splits each step's energy among its
requests by those tokens, prefill and decode apart (analysis/tokens.py states the rule).

Hugging Face `generate` needs no code under `python -m energyprof` (agent/autoload.py calls
`hook_generate` when the program imports transformers' generation module; in process, call
`hook_generate()` once): during a batched `generate`, each forward of the model is a step. The
first forward is the prefill, each row a request adding its prompt's tokens (its attention mask's
ones, so padding adds none); every later forward is a decode step adding one token for each row
still unfinished (no end-of-sequence token fed to it yet). Rows are named `g<call>.<row>`.
Beam search and assisted decoding run other shapes through the forward: their steps are not
split (the call runs as it would, without batch windows).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Any, Iterator, Sequence

from .analysis.tokens import REQUEST_PREFIX, WINDOWS

PHASES = ("prefill", "decode")
WINDOW = {phase: name for name, phase in WINDOWS.items()}  # each phase's window name, one home: analysis/tokens.py
_calls = itertools.count()


def request_key(request: object) -> str:
    """A request's id as a window fact's name: the separators of the facts' encoding are left out."""
    text = str(request)
    for bad in (";", "=", "\t", "\n", "\r"):
        text = text.replace(bad, "_")
    return REQUEST_PREFIX + text


def step_facts(requests: Sequence[object], tokens: Sequence[float], phase: str) -> dict[str, float]:
    """The facts of one step's window; ValueError (one line) for what cannot be split."""
    if phase not in PHASES:
        raise ValueError(f"energyprof.batch: phase must be one of {', '.join(PHASES)}, not {phase!r}")
    if len(requests) != len(tokens):
        raise ValueError(f"energyprof.batch: {len(requests)} requests but {len(tokens)} token counts")
    facts: dict[str, float] = {}
    for r, t in zip(requests, tokens):
        n = float(t)
        if not n >= 0 or n == float("inf"):
            raise ValueError(f"energyprof.batch: request {r!r} adds {t!r} tokens: a count is a finite number, 0 or more")
        key = request_key(r)
        facts[key] = facts.get(key, 0.0) + n
    return facts


@contextlib.contextmanager
def batch(requests: Sequence[object], tokens: Sequence[float], phase: str = "decode",
          profiler: Any = None) -> Iterator[None]:
    """One batched step serving `requests`, each adding `tokens[i]` tokens, in `phase` (prefill or decode).
    Without a running profile the block just runs."""
    facts = step_facts(list(requests), list(tokens), phase)
    if profiler is None:
        from .drive.profiler import active_profiler

        profiler = active_profiler()
    if profiler is None:
        yield
        return
    name = WINDOW[phase]
    profiler.begin_window(name)
    try:
        yield
    finally:
        profiler.end_window(name, facts=facts)


# -- Hugging Face generate -------------------------------------------------------------------------
class _GenerateSteps:
    """One `generate` call's forwards as batch steps (module docstring)."""

    def __init__(self, prof: Any, call: int, eos: set[int]) -> None:
        self.prof, self.call, self.eos = prof, call, eos
        self.rows = 0
        self.done: set[int] = set()
        self.step = 0
        self.open: str | None = None
        self.owner = threading.get_ident()

    def before(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.open is not None or threading.get_ident() != self.owner:
            return  # a forward inside a forward (an assistant model), or another thread's: not a step
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None or getattr(ids, "ndim", 0) != 2:
            return
        if self.step == 0:
            self.rows = int(ids.shape[0])
            mask = kwargs.get("attention_mask")
            counts = ([float(x) for x in mask.sum(dim=1).tolist()] if mask is not None and mask.ndim == 2
                      else [float(ids.shape[1])] * self.rows)
            rows, phase = list(range(self.rows)), "prefill"
        else:
            if int(ids.shape[0]) != self.rows:
                return
            last = ids[:, -1].tolist()
            self.done |= {r for r in range(self.rows) if int(last[r]) in self.eos}
            rows = [r for r in range(self.rows) if r not in self.done]
            counts, phase = [1.0] * len(rows), "decode"
        self.step += 1
        facts = step_facts([f"g{self.call}.{r}" for r in rows], counts, phase)
        self.open = WINDOW[phase]
        self.facts = facts
        self.prof.begin_window(self.open)

    def after(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        if self.open is not None and threading.get_ident() == self.owner:
            name, self.open = self.open, None
            self.prof.end_window(name, facts=self.facts)


def _eos_ids(model: Any, kwargs: dict[str, Any]) -> set[int]:
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    eos = kwargs.get("eos_token_id", getattr(config, "eos_token_id", None))
    if eos is None:
        return set()
    if hasattr(eos, "tolist"):
        eos = eos.tolist()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def _wrap_generate(generate: Any) -> Any:
    import functools

    @functools.wraps(generate)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        from .drive.profiler import active_profiler

        prof = active_profiler()
        config = kwargs.get("generation_config") or getattr(self, "generation_config", None)
        beams = kwargs.get("num_beams") or getattr(config, "num_beams", 1) or 1
        if prof is None or int(beams) != 1 or "assistant_model" in kwargs or not hasattr(self, "register_forward_hook"):
            return generate(self, *args, **kwargs)
        steps = _GenerateSteps(prof, next(_calls), _eos_ids(self, kwargs))
        handles = [self.register_forward_pre_hook(steps.before, with_kwargs=True),
                   self.register_forward_hook(steps.after, with_kwargs=True, always_call=True)]
        try:
            return generate(self, *args, **kwargs)
        finally:
            for h in handles:
                h.remove()

    wrapper.__energyprof_generate__ = True  # type: ignore[attr-defined]
    return wrapper


def hook_generate(module: Any = None) -> bool:
    """Have `GenerationMixin.generate` split its steps per row (once; a no-op without a running profile).
    `module`: transformers' generation module, imported here when not given. False where there is none."""
    if module is None:
        try:
            import transformers.generation.utils as module  # noqa: PLC0415 - only when asked
        except ImportError:
            return False
    mixin = getattr(module, "GenerationMixin", None)
    generate = getattr(mixin, "generate", None)
    if generate is None:
        return False
    if not getattr(generate, "__energyprof_generate__", False):
        mixin.generate = _wrap_generate(generate)
    return True
