"""`energyprof cache status` and `cache drop` on sparse files: the cost follows the data, not the size.

Makes a 64 GiB and a 1 TiB sparse file (1 MiB of data each) in a temporary folder and times each
command as a subprocess, with its peak RSS. Run from the repository root:

    python benchmarks/pagecache.py [--folder DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time


def timed(argv: list[str]) -> tuple[float, float, str]:
    """(wall seconds, the child's peak RSS in MB, its first line of output)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1024, out.splitlines()[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", default=None, help="where the sparse files go (default: the temporary folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.folder) as d:
        for name, size in (("64GiB", 64 << 30), ("1TiB", 1 << 40)):
            path = os.path.join(d, name)
            with open(path, "wb") as f:
                f.truncate(size)
                f.seek(size // 2)
                f.write(os.urandom(1 << 20))
                f.flush()
                os.fsync(f.fileno())
            for action in ("status", "drop"):
                wall, rss, line = timed([sys.executable, "-m", "energyprof", "cache", action, path])
                print(f"{name:6} cache {action:6} {wall:6.2f} s  peak RSS {rss:6.1f} MB   {line}")


if __name__ == "__main__":
    main()
