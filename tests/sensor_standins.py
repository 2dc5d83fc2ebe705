"""Stand-in executables for the power tools: a script of the tool's name on PATH that prints
recorded records at the interval it is asked for, until it is killed (as the real tools do).
A powermetrics record states the time it covers; the stand-in writes there the time since its
previous record, as the real tool measures it, so that a loaded machine's late wake-ups are
said rather than hidden."""

from __future__ import annotations

import os
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "sensors"

STANDIN = r'''#!{python}
import os, re, sys, time
args = sys.argv[1:]
fail = os.environ.get("STANDIN_FAIL")
if fail:
    sys.stderr.write(fail + "\n")
    sys.exit(1)
interval_ms = 1000
for flag in ("--interval", "-i"):
    if flag in args:
        interval_ms = int(args[args.index(flag) + 1])
with open(os.environ["STANDIN_FILE"], "rb") as fh:
    data = fh.read()
kind = os.environ.get("STANDIN_KIND", "lines")
if kind == "tegrastats":  # BOARD_MW<TAB>LINE: print the line
    records = [ln.split(b"\t", 1)[1] + b"\n" for ln in data.splitlines() if b"\t" in ln]
elif kind == "plist":
    records = [d + b"\0" for d in data.split(b"\0") if d.strip()]
elif kind == "text":
    head, *blocks = data.split(b"*** Sampled")
    records = [head] + [b"*** Sampled" + b for b in blocks]
else:
    records = [ln + b"\n" for ln in data.splitlines() if ln.strip()]
def stamp(record, elapsed_s):
    if kind == "text":
        return re.sub(rb"\(([\d.]+)ms elapsed\)", b"(%.2fms elapsed)" % (elapsed_s * 1e3), record)
    if kind == "plist":
        return re.sub(rb"(<key>elapsed_ns</key>\s*<integer>)\d+", rb"\g<1>%d" % int(elapsed_s * 1e9), record)
    return record
out = sys.stdout.buffer
i = 0
last = time.perf_counter()
limit = int(os.environ.get("STANDIN_MAX_RECORDS", "0"))
while not limit or i < limit:
    now = time.perf_counter()
    out.write(stamp(records[i % len(records)], now - last))
    last = now
    out.flush()
    i += 1
    time.sleep(interval_ms / 1000)
'''


def load_module(name: str):  # noqa: ANN201 - a stand-in binding (fake_amdsmi, fake_jtop) as a module
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, FIXTURES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def install(bin_dir: Path, name: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(STANDIN.replace("{python}", sys.executable))
    path.chmod(0o755)
    return path


def env_for(bin_dir: Path, fixture: str, kind: str, **extra: str) -> dict[str, str]:
    """The environment that puts the stand-in first on PATH and points it at a fixture."""
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "STANDIN_FILE": str(FIXTURES / fixture),
            "STANDIN_KIND": kind, **extra}


def board_mw(fixture: str) -> list[float]:
    """The board power each line of a tegrastats fixture states (its first column)."""
    return [float(ln.split("\t", 1)[0]) for ln in (FIXTURES / fixture).read_text().splitlines() if "\t" in ln]
