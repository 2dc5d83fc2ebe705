"""`python -m energyprof`: the command line, with the current folder taken off sys.path first."""

import os
import sys

# `python -m energyprof` puts the current folder first on sys.path; the program's files
# (an html.py, a csv.py) must never stand in for the modules energyprof imports later.
if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from .cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
