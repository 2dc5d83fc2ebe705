"""Tokens in a batch: which requests a batched step serves, and how many tokens each adds.

    with energyprof.batch(requests=["a", "b"], tokens=[12, 7], phase="prefill"):
        logits = model(batch)                  # one step for both requests

Each step is a window, `[batch prefill]` or `[batch decode]`, whose facts are the tokens each
request added in it (`req:<id>` -> tokens). The report splits each step's energy among its
requests by those tokens, prefill and decode apart (analysis/tokens.py states the rule).

Hugging Face `generate` needs no code under `python -m energyprof` (the agent wraps it when the
program imports transformers' generation module: agent/autoload.py); in process, call
`hook_generate()` once. agent/generate.py says how a batched `generate`'s steps and rows are found.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

from .agent.current import running
from .agent.generate import WINDOW
from .agent.generate import hook_generate as _hook_generate
from .agent.unit_names import request_key

PHASES = ("prefill", "decode")
__all__ = ["PHASES", "WINDOW", "batch", "hook_generate", "request_key", "step_facts"]


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
        profiler = running()
    if profiler is None:
        yield
        return
    name = WINDOW[phase]
    profiler.begin_window(name)
    try:
        yield
    finally:
        profiler.end_window(name, facts=facts)


def hook_generate(module: Any = None) -> bool:
    """Have `GenerationMixin.generate` split its steps per row (once; a no-op without a running profile).
    `module`: transformers' generation module, imported here when not given. False where there is none."""
    if module is None:
        try:
            import transformers.generation.utils as module  # noqa: PLC0415 - only when asked
        except ImportError:
            return False
    return _hook_generate(module)
