"""Forecasts of a training run's energy: during the run, from its first epochs, and before it, from a
model fitted on earlier profiles. Pure: numbers in, numbers out (stdlib only, no numpy).

The two methods of del Rey et al., "Estimating Deep Learning energy consumption based on model
architecture and training environment":

- **During the run** (the study's STEP; carbontracker's forecast): after k of N epochs the run's total
  is what the k epochs spent plus N - k times the energy of a stable epoch. The interval is a t
  prediction interval for the sum of the N - k epochs still to come, from the spread of the epochs
  seen (the first one left out from three epochs on: it carries the warm-up). After one epoch there
  is no spread of epochs yet: the interval comes from the spread of that epoch's steps instead
  (their times: the program sees no energy per step while it runs; at steady power a step's energy
  follows its time), each step taken as an independent draw.
- **Before the run** (the study's PRE): ordinary least squares of log energy per step on log FLOPs per
  step, the device (an indicator per device beyond the first) and its interaction with log FLOPs,
  log parameters, log batch size and log power limit, each kept only where the profiles make it
  estimable (not constant, not a combination of the columns already in). The study found FLOPs (or
  a GPU's TDP) alone give large errors: the device and how it meets the model's size matter. The
  prediction interval is the standard one for a new observation, exp'd back to joules.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Mapping, Sequence

from .stats import t_quantile

CONFIDENCE = 0.95
RANGE_FACTOR = 2.0  # a configuration beyond [min / 2, max x 2] of the profiles' values is refused
# After one epoch, each epoch's total is taken to vary by at least this share of itself: one epoch cannot show
# what varies between epochs. Identical 0.2 s epochs measured 0.4-3% apart on a busy 2-core machine while
# the spread of their steps, taken as independent, predicted 0.1-0.3%.
EPOCH_CV_FLOOR = 0.02
COLLINEAR = 0.05  # a column whose part not explained by the columns already in is below 5% of its spread
SCHEMA = "energyprof.estimate/1"


# ---------------------------------------------------------------- during the run (STEP)


def project_total(done: Sequence[float], epochs: int, steps: Sequence[float] = (),
                  confidence: float = CONFIDENCE, unseen: float = 0.0) -> dict[str, Any]:
    """The total over `epochs` epochs, from the per-epoch values `done` of the first k.

    Returns {"value", "low", "high", "basis", "epochs_used", "df"}: `basis` is "epochs" (the spread
    of the stable epochs), "steps" (one epoch: the spread of `steps`, that epoch's per-step values,
    scaled to the epoch's total), "complete" (nothing left to forecast) or None (no spread to
    measure: low and high are None). The low end never falls below what the k epochs spent. After one
    epoch the per-epoch spread is at least EPOCH_CV_FLOOR.
    `unseen`: with one epoch, the share of it that its steps' spread cannot speak for: the part outside
    its steps (the pass's start, its final empty fetch), seen once, and the sensors' resolution (one
    reading period over the epoch's time). The interval takes it whole, as a bound, beside the steps'
    spread: identical epochs of 0.2 s measured 0.1-0.2% apart, a first one 1.7% (a replayed flat power).
    """
    k = len(done)
    if k == 0:
        raise ValueError("a forecast needs at least one finished epoch")
    spent = math.fsum(done)
    left = max(int(epochs) - k, 0)
    if left == 0:
        return {"value": spent, "low": spent, "high": spent, "basis": "complete", "epochs_used": k, "df": None}
    stable = list(done[1:]) if k >= 3 else list(done)  # the first epoch warms up caches, allocators, autotuners
    n = len(stable)
    mean = statistics.fmean(stable)
    value = spent + left * mean
    half: float | None = None
    basis: str | None = None
    df: int | None = None
    if n >= 2:
        s = statistics.stdev(stable)
        df = n - 1
        # a new sum of `left` epochs: `left` draws of the spread, plus `left` times the mean's own error
        half = t_quantile(0.5 + confidence / 2.0, df) * s * math.sqrt(left + left * left / n)
        basis = "epochs"
        trend = _trend(stable, k - n, k, left, confidence)
        if trend is not None:
            t_value, t_low, t_high, known = trend
            low, high = spent + t_low, spent + t_high
            if known:  # a slope told apart from none: the epochs to come follow the trend
                value, df, basis = spent + t_value, n - 2, "trend"
            else:  # a trend the epochs cannot rule out yet: the interval holds it and the mean's
                low, high = min(low, value - half), max(high, value + half)
            return {"value": value, "low": max(low, spent), "high": high, "basis": basis, "epochs_used": n, "df": df}
    elif len(steps) >= 2:
        q = len(steps)
        m = statistics.fmean(steps)
        if m > 0:
            # an epoch of q independent steps varies by cv / sqrt(q) of itself (EPOCH_CV_FLOOR at least); the
            # left epochs to come are left such draws, and the one epoch seen is one more (the mean's error)
            per_epoch = max(statistics.stdev(steps) / m / math.sqrt(q), EPOCH_CV_FLOOR)
            df = q - 1
            rel = per_epoch * math.sqrt(1.0 / left + 1.0)
            half = t_quantile(0.5 + confidence / 2.0, df) * rel * left * mean + left * mean * min(max(unseen, 0.0), 1.0)
            basis = "steps"
    if half is None:
        return {"value": value, "low": None, "high": None, "basis": None, "epochs_used": n, "df": None}
    return {"value": value, "low": max(value - half, spent), "high": value + half, "basis": basis,
            "epochs_used": n, "df": df}


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float, float, float]:
    """Least squares y = a + b x: (a, b, s the spread about it on n - 2 degrees of freedom, Sxx, mean x)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    b = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    rss = math.fsum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    return a, b, math.sqrt(rss / (len(xs) - 2)), sxx, mx


def _trend(stable: Sequence[float], first: int, k: int, left: int,
           confidence: float) -> tuple[float, float, float, bool] | None:
    """The epochs to come if the stable epochs (`stable`, epochs first..k-1) follow a trend: (the sum of
    the `left` epochs to come, its low and high ends, whether a trend is known: a slope whose own interval
    leaves out 0). None with fewer than 3 epochs (no spread about a line to measure).

    Two shapes, each fitted by least squares: a straight line (epochs that grow by a fixed amount) and a
    straight line in log (by a fixed share). The value is the shape that leaves the smaller relative spread
    about it; the interval holds both. The line's sum of the epochs to come is c.beta, c = (left, sum of
    their indices), with variance s^2 (left + c'(X'X)^-1 c) on n - 2 degrees of freedom; the log line's
    sum takes the same half-width (the line's spread holds what growth by a share bends away from it)."""
    n = len(stable)
    if n < 3:
        return None
    xs = [float(first + i) for i in range(n)]
    t = t_quantile(0.5 + confidence / 2.0, n - 2)
    future = [float(x) for x in range(k, k + left)]
    a, b, s, sxx, mx = _line(xs, stable)
    total = math.fsum(a + b * x for x in future)
    half = t * s * math.sqrt(left + left * left / n + math.fsum(x - mx for x in future) ** 2 / sxx)
    known = abs(b) > t * s / math.sqrt(sxx)
    value, low, high = total, total - half, total + half
    spread = s / abs(statistics.fmean(stable)) if statistics.fmean(stable) else math.inf
    if min(stable) > 0:
        la, lb, ls, _, _ = _line(xs, [math.log(y) for y in stable])
        try:
            log_total = math.fsum(math.exp(la + lb * x) for x in future)
        except OverflowError:
            return value, low, math.inf, True
        # about the log line's sum, the straight line's half-width: exp'd, the log line's own interval on one
        # or two degrees of freedom reaches hundreds of times the epochs seen, which no training run does
        low, high = min(low, log_total - half), max(high, log_total + half)
        known = known or abs(lb) > t * ls / math.sqrt(sxx)
        if ls < spread:  # a share per epoch fits better than an amount
            value = log_total
    return value, low, high, known


def forecast_facts(energies: Sequence[float] | None, times: Sequence[float], epochs: int,
                   step_times: Sequence[float] = (), intensity_g_per_kwh: float | None = None, pue: float = 1.0,
                   estimated: bool = False, confidence: float = CONFIDENCE,
                   sensor_period_s: float = 0.0, others_share: float = 0.0) -> dict[str, float]:
    """One forecast as numbers (a window's facts carry nothing else): after len(times) epochs of
    `epochs`, the total energy (J, the program's), time (s) and carbon (g), each with its interval.

    With one epoch the energy's interval takes the relative spread of the steps' times, and what they
    cannot see (`project_total`'s `unseen`: the epoch outside its steps, `sensor_period_s` over its time).
    `others_share`: the share of the machine's CPU other processes used during that epoch. Whether they stay,
    go or grow, one epoch cannot tell, and the pace of the epochs to come moves with them (the time after one
    epoch missed by 20% under a changing load, against a 5% half-width): both intervals take it whole."""
    k = len(times)
    out: dict[str, float] = {"epochs_done": float(k), "epochs": float(epochs), "confidence": confidence}
    outside = resolution = 0.0
    load = min(max(others_share, 0.0), 1.0) if k == 1 else 0.0
    if k == 1 and step_times and times[0] > 0:
        outside = max(1.0 - math.fsum(step_times) / times[0], 0.0)
        resolution = max(sensor_period_s, 0.0) / times[0]  # the energy's, not the clock's
    t = project_total(times, epochs, step_times, confidence, outside + load)
    unseen = outside + resolution + load
    _put(out, "time", "s", t)
    if energies is not None and len(energies) == k:
        e = project_total(energies, epochs, step_times, confidence, unseen)
        _put(out, "energy", "j", e)
        out["by_steps"] = 1.0 if e["basis"] == "steps" else 0.0
        out["estimated"] = 1.0 if estimated else 0.0
        if intensity_g_per_kwh is not None:
            g_per_j = intensity_g_per_kwh * pue / 3.6e6
            for key in ("", "_low", "_high"):
                if f"energy{key}_j" in out:
                    out[f"carbon{key}_g"] = out[f"energy{key}_j"] * g_per_j
    return out


def _put(out: dict[str, float], name: str, unit: str, p: Mapping[str, Any]) -> None:
    out[f"{name}_{unit}"] = float(p["value"])
    if p["low"] is not None:
        out[f"{name}_low_{unit}"] = float(p["low"])
        out[f"{name}_high_{unit}"] = float(p["high"])


def forecast_outcome(forecasts: Iterable[Mapping[str, Any]], passes: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """Prediction against outcome for one loop: each forecast beside the N passes' measured total.

    `forecasts`: the loop's forecasts (records or mappings, with epochs_done, epochs, energy_j, ...);
    `passes`: the loop's passes, each {"energy_j", "time_s"} (the program's energy in the pass's window).
    The outcome is None until the run finished the N passes it forecast."""
    rows = sorted((dict(_as_mapping(f)) for f in forecasts), key=lambda r: r["epochs_done"])
    if not rows:
        return {"rows": [], "outcome": None}
    n = int(rows[-1]["epochs"])
    outcome = None
    if len(passes) >= n:
        outcome = {"epochs": n, "energy_j": math.fsum(p["energy_j"] for p in passes[:n]),
                   "time_s": math.fsum(p["time_s"] for p in passes[:n])}
    for r in rows:
        for name, unit in (("energy", "j"), ("time", "s")):
            v, lo, hi = r.get(f"{name}_{unit}"), r.get(f"{name}_low_{unit}"), r.get(f"{name}_high_{unit}")
            actual = outcome[f"{name}_{unit}"] if outcome and int(r["epochs"]) == n else None
            r[f"{name}_error"] = (v - actual) / actual if actual and v is not None else None
            r[f"{name}_inside"] = (lo <= actual <= hi) if actual is not None and lo is not None else None
            r[f"{name}_width"] = (hi - lo) / v if lo is not None and v else None
    return {"rows": rows, "outcome": outcome, "passes": len(passes), "epochs": n}


def _as_mapping(f: Any) -> Mapping[str, Any]:
    return f.to_dict() if hasattr(f, "to_dict") else f


# ---------------------------------------------------------------- before the run (PRE)


SHARES = ("conv_share", "matmul_share", "elementwise_share")  # of a step's FLOPs, counted once (FlopCounterMode)
# A configuration whose FLOPs split among the families (shares above) more than this away from every profile's
# (in the largest of the three) is of another model family than the fit: an MLP's energy per FLOP says little
# of a CNN's (median errors 5.9% within MLPs, 16.2% within CNNs, 26.6% across both with FLOPs alone).
FAMILY_DISTANCE = 0.25


def config_of(obs: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs of a configuration: flops, params, batch (numbers; params and batch may be None),
    device (a name), power_limit_w (None: not known) and the FLOPs' shares per family (None: not counted)."""
    return {k: obs.get(k) for k in ("flops", "params", "batch", "device", "power_limit_w", *SHARES)}


def _candidates(obs: Sequence[Mapping[str, Any]], devices: list[str]) -> list[str]:
    """The columns in the order they are offered to the fit: the intercept, FLOPs, the device and its
    interaction with FLOPs, then the model's and the batch's size and the power limit."""
    cols = ["1", "log_flops"]
    cols += [f"device={d}" for d in devices[1:]]
    cols += [f"log_flops*device={d}" for d in devices[1:]]
    for name, key in (("log_params", "params"), ("log_batch", "batch"), ("log_power_limit", "power_limit_w")):
        if all(o.get(key) for o in obs):
            cols.append(name)
    cols += [key for key in SHARES if all(o.get(key) is not None for o in obs)]  # the model's family
    return cols


def _value(col: str, c: Mapping[str, Any]) -> float:
    if col == "1":
        return 1.0
    if col == "log_flops":
        return math.log(c["flops"])
    if col == "log_params":
        return math.log(c["params"])
    if col == "log_batch":
        return math.log(c["batch"])
    if col == "log_power_limit":
        return math.log(c["power_limit_w"])
    if col in SHARES:
        return float(c[col])
    if col.startswith("device="):
        return 1.0 if c["device"] == col[len("device="):] else 0.0
    if col.startswith("log_flops*device="):
        return math.log(c["flops"]) if c["device"] == col[len("log_flops*device="):] else 0.0
    raise ValueError(f"unknown column {col!r}")


def _select(rows: list[dict[str, Any]], cols: list[str], max_cols: int) -> list[str]:
    """Greedy: keep a column when what the kept columns leave of it (Gram-Schmidt) is at least COLLINEAR
    of its own spread about its mean (the intercept: of its norm), up to `max_cols` columns."""
    kept: list[str] = []
    basis: list[list[float]] = []  # orthonormal, over the rows
    for col in cols:
        if len(kept) >= max_cols:
            break
        x = [_value(col, r) for r in rows]
        scale = math.sqrt(math.fsum((v - statistics.fmean(x)) ** 2 for v in x)) if col != "1" else math.sqrt(len(x))
        if scale <= 1e-12:
            continue
        resid = list(x)
        for q in basis:
            d = math.fsum(a * b for a, b in zip(resid, q))
            resid = [a - d * b for a, b in zip(resid, q)]
        norm = math.sqrt(math.fsum(v * v for v in resid))
        if norm < COLLINEAR * scale:
            continue
        kept.append(col)
        basis.append([v / norm for v in resid])
    return kept


def _invert(a: list[list[float]]) -> list[list[float]]:
    """Gauss-Jordan with partial pivoting (a is small and, after `_select`, well conditioned)."""
    n = len(a)
    m = [list(row) + [1.0 if i == j else 0.0 for j in range(n)] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-300:
            raise ValueError("singular design: the profiles cannot separate these features")
        m[c], m[p] = m[p], m[c]
        piv = m[c][c]
        m[c] = [v / piv for v in m[c]]
        for r in range(n):
            if r != c and m[r][c] != 0.0:
                f = m[r][c]
                m[r] = [a - f * b for a, b in zip(m[r], m[c])]
    return [row[n:] for row in m]


def _max_columns(n: int) -> int:
    """Room for the residual spread: two degrees of freedom where the profiles allow (t with one is 12.7)."""
    return max(n - 2, min(2, n - 1))


def fit(observations: Sequence[Mapping[str, Any]], confidence: float = CONFIDENCE,
        columns: Sequence[str] | None = None, with_loo: bool = True) -> dict[str, Any]:
    """OLS of log(energy per step) on the estimable columns; the model as a plain JSON-able dict.

    Each observation: name, flops, params, batch, device, power_limit_w, energy_per_step_j,
    steps_per_epoch. `columns`: offer only these (in this order) instead of the default candidates.
    """
    obs = [o for o in observations if o.get("flops") and o.get("energy_per_step_j")]
    if len(obs) < 3:
        raise ValueError(f"a fit needs at least 3 profiles with FLOPs and energy per step, not {len(obs)}")
    counts: dict[str, int] = {}
    for o in obs:
        counts[str(o["device"])] = counts.get(str(o["device"]), 0) + 1
    devices = sorted(counts, key=lambda d: (-counts[d], d))  # the most profiled device is the baseline
    cands = list(columns) if columns is not None else _candidates(obs, devices)
    cols = _select(list(obs), cands, _max_columns(len(obs)))
    x = [[_value(c, o) for c in cols] for o in obs]
    y = [math.log(o["energy_per_step_j"]) for o in obs]
    n, p = len(obs), len(cols)
    xtx = [[math.fsum(r[i] * r[j] for r in x) for j in range(p)] for i in range(p)]
    inv = _invert(xtx)
    xty = [math.fsum(r[i] * v for r, v in zip(x, y)) for i in range(p)]
    coef = [math.fsum(inv[i][j] * xty[j] for j in range(p)) for i in range(p)]
    fitted = [math.fsum(c * v for c, v in zip(coef, r)) for r in x]
    rss = math.fsum((a - b) ** 2 for a, b in zip(y, fitted))
    dof = n - p
    tss = math.fsum((v - statistics.fmean(y)) ** 2 for v in y)
    ranges: dict[str, list[float]] = {}
    for key in ("flops", "params", "batch", "power_limit_w"):
        vals = [float(o[key]) for o in obs if o.get(key)]
        if len(vals) == n:
            ranges[key] = [min(vals), max(vals)]
    model: dict[str, Any] = {
        "schema": SCHEMA,
        "response": "log(energy per step in J): the program's energy in the tracked loop's step windows",
        "columns": cols,
        "offered": cands,
        "coefficients": coef,
        "xtx_inverse": inv,
        "residual_sd": math.sqrt(rss / dof) if dof > 0 else 0.0,
        "dof": dof,
        "r2": 1.0 - rss / tss if tss > 0 else None,
        "confidence": confidence,
        "devices": devices,
        "range": ranges,
        "profiles": [{k: o.get(k) for k in ("name", "flops", "params", "batch", "device", "power_limit_w",
                                             "energy_per_step_j", "steps_per_epoch", *SHARES)} for o in obs],
    }
    if all(o.get(k) is not None for o in obs for k in SHARES):  # the families the fit has seen
        model["families"] = [[float(o[k]) for k in SHARES] for o in obs]
    if with_loo:
        model["loo"] = leave_one_out(obs, confidence, columns)
    return model


def predict(model: Mapping[str, Any], config: Mapping[str, Any], steps_per_epoch: float | None = None,
            epochs: float | None = None) -> dict[str, Any]:
    """Energy per step (J) with its prediction interval, and per epoch and per run where the counts are
    given. The point is exp of the fitted log: the median energy of that configuration."""
    cols = model["columns"]
    for c in cols:
        if c in ("log_params", "log_batch", "log_power_limit"):
            key = {"log_params": "params", "log_batch": "batch", "log_power_limit": "power_limit_w"}[c]
            if not config.get(key):
                raise ValueError(f"the model uses {key}: give it")
        if c in SHARES and config.get(c) is None:
            raise ValueError(f"the model uses {c} (the share of a step's FLOPs in that family): give it, or --from a profile")
    x0 = [_value(c, config) for c in cols]
    mu = math.fsum(a * b for a, b in zip(model["coefficients"], x0))
    inv = model["xtx_inverse"]
    lever = math.fsum(x0[i] * inv[i][j] * x0[j] for i in range(len(cols)) for j in range(len(cols)))
    if not 1.0 + lever >= 0.0:  # an inverse of X'X has none: a matrix edited by hand
        raise ValueError("a damaged model: its xtx_inverse gives this configuration a negative variance")
    dof = int(model["dof"])
    conf = float(model.get("confidence", CONFIDENCE))
    half = (t_quantile(0.5 + conf / 2.0, dof) * float(model["residual_sd"]) * math.sqrt(1.0 + lever)) if dof > 0 else 0.0
    try:
        per_step = {"value": math.exp(mu), "low": math.exp(mu - half), "high": math.exp(mu + half)}
    except OverflowError:
        raise ValueError(f"the prediction is beyond what a number holds (log energy per step {mu:.4g} ± {half:.4g}):"
                         " a damaged model, or a configuration far from its profiles") from None
    out: dict[str, Any] = {"per_step_j": per_step, "confidence": conf}
    if steps_per_epoch:
        out["per_epoch_j"] = {k: v * steps_per_epoch for k, v in per_step.items()}
        if epochs:
            out["per_run_j"] = {k: v * steps_per_epoch * epochs for k, v in per_step.items()}
    return out


def outside_range(model: Mapping[str, Any], config: Mapping[str, Any], factor: float = RANGE_FACTOR) -> str | None:
    """Why the configuration is too far from the profiles to predict (one line), or None."""
    device = config.get("device")
    if device is not None and device not in model["devices"]:
        return (f"device {device!r} is not among the profiles' devices ({', '.join(model['devices'])}):"
                " profile it first")
    names = {"flops": "FLOPs per step", "params": "parameters", "batch": "batch size", "power_limit_w": "power limit (W)"}
    for key, (lo, hi) in model["range"].items():
        v = config.get(key)
        if v is None:
            continue
        if v > hi * factor or v < lo / factor:
            return (f"{names[key]} {v:.4g} is far outside the profiles' range {lo:.4g}..{hi:.4g}"
                    f" (more than {factor:g}x beyond it): the fit would extrapolate")
    return _other_family(model, config)


def _other_family(model: Mapping[str, Any], config: Mapping[str, Any]) -> str | None:
    """Why the configuration's FLOPs split among the families unlike every profile's (one line), or None
    (no shares given, or a model fitted without them)."""
    families = model.get("families")
    mine = [config.get(k) for k in SHARES]
    if not families or any(v is None for v in mine):
        return None
    nearest = min(families, key=lambda f: max(abs(a - b) for a, b in zip(f, mine)))
    if max(abs(a - b) for a, b in zip(nearest, mine)) <= FAMILY_DISTANCE:
        return None
    def split(f: Sequence[float]) -> str:
        return f"{f[0]:.0%} convolutions, {f[1]:.0%} matrix products, {f[2]:.0%} elementwise"
    return (f"a model family outside the fit: its FLOPs are {split(mine)}; the nearest profile's {split(nearest)}"
            " (energy per FLOP differs between families)")


def leave_one_out(observations: Sequence[Mapping[str, Any]], confidence: float = CONFIDENCE,
                  columns: Sequence[str] | None = None) -> dict[str, Any]:
    """Each profile predicted by a fit on the others (columns chosen again each time): its relative error
    and whether its interval held it. Too few profiles (under 4) or a device seen once: left out."""
    rows = []
    obs = list(observations)
    for i, o in enumerate(obs):
        rest = obs[:i] + obs[i + 1:]
        if len(rest) < 3 or not any(r["device"] == o["device"] for r in rest):
            continue
        try:
            m = fit(rest, confidence, columns, with_loo=False)
        except ValueError:
            continue
        p = predict(m, config_of(o))["per_step_j"]
        actual = float(o["energy_per_step_j"])
        rows.append({"name": o.get("name"), "measured_j": actual, "predicted_j": p["value"], "low_j": p["low"],
                     "high_j": p["high"], "error": (p["value"] - actual) / actual,
                     "inside": p["low"] <= actual <= p["high"]})
    errors = [abs(r["error"]) for r in rows]
    return {"rows": rows, "n": len(rows),
            "median_abs_error": statistics.median(errors) if errors else None,
            "max_abs_error": max(errors) if errors else None,
            "coverage": sum(r["inside"] for r in rows) / len(rows) if rows else None}


# ---------------------------------------------------------------- in the report


def forecast_views(profile: Any) -> dict[str, dict[str, Any]]:
    """Per tracked loop that forecast its total: each forecast beside the outcome (`forecast_outcome`), the
    passes' energy being the program's under the run's idle policy, the one the forecasts were made under."""
    from .training import window_program_j

    by_loop: dict[str, list[Any]] = {}
    for f in profile.forecasts:
        by_loop.setdefault(f.loop, []).append(f)
    out: dict[str, dict[str, Any]] = {}
    for loop, found in by_loop.items():
        windows = sorted((w for w in profile.windows if w.name == f"{loop}.pass"), key=lambda w: w.start_s)
        passes = [{"energy_j": window_program_j(w), "time_s": w.time_s} for w in windows]
        out[loop] = forecast_outcome(found, passes)
    return out


# ---------------------------------------------------------------- a saved profile as one observation


def observation(profile: Any, loop: str = "step", name: str = "") -> dict[str, Any] | None:
    """What a profile of a tracked loop says for the fit: FLOPs per step (its first step, counted by torch's
    FlopCounterMode under `track(model=...)`), parameters, batch size, device and its power limit, energy
    per step (the program's energy in the loop's step windows, the counted step left out), steps per pass
    and the measured energy per pass (the counted step taken as the mean of the others). None when the loop
    is not in the profile."""
    from .training import breakdown

    computes = [w for w in profile.windows if w.name == f"{loop}.compute"]
    if not computes:
        return None
    b = breakdown(profile, loop)
    counted = next((w.loop for w in sorted(computes, key=lambda w: w.start_s) if "flops" in w.loop), {})
    samples = [r["samples"] for r in b["steps"] if r.get("samples")]
    passes = len(b["end_of_data_waits"]) or b["epoch_count"] or 1
    steps = b["step_count"]
    device, limit = _device(profile.known_meta.settings, profile.meta.get("host"), int(counted.get("cuda_device", -1)))
    # the step the FLOP counter ran in is slower (Python saw each operator): not a training step's energy
    counted_step = next((int(w.index) for w in computes if "flops" in w.loop and w.index is not None), None)
    per_step = _program_step_energy(profile, loop)
    typical = [j for i, j in per_step.items() if i != counted_step] or list(per_step.values())
    shares = {key: counted.get(f"flop_share_{key.removesuffix('_share')}") for key in SHARES}
    return {"name": name, "flops": counted.get("flops"), "params": b.get("parameters"), **shares,
            "batch": statistics.median(samples) if samples else None, "device": device, "power_limit_w": limit,
            "energy_per_step_j": statistics.fmean(typical) if typical else None,
            "steps_per_epoch": steps / passes if steps else None, "epochs": passes,
            # the counted step as the others: what an epoch costs without energyprof's counter
            "energy_per_epoch_j": math.fsum(typical) * len(per_step) / len(typical) / passes if typical else None}


def _program_step_energy(profile: Any, loop: str) -> dict[int, float]:
    """Per step (index): the program's energy in its fetch and compute windows, under the run's idle policy
    (the machine's where a window predates the program's figure). The program's, not the machine's: on a
    shared machine, the part of the joules its own CPU time and devices account for."""
    from .training import window_program_j

    out: dict[int, float] = {}
    for w in profile.windows:
        if w.index is None or w.name not in (f"{loop}.fetch", f"{loop}.compute"):
            continue
        out[int(w.index)] = out.get(int(w.index), 0.0) + window_program_j(w)
    computed = {int(w.index) for w in profile.windows if w.name == f"{loop}.compute" and w.index is not None}
    return {i: j for i, j in out.items() if i in computed}


def counted_loops(profile: Any) -> list[str]:
    """The tracked loops of a profile whose first step's FLOPs were counted (`track(loader, model=...)`)."""
    return sorted({w.name[: -len(".compute")] for w in profile.windows if w.name.endswith(".compute") and "flops" in w.loop})


def _device(settings: Mapping[str, Any] | None, host: Mapping[str, Any] | None, cuda: int) -> tuple[str, float | None]:
    """The device a model trained on, by name ("gpu: NAME" or "cpu: MODEL"), and its power limit (W) where
    the run's settings read one (the GPU's enforced limit; the CPU package's long-term RAPL limit)."""
    settings = settings or {}
    if cuda >= 0:
        gpus = settings.get("gpus") or []
        g = next((x for x in gpus if x.get("index") == cuda), gpus[0] if len(gpus) == 1 else {})
        return f"gpu: {g.get('name') or f'cuda:{cuda}'}", g.get("power_limit_w")
    cpu = (host or {}).get("cpu_model") or "unknown"
    limit = None
    for zone, limits in sorted((settings.get("rapl") or {}).items()):
        if "package" in zone and isinstance(limits, dict):
            long_term = limits.get("long_term") or limits.get("constraint_0") or {}
            limit = long_term.get("limit_w") if isinstance(long_term, dict) else None
            break
    return f"cpu: {cpu}", limit
