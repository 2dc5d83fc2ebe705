"""`energyprof estimate`: a training run's energy before it runs, from a model fitted on saved profiles.

    energyprof estimate fit PROFILE.json... -o MODEL.json     fit, print its quality (leave-one-out)
    energyprof estimate predict MODEL.json --flops F [--params P] [--batch B] [--device NAME]
                        [--power-limit W] [--steps-per-epoch S] [--epochs N] [--json]
    energyprof estimate predict MODEL.json --from PROFILE.json   a profiled configuration, beside its outcome

The profiles are runs whose loop was tracked with `energyprof.torch.track(loader, model=model)` (the
first step's FLOPs counted by torch's FlopCounterMode). The model is ordinary least squares of log
energy per step (analysis/forecast.py), a small JSON file others can reuse. A configuration far outside
the profiles' range (more than 2x beyond it in FLOPs, parameters, batch size or power limit, or on a
device no profile ran on) is refused in one line, exit 2, unless --extrapolate.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from ..facts.policy import IDLE_POLICIES
from .common import PROG, Parser, UsageError


def build_estimate_parser() -> Parser:
    p = Parser(prog=f"{PROG} estimate", description="Estimate a training run's energy before it runs: fit energy per"
               " step on saved profiles (FLOPs per step, parameters, batch size, device and its interaction with the"
               " model's size), then predict a new configuration's energy per step, epoch and run with a prediction"
               " interval. See docs/experiments.md.")
    sub = p.add_subparsers(dest="action", required=True, parser_class=Parser)
    f = sub.add_parser("fit", help="fit a model on saved profiles and print its quality on held-out profiles")
    f.add_argument("profiles", nargs="+", metavar="PROFILE.json")
    f.add_argument("-o", "--output", required=True, metavar="MODEL.json", help="where to write the fitted model")
    f.add_argument("--loop", action="append", metavar="NAME",
                   help="only the tracked loop of this name (track(name=...)); repeatable. Default: every loop"
                        " whose FLOPs were counted, each an observation")
    f.add_argument("--idle", choices=IDLE_POLICIES,
                   help="the idle policy the energy per step is taken under (default: the profiles' own, when they agree)")
    f.add_argument("--columns", help="offer only these columns, comma-separated, in order (e.g. 1,log_flops):"
                   " the default offers 1, log_flops, device=*, log_flops*device=*, log_params, log_batch, log_power_limit")
    pr = sub.add_parser("predict", help="predict a configuration's energy per step, epoch and run")
    pr.add_argument("model", metavar="MODEL.json")
    pr.add_argument("--from", dest="source", metavar="PROFILE.json",
                    help="take the configuration from a saved profile, and show what it measured beside the prediction")
    pr.add_argument("--loop", help="with --from: the tracked loop's name (default: its only loop with FLOPs)")
    pr.add_argument("--flops", type=float, help="FLOPs per training step (forward and backward, FlopCounterMode)")
    pr.add_argument("--params", type=float, help="the model's parameters")
    pr.add_argument("--batch", type=float, help="samples per step")
    pr.add_argument("--device", help="the device, as the model names it (default: the model's only device)")
    pr.add_argument("--power-limit", type=float, metavar="W", help="the device's power limit")
    for fam, what in (("conv", "convolutions"), ("matmul", "matrix products"), ("elementwise", "elementwise operators")):
        pr.add_argument(f"--{fam}-share", type=float, metavar="S", help=f"the share of a step's FLOPs in {what}"
                        " (0 to 1, as a tracked loop's first step counts them): a model family unlike the profiles'"
                        " is refused, and a model fitted with this column needs it")
    pr.add_argument("--steps-per-epoch", type=float, metavar="S", help="steps per epoch: energy per epoch")
    pr.add_argument("--epochs", type=float, metavar="N", help="epochs: energy per run (needs --steps-per-epoch)")
    pr.add_argument("--extrapolate", action="store_true", help="predict even far outside the profiles' range (flagged)")
    pr.add_argument("--json", action="store_true", help="print the prediction as JSON")
    return p


def estimate_cmd(argv: list[str]) -> int:
    ns = build_estimate_parser().parse_args(argv)
    return _fit(ns) if ns.action == "fit" else _predict(ns)


# ---------------------------------------------------------------- fit


def _observations(paths: list[str], loops: list[str] | None, idle: str | None = None) -> list[dict[str, Any]]:
    """One observation per tracked loop of each profile: the loops named, else every loop with FLOPs; the
    program's energy under `idle` (None: each profile's own policy, which must agree)."""
    from ..analysis.forecast import counted_loops, observation
    from ..facts.profile import ProfileFormatError, load

    out = []
    policies = set()
    for path in paths:
        try:
            profile = load(path)
            if idle is not None:
                profile = profile.with_policy(idle)
        except ProfileFormatError as exc:
            raise UsageError(f"{path}: {exc}") from None
        policies.add(profile.idle_policy)
        if len(policies) > 1:
            raise UsageError(f"{path}: the profiles were run under different idle policies ({', '.join(sorted(policies))}):"
                             " choose one with --idle")
        names = loops or counted_loops(profile)
        if not names:
            raise UsageError(f"{path}: no tracked loop has FLOPs: track it with energyprof.torch.track(loader,"
                             " model=model) under a profile")
        for loop in names:
            obs = observation(profile, loop, name=path if len(names) == 1 and not loops else f"{path}:{loop}")
            if obs is not None:
                obs["idle_policy"] = profile.idle_policy
            if obs is None:
                raise UsageError(f"{path}: no loop tracked as {loop!r} (energyprof.torch.track(loader, name={loop!r}))")
            if not obs["flops"]:
                raise UsageError(f"{path}: the loop {loop!r} has no FLOPs: track it with"
                                 " energyprof.torch.track(loader, model=model) under a profile")
            if not obs["energy_per_step_j"]:
                raise UsageError(f"{path}: the loop {loop!r} has no energy per step")
            out.append(obs)
    return out


def _fit(ns: Any) -> int:
    from ..analysis import forecast as F
    from ..store.files import write_text

    obs = _observations(ns.profiles, ns.loop, ns.idle)
    if len(obs) < 3:
        raise UsageError(f"a fit needs at least 3 tracked loops with FLOPs, not {len(obs)}")
    columns = [c.strip() for c in ns.columns.split(",") if c.strip()] if ns.columns else None
    try:
        model = F.fit(obs, columns=columns)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    model["idle_policy"] = obs[0]["idle_policy"]
    write_text(ns.output, json.dumps(model, indent=1, allow_nan=False) + "\n")
    print(f"fitted log(energy per step) on {len(obs)} tracked loops: columns {', '.join(model['columns'])}"
          f" (offered: {', '.join(model['offered'])})")
    r2 = f"{model['r2']:.3f}" if model["r2"] is not None else "-"
    print(f"  R^2 {r2}, residual sd {model['residual_sd']:.3g} in log J ({model['dof']} degrees of freedom);"
          f" devices: {'; '.join(model['devices'])}")
    _print_loo("  held out one at a time", model["loo"], rows=True)
    # the study's point, checked on these profiles: one size feature alone against the chosen columns
    for label, cols in (("log FLOPs alone", ["1", "log_flops"]), ("log parameters alone", ["1", "log_params"])):
        if cols != model["columns"] and all(c in model["offered"] or c == "1" for c in cols):
            _print_loo(f"  {label}", F.leave_one_out(obs, columns=cols), rows=False)
    print(f"{PROG}: wrote {ns.output}")
    return 0


def _print_loo(label: str, loo: dict[str, Any], rows: bool) -> None:
    if not loo["n"]:
        print(f"{label}: too few profiles to hold one out (4 or more, each device twice)")
        return
    print(f"{label}: median |error| {loo['median_abs_error'] * 100:.1f}%, max {loo['max_abs_error'] * 100:.1f}%,"
          f" {loo['coverage'] * 100:.0f}% inside their 95% interval ({loo['n']} held out)")
    if rows:
        for r in loo["rows"]:
            print(f"    {r['name']}: measured {_j(r['measured_j'])}/step, predicted {_j(r['predicted_j'])}"
                  f" [{_j(r['low_j'])}, {_j(r['high_j'])}] ({r['error'] * 100:+.1f}%)")


def _j(x: float) -> str:
    from ..render.format import fmt_energy

    return fmt_energy(x)


# ---------------------------------------------------------------- predict


def _load_model(path: str) -> dict[str, Any]:
    from ..analysis.forecast import SCHEMA
    from ..analysis.model_check import model_problem
    from ..facts.profile import ProfileFormatError, read_json

    try:
        model = read_json(path)
    except ProfileFormatError as exc:
        raise UsageError(str(exc)) from None
    if not isinstance(model, dict) or model.get("schema") != SCHEMA:
        raise UsageError(f"{path} is not a model written by `{PROG} estimate fit` ({SCHEMA})")
    why = model_problem(model)
    if why:
        raise UsageError(f"{path}: a damaged model: {why}")
    return model




def _positive(flag: str, v: float | None) -> None:
    if v is not None and not (math.isfinite(v) and v > 0):
        raise UsageError(f"{flag} must be a positive number, not {v!r}")


def _predict(ns: Any) -> int:
    from ..analysis import forecast as F

    _positive("--steps-per-epoch", ns.steps_per_epoch)
    _positive("--epochs", ns.epochs)
    model = _load_model(ns.model)
    measured: dict[str, Any] | None = None
    if ns.source:
        policy = model.get("idle_policy")
        found = _observations([ns.source], [ns.loop] if ns.loop else None, policy if policy in IDLE_POLICIES else None)
        if len(found) != 1:
            raise UsageError(f"{ns.source} has {len(found)} loops with FLOPs: choose one with --loop")
        measured = found[0]
        config = F.config_of(measured)
        steps, epochs = ns.steps_per_epoch or measured["steps_per_epoch"], ns.epochs or measured["epochs"]
    else:
        if ns.flops is None:
            raise UsageError("give --flops (FLOPs per step), or --from PROFILE.json")
        if ns.power_limit is not None and "log_power_limit" not in model["columns"]:
            raise UsageError(f"{ns.model} has no power-limit column (its profiles did not tell power limits apart):"
                             " --power-limit would change nothing; leave it out, or fit on profiles run at several limits")
        config = {"flops": ns.flops, "params": ns.params, "batch": ns.batch, "device": ns.device,
                  "power_limit_w": ns.power_limit, "conv_share": ns.conv_share, "matmul_share": ns.matmul_share,
                  "elementwise_share": ns.elementwise_share}
        for key in F.SHARES:
            v = config[key]
            if v is not None and not 0.0 <= v <= 1.0:
                raise UsageError(f"--{key.replace('_', '-')} must be a share from 0 to 1, not {v!r}")
        steps, epochs = ns.steps_per_epoch, ns.epochs
    for key in ("flops", "params", "batch", "power_limit_w"):
        v = config.get(key)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise UsageError(f"--{key.replace('_w', '').replace('_', '-')} must be a positive number, not {v!r}")
    if epochs and not steps:
        raise UsageError("--epochs needs --steps-per-epoch")
    if config["device"] is None:
        if len(model["devices"]) != 1:
            raise UsageError(f"give --device: the model knows {'; '.join(model['devices'])}")
        config["device"] = model["devices"][0]
    why = F.outside_range(model, config)
    if why and not ns.extrapolate:
        raise UsageError(f"{why}; --extrapolate predicts anyway")
    try:
        p = F.predict(model, config, steps, epochs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not all(math.isfinite(v) for key in ("per_step_j", "per_epoch_j", "per_run_j") if key in p
               for v in (p[key]["value"], p[key]["low"], p[key]["high"])):
        raise UsageError("the prediction is beyond what a number holds: check --steps-per-epoch and --epochs")
    if why:
        p["extrapolated"] = why
    if measured is not None:
        p["measured"] = {"per_step_j": measured["energy_per_step_j"], "per_epoch_j": measured["energy_per_epoch_j"]}
    if why:
        print(f"{PROG}: warning: extrapolated: {why}", file=sys.stderr)
    if ns.json:
        print(json.dumps({"config": config, **p}, allow_nan=False))
        return 0
    conf = int(round(p["confidence"] * 100))
    print(f"configuration: {config['flops']:.4g} FLOPs per step, device {config['device']}"
          + (f", {config['params']:.4g} parameters" if config.get("params") else "")
          + (f", batch {config['batch']:g}" if config.get("batch") else ""))
    for key, label in (("per_step_j", "per step"), ("per_epoch_j", f"per epoch ({steps:g} steps)" if steps else ""),
                       ("per_run_j", f"per run ({epochs:g} epochs)" if epochs else "")):
        if key in p:
            v = p[key]
            line = (f"  energy {label}: {_j(v['value'])} [{_j(v['low'])}, {_j(v['high'])}]"
                    f" ({conf}% prediction interval, estimated)")
            if measured is not None and key in p["measured"] and p["measured"][key]:
                m = p["measured"][key]
                line += f"; measured {_j(m)} ({(v['value'] - m) / m * 100:+.1f}%)"
            print(line)
    return 0
