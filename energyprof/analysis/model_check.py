"""What an estimate model file (`energyprof estimate fit`'s JSON) must hold before a prediction reads it.

A model file is a plain JSON file that others hand around and edit: any field may be missing, of the
wrong type, or a number no prediction can use. Each is found here and said in one line naming the
field, so `estimate predict` never stops on a traceback (exit 1) for a damaged file.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

RANGE_KEYS = ("flops", "params", "batch", "power_limit_w")
PLAIN_COLUMNS = ("1", "log_flops", "log_params", "log_batch", "log_power_limit", "conv_share", "matmul_share",
                 "elementwise_share")
# A fit's degrees of freedom are its profiles less its columns: a million profiles is beyond any file.
MAX_DOF = 1_000_000


def _number(v: Any) -> bool:
    """A finite number a float holds (JSON's integers have no bound: 10**400 is not one)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _numbers(v: Any, n: int) -> bool:
    return isinstance(v, list) and len(v) == n and all(_number(x) for x in v)


def _column_ok(col: Any, devices: list[str]) -> bool:
    if not isinstance(col, str):
        return False
    for prefix in ("device=", "log_flops*device="):
        if col.startswith(prefix):
            return col[len(prefix):] in devices
    return col in PLAIN_COLUMNS


def _range_ok(ranges: Any) -> bool:
    return isinstance(ranges, dict) and all(
        key in RANGE_KEYS and isinstance(r, list) and len(r) == 2 and all(_number(x) and x > 0 for x in r)
        and r[0] <= r[1] for key, r in ranges.items())


def model_problem(model: Any) -> str | None:
    """Why `model` cannot be predicted from (one line naming the field), or None."""
    if not isinstance(model, Mapping):
        return "not a JSON object"
    devices = model.get("devices")
    if not isinstance(devices, list) or not devices or not all(isinstance(d, str) for d in devices):
        return "its devices must be a non-empty list of names"
    cols = model.get("columns")
    if not isinstance(cols, list) or not cols or not all(_column_ok(c, devices) for c in cols):
        return (f"its columns must be a list of {', '.join(PLAIN_COLUMNS)}, device=NAME or log_flops*device=NAME"
                " (NAME one of its devices)")
    p = len(cols)
    if not _numbers(model.get("coefficients"), p):
        return f"its coefficients must be {p} finite numbers, one per column"
    inv = model.get("xtx_inverse")
    if not isinstance(inv, list) or len(inv) != p or not all(_numbers(r, p) for r in inv):
        return f"its xtx_inverse must be a {p} x {p} matrix of finite numbers"
    sd = model.get("residual_sd")
    if not _number(sd) or sd < 0:
        return "its residual_sd must be a finite number, 0 or more"
    dof = model.get("dof")
    if not isinstance(dof, int) or isinstance(dof, bool) or not 0 <= dof <= MAX_DOF:
        return f"its dof must be a whole number from 0 to {MAX_DOF:,}"
    conf = model.get("confidence", 0.95)
    if not _number(conf) or not 0 < conf < 1:
        return "its confidence must be a number between 0 and 1"
    if not _range_ok(model.get("range")):
        return f"its range must give each of {', '.join(RANGE_KEYS)} as [low, high], positive numbers"
    families = model.get("families")
    if families is not None and not (isinstance(families, list) and all(
            isinstance(f, list) and len(f) == 3 and all(_number(x) and 0 <= x <= 1 for x in f) for f in families)):
        return "its families must be a list of [conv, matmul, elementwise] shares, each from 0 to 1"
    policy = model.get("idle_policy")
    if policy is not None and not isinstance(policy, str):
        return "its idle_policy must be a name"
    return None
