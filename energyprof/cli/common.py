"""What every subcommand shares: one-line usage errors, the output and carbon flags, and
Options built from parsed flags and checked against the file system before anything runs.

Building a parser needs only the options' vocabulary (setup/choices.py, facts/policy.py): `--help`
imports neither the Options class nor the checks, which come with the first command that runs."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, NoReturn

from ..facts.policy import IDLE_POLICIES
from ..setup.choices import OUTPUTS
from ..setup.choices import OptionError
from ..setup.choices import flag

if TYPE_CHECKING:
    from ..setup.options import Options

DEFAULT_OUTPUT = "energyprof-report.html"
DEFAULT_JOB_JSON = "energyprof-profile.json"  # one rank of several: the job's profile, joined by rank 0
PROG = "energyprof"

class UsageError(Exception):
    """A bad command line: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, formatter_class: Any = argparse.HelpFormatter, **kwargs: Any) -> None:
        super().__init__(*args, formatter_class=one_width(formatter_class), **kwargs)

    def error(self, message: str) -> NoReturn:  # one line, not usage + line
        raise UsageError(message)


def one_width(formatter_class: Any) -> Any:
    """`formatter_class` with the terminal's width measured once per parser, as the formatter would measure it
    (`shutil.get_terminal_size().columns - 2`): argparse makes a formatter for every argument it adds, to
    check its metavar, and each one asked the terminal again (41 times for the run's options)."""
    width: list[int] = []

    def make(prog: str, **kwargs: Any) -> argparse.HelpFormatter:
        if "width" not in kwargs:
            if not width:
                import shutil

                width.append(shutil.get_terminal_size().columns - 2)
            kwargs["width"] = width[0]
        return formatter_class(prog, **kwargs)  # type: ignore[no-any-return]
    return make


def add_output_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", help=f"HTML report path (default {DEFAULT_OUTPUT})")
    p.add_argument("--json", help="save the profile as JSON (docs/profile-format.md)")
    p.add_argument("--speedscope", help="export for speedscope (one profile by energy, one by time)")
    p.add_argument("--folded", help="export folded stacks 'a;b;c <microjoules>' for flamegraph tools")
    p.add_argument("--csv", help="export one row per function")
    p.add_argument("--pprof", help="export gzipped pprof (energy_<source> in uJ, cpu and wall in ns) for pprof/Pyroscope/Parca")
    p.add_argument("--mlflow", action="store_true",
                   help="log to the active MLflow run, or a new one (pip install 'energyprof[mlflow]')")
    p.add_argument("--emissions-csv", metavar="FILE",
                   help="append the run's row to FILE in codecarbon's emissions.csv schema (kg, kWh, W)")
    p.add_argument("--emissions-csv-windows", action="store_true",
                   help="with --emissions-csv: one more row per window (experiment_id names it)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing of energyprof's own")
    add_carbon_flags(p)


def add_carbon_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("carbon and cost (render options: `energyprof report` can change them)")
    g.add_argument("--country", help="ISO 3166 alpha-3 code for the grid's carbon intensity (e.g. FRA)")
    g.add_argument("--region", help="a region within the country, where codecarbon has data (e.g. california)")
    g.add_argument("--cloud", help="PROVIDER:REGION, e.g. gcp:europe-west1")
    g.add_argument("--carbon-intensity", type=float, metavar="G_PER_KWH",
                   help="a fixed intensity in gCO2eq/kWh (0 to 2000)")
    g.add_argument("--carbon-intensity-trace", metavar="FILE", help="CSV timestamp,g_per_kwh over the run")
    g.add_argument("--pue", type=float, default=None, help="data-centre power usage effectiveness, 1 to 5 (default 1.0)")
    g.add_argument("--price-per-kwh", type=float, help="electricity price per kWh, for cost figures")
    g.add_argument("--currency", default=None, help="currency of --price-per-kwh (default EUR)")


def allowed(values: tuple[str, ...]) -> str:
    """The allowed values, shown in --help; Options checks them with its own one-line message."""
    return "{" + ",".join(values) + "}"


def add_idle_flag(p: argparse.ArgumentParser, default: str | None) -> None:
    p.add_argument("--idle", default=default, metavar=allowed(IDLE_POLICIES),
                   help="share: charge the program its CPU share of the machine's energy; all: charge it"
                        " everything (a dedicated machine)" + ("" if default else
                                                                "; default: the policy the run used"))


def build_options(ns: argparse.Namespace, inputs: tuple[str, ...] = (), keep_checkpoint: bool = True,
             **extra: Any) -> Options:
    """Options from parsed flags, validated (pure) and then checked against the file system."""
    from ..drive.preflight import preflight
    from ..setup.options import Options

    fields = Options.names()
    kwargs = {k: v for k, v in vars(ns).items() if k in fields and v is not None}
    for name in ("output", *OUTPUTS, "checkpoint"):
        if kwargs.get(name) == "":
            raise OptionError(f"{flag(name)} needs a file name, not ''")
    if kwargs.get("emissions_csv_windows") and not kwargs.get("emissions_csv"):
        raise OptionError("--emissions-csv-windows needs --emissions-csv FILE")
    kwargs.update(extra)
    options = Options(**kwargs)
    preflight(options, inputs=inputs, keep_checkpoint=keep_checkpoint)
    return options
