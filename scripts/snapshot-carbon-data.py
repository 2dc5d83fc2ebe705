#!/usr/bin/env python3
"""Write energyprof/data/carbon-snapshot.json from the installed codecarbon's data files.

The snapshot is what `pip install energyprof` uses for --country/--region/--cloud and the CPU
TDP table when codecarbon (the `[carbon]` extra) is not installed. Run it after upgrading the
pinned codecarbon, from the repository root, then run tests/test_carbon.py, which checks that the
snapshot and codecarbon's files give the same figure for every country, region, cloud region
and CPU model:

    pip install 'codecarbon>=3.3,<3.4'
    python scripts/snapshot-carbon-data.py [--date YYYY-MM-DD]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from energyprof import carbon_data  # noqa: E402


def _dumps(value: Any, depth: int = 0) -> str:
    """JSON with one table entry per line (a country, a region, a CPU): compact, and a changed
    figure in codecarbon shows as a one-line diff."""
    if not isinstance(value, (dict, list)) or not value or _is_record(value):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    pad = " " * (depth + 1)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {_dumps(v, depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"
    return "[\n" + ",\n".join(pad + _dumps(v, depth + 1) for v in value) + "\n" + " " * depth + "]"


def _is_record(value: dict | list) -> bool:
    """A table entry: its values are scalars or lists of scalars."""
    values = value.values() if isinstance(value, dict) else value
    return all(not isinstance(v, dict) and not (isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v))
               for v in values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--date", default=dt.datetime.now(dt.timezone.utc).date().isoformat(),
                        help="the snapshot date to record (default: today, UTC)")
    parser.add_argument("-o", "--output", type=Path, default=carbon_data.SNAPSHOT)
    args = parser.parse_args()
    source = carbon_data.codecarbon()
    if source is None:
        print("codecarbon is not installed: pip install 'codecarbon>=3.3,<3.4'", file=sys.stderr)
        return 2
    snapshot = carbon_data.build_snapshot(source, args.date)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    text = _dumps(snapshot) + "\n"
    args.output.write_text(text, encoding="utf-8")
    print(f"{args.output}: codecarbon {source.version}, {args.date}, {len(text.encode()):,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
