"""`python -m energyprof`: the command line, with the current folder taken off sys.path first.

`python -m` puts the current folder first on sys.path; the program's files (a json.py, an
argparse.py) must never stand in for the modules energyprof imports. The package's
`__init__` imports nothing, so this runs before any import that could be shadowed (`sys` is
built in, `os` already loaded), as pip's `__main__` does.
"""

import os
import sys

if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from .cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
