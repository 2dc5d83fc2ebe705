"""Finish a profile from a checkpoint left by a run that was killed (SIGKILL, crash, OOM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .core.ledger import Ledger
from .core.tree import build_profile
from .profile import Profile, ProfileFormatError, load

CHECKPOINT_KIND = "energyprof.checkpoint/1"


def load_any(path: str, idle: str | None = None) -> tuple[Profile, dict[str, Any]]:
    """A saved profile, or a checkpoint turned into one. Raises ValueError with one line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileFormatError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileFormatError(f"{path} is not valid JSON (truncated or corrupt?): {exc.msg} at line {exc.lineno}") from None
    if isinstance(data, dict) and data.get("kind") == CHECKPOINT_KIND:
        return from_checkpoint(data, idle), {}
    if idle is not None:
        raise ProfileFormatError("--idle applies to checkpoints only; a saved profile keeps its run's policy")
    return load(path), {}


def from_checkpoint(state: dict[str, Any], idle: str | None = None) -> Profile:
    try:
        ledger = Ledger.from_state(state["ledger"])
        meta = dict(state["meta"])
        policy = idle or state.get("idle", "share")
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ProfileFormatError(f"checkpoint is damaged: {exc}") from None
    ledger.finish()
    meta["exit"] = {"status": "checkpoint", "message": "the run did not finish; this profile ends at its last checkpoint"}
    profile = build_profile(ledger, policy, meta)
    profile.notes.extend(state.get("notes", []))
    profile.notes.append({"kind": "checkpoint", "message": "rebuilt from a checkpoint: the run ended without writing its"
                                                            " profile; anything after the last checkpoint is missing"})
    return profile
