"""What `pip install energyprof` brings: distributions and bytes, in a fresh venv without system packages.

    python benchmarks/install_size.py                  # this tree
    python benchmarks/install_size.py --ref v0.1.0     # any git commit, tag or branch, for a before/after

The wheel is built with `pip wheel --no-deps` (from `git archive REF` when a ref is given), installed
with its dependencies (no extras) into a new venv, and every distribution the install added is listed
with the bytes of the files it installed (the RECORD), leaving out the venv's own pip and setuptools.
Needs a package index for the dependencies. tests/test_install.py checks the same figures against
the limits (at most 6 distributions, 30 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Run by the venv's python: {distribution name: bytes of the files it installed}.
LIST_DISTRIBUTIONS = """
import importlib.metadata as m, json, os
out = {}
for d in m.distributions():
    size = 0
    for f in d.files or []:
        p = d.locate_file(f)
        size += os.path.getsize(p) if os.path.isfile(p) else 0
    out[d.metadata["Name"].lower()] = size
print(json.dumps(out))
"""


def clean_env() -> dict[str, str]:
    """This process's environment minus anything that would put other packages in the venv's path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONUSERBASE")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def venv_python(env_dir: Path) -> Path:
    venv.create(env_dir, system_site_packages=False, with_pip=True, clear=True)
    return env_dir / ("Scripts" if os.name == "nt" else "bin") / "python"


def distributions(py: Path) -> dict[str, int]:
    out = subprocess.run([str(py), "-c", LIST_DISTRIBUTIONS], capture_output=True, text=True, check=True,
                         env=clean_env(), timeout=60).stdout
    return json.loads(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", help="a git commit, tag or branch to measure instead of the working tree")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="energyprof-install-bench-") as tmp:
        tmp_path = Path(tmp)
        source = REPO
        if args.ref:
            source = tmp_path / "source"
            source.mkdir()
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.ref], capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "wheel"), str(source)],
                       check=True, env=clean_env())
        wheel = next((tmp_path / "wheel").glob("energyprof-*.whl"))
        wheel_bytes = wheel.stat().st_size
        py = venv_python(tmp_path / "venv")
        seeded = distributions(py)
        subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, env=clean_env())
        added = {name: size for name, size in distributions(py).items() if name not in seeded}
    print(f"energyprof ({args.ref or 'working tree'}): wheel {wheel_bytes / 1e6:.2f} MB; installed:")
    for name, size in sorted(added.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<28} {size / 1e6:8.2f} MB")
    print(f"{len(added)} distributions, {sum(added.values()) / 1e6:.1f} MB "
          f"(pip and setuptools, seeded by venv, not counted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
