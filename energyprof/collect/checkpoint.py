"""Reading side of checkpoints: a checkpoint left by a killed run (SIGKILL, crash, OOM) becomes a Profile."""

from __future__ import annotations

from typing import Any


from ..core import ledger_state
from ..core.tree import build_profile
from ..facts.profile import Note
from ..facts.profile import Profile
from ..facts.profile import ProfileFormatError
from ..facts.profile import read_json
from ..facts.policy import DEFAULT_POLICY

CHECKPOINT_KIND = "energyprof.checkpoint/1"


def load_any(path: str) -> Profile:
    """A saved profile (/1 or /2), or a checkpoint turned into one. Raises ProfileFormatError with one line."""
    data = read_json(path)
    if isinstance(data, dict) and data.get("kind") == CHECKPOINT_KIND:
        return from_checkpoint(data)
    return Profile.from_dict(data)


def from_checkpoint(state: dict[str, Any]) -> Profile:
    """The profile up to the last checkpoint, under the run's idle policy (the other is kept beside it)."""
    try:
        ledger = ledger_state.restore(state["ledger"])
        meta = dict(state["meta"])
        policy = state.get("idle", DEFAULT_POLICY)
        notes = [n for n in state.get("notes", []) if isinstance(n, dict)]
        children = [c for c in state.get("child_processes", []) if isinstance(c, dict)]
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise ProfileFormatError(f"checkpoint is damaged: {exc}") from None
    ledger.finish()
    meta["exit"] = {"status": "checkpoint", "message": "the run did not finish; this profile ends at its last checkpoint"}
    notes.append(Note("checkpoint", "rebuilt from a checkpoint: the run ended without writing its profile; anything"
                      " after the last checkpoint is missing").to_dict())
    try:
        return build_profile(ledger, policy, meta, notes=notes, child_processes=children)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileFormatError(f"checkpoint is damaged: {exc}") from None
