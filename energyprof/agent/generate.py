"""A batched Hugging Face `generate`: each step a batch step, each row a request (energyprof/batches.py).

Each time the model prepares a step's inputs (`prepare_inputs_for_generation`, called once a step
outside the forward, which a compiler may trace) a step begins: the first is the prefill, each later
one whose sequence grew a decode; a step ends where the next begins, or where `generate` returns.
During the call nothing else is done: a clock read and a window's edge, no tensor read, so the loop
keeps its own device-to-host syncs and no more. Once `generate` has returned, its rows' tokens are read
from what it returned and written as one zero-length window `[batch rows]` (agent/unit_names.py): each
row a request adding its prompt's tokens to the prefill (its attention mask's ones, so padding adds
none) and one token to each decode until the one fed its end-of-sequence token. Rows are named
`g<call>.<row>`, calls numbered per process. Beam search and assisted decoding are not split (the call
runs as it would, without batch windows), nor is a call whose steps change the batch's shape.

Whatever fails in energyprof's part (a model without the method, an output of another shape) leaves
`generate` to run and return as it does without energyprof.
"""

from __future__ import annotations

import itertools
import threading
import time

from .current import running
from .unit_names import CALL_FACT, DECODES_PREFIX, REQUEST_PREFIX, ROWS_WINDOW, WINDOWS, request_key

# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

WINDOW = {phase: name for name, phase in WINDOWS.items()}
_calls = itertools.count()


class _GenerateSteps:
    """One `generate` call's steps (module docstring)."""

    def __init__(self, prof: Any, call: int) -> None:
        self.prof, self.call = prof, call
        self.owner = threading.get_ident()
        self.length: int | None = None  # the sequence's length at the last step
        self.first: int | None = None  # ... and at the first: where the new tokens begin
        self.mask: Any = None
        self.rows = 0
        self.decodes = 0
        self.open: str | None = None
        self.failed = False

    def step(self, input_ids: Any, kwargs: dict[str, Any]) -> None:
        """Called as the model prepares a forward's inputs: a longer sequence than the last is a new step."""
        if self.failed or threading.get_ident() != self.owner or getattr(input_ids, "ndim", 0) != 2:
            return
        try:
            length, rows = int(input_ids.shape[1]), int(input_ids.shape[0])
            if self.length is None:
                self.first, self.rows, self.mask = length, rows, kwargs.get("attention_mask")
                self._mark(WINDOW["prefill"])
            elif length > self.length and rows == self.rows:
                self.decodes += 1
                self._mark(WINDOW["decode"])
            elif rows != self.rows:
                self.failed = True  # another shape through the loop: not split
                self.close()
            self.length = length
        except Exception:  # noqa: BLE001 - a step unmarked is better than a program disturbed
            self.failed = True

    def _mark(self, name: str) -> None:
        self.close()
        self.prof.begin_window(name)
        self.open = name

    def close(self) -> None:
        if self.open is not None:
            name, self.open = self.open, None
            self.prof.end_window(name, facts={CALL_FACT: float(self.call)})

    def finish(self, output: Any, eos: set[int]) -> None:
        """The rows' tokens, from the returned sequences, as a zero-length window (analysis/tokens.py reads it)."""
        if self.failed or self.first is None:
            return
        sequences = getattr(output, "sequences", output)
        if getattr(sequences, "ndim", 0) != 2 or int(sequences.shape[0]) != self.rows:
            return
        new = sequences[:, self.first:].tolist()
        mask = self.mask
        prompts = ([float(x) for x in mask.sum(dim=1).tolist()] if getattr(mask, "ndim", 0) == 2
                   else [float(self.first)] * self.rows)
        facts: dict[str, float] = {CALL_FACT: float(self.call)}
        for r, row in enumerate(new):
            # a row takes part in each decode until the one fed its end of sequence
            ran = next((i for i, t in enumerate(row) if int(t) in eos), len(row))
            key = request_key(f"g{self.call}.{r}")
            facts[key] = prompts[r]
            facts[DECODES_PREFIX + key[len(REQUEST_PREFIX):]] = float(min(ran, self.decodes))
        t = time.perf_counter_ns()  # zero length: it holds facts, no energy
        self.prof.begin_window(ROWS_WINDOW, t_ns=t)
        self.prof.end_window(ROWS_WINDOW, facts=facts, t_ns=t)


def _eos_ids(model: Any, kwargs: dict[str, Any]) -> set[int]:
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    eos = kwargs.get("eos_token_id", getattr(config, "eos_token_id", None))
    if eos is None:
        return set()
    if hasattr(eos, "tolist"):
        eos = eos.tolist()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


_UNSET = object()


def _watch(model: Any, steps: _GenerateSteps) -> Any:
    """Have the model's `prepare_inputs_for_generation` (called once per step, outside the forward a compiler
    may trace) mark the steps, for this call only; returns what the instance held before."""
    before = model.__dict__.get("prepare_inputs_for_generation", _UNSET)
    prepare = model.prepare_inputs_for_generation

    def prepare_inputs_for_generation(input_ids: Any, *args: Any, **kwargs: Any) -> Any:
        steps.step(input_ids, kwargs)
        return prepare(input_ids, *args, **kwargs)

    model.__dict__["prepare_inputs_for_generation"] = prepare_inputs_for_generation
    return before


def _unwatch(model: Any, before: Any) -> None:
    if before is _UNSET:
        model.__dict__.pop("prepare_inputs_for_generation", None)
    else:
        model.__dict__["prepare_inputs_for_generation"] = before


def _wrap_generate(generate: Any) -> Any:
    import functools

    @functools.wraps(generate)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            prof = running()
            config = kwargs.get("generation_config") or getattr(self, "generation_config", None)
            beams = kwargs.get("num_beams") or getattr(config, "num_beams", 1) or 1
            split = (prof is not None and int(beams) == 1 and "assistant_model" not in kwargs
                     and hasattr(self, "__dict__") and hasattr(self, "prepare_inputs_for_generation"))
            if split:
                eos = _eos_ids(self, kwargs)
                steps = _GenerateSteps(prof, next(_calls))
                before = _watch(self, steps)
        except Exception:  # noqa: BLE001 - energyprof's part failed to start: generate runs as it is
            split = False
        if not split:
            return generate(self, *args, **kwargs)
        try:
            output = generate(self, *args, **kwargs)
        finally:
            try:
                _unwatch(self, before)
                steps.close()
            except Exception:  # noqa: BLE001 - the program's result (or its exception) is what counts
                pass
        try:
            steps.finish(output, eos)
        except Exception:  # noqa: BLE001
            pass
        return output

    wrapper.__energyprof_generate__ = True  # type: ignore[attr-defined]
    return wrapper


def hook_generate(module: Any) -> bool:
    """Have `module.GenerationMixin.generate` (transformers' generation module) split its steps per row,
    once; a no-op without a running profile. False where the module has none."""
    mixin = getattr(module, "GenerationMixin", None)
    generate = getattr(mixin, "generate", None)
    if generate is None:
        return False
    if not getattr(generate, "__energyprof_generate__", False):
        mixin.generate = _wrap_generate(generate)
    return True
