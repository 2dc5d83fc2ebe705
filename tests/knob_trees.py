"""Fake knob hardware for tests: cpufreq and powercap trees in a folder, a stand-in `nvpmodel`."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path


def cpufreq_tree(root: Path, cpus: int = 2, cur: int = 3_000_000, low: int = 800_000, high: int = 3_600_000,
                 per_policy: int = 1) -> Path:
    """As real sysfs lays it out: the files in cpufreq/policyM, and cpuN/cpufreq a link to ../cpufreq/policyM.
    per_policy CPUs share one policy (an ARM cluster): their knobs write one file."""
    (root / "cpufreq").mkdir(parents=True, exist_ok=True)
    for n in range(cpus):
        m = n // per_policy
        policy = root / "cpufreq" / f"policy{m}"
        if not policy.exists():
            policy.mkdir()
            (policy / "scaling_max_freq").write_text(f"{cur}\n")
            (policy / "cpuinfo_min_freq").write_text(f"{low}\n")
            (policy / "cpuinfo_max_freq").write_text(f"{high}\n")
        (root / f"cpu{n}").mkdir()
        os.symlink(f"../cpufreq/policy{m}", root / f"cpu{n}" / "cpufreq")
    return root


def max_freqs(root: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(root.glob("cpu[0-9]*/cpufreq/scaling_max_freq"))]


def powercap_tree(root: Path, limit_uw: int = 65_000_000, max_uw: int = 125_000_000) -> Path:
    z = root / "intel-rapl:0"
    z.mkdir(parents=True)
    (z / "name").write_text("package-0\n")
    (z / "energy_uj").write_text("0\n")
    (z / "constraint_0_name").write_text("long_term\n")
    (z / "constraint_0_power_limit_uw").write_text(f"{limit_uw}\n")
    (z / "constraint_0_max_power_uw").write_text(f"{max_uw}\n")
    (z / "constraint_1_name").write_text("short_term\n")
    (z / "constraint_1_power_limit_uw").write_text(f"{int(max_uw * 1.2)}\n")
    sub = root / "intel-rapl:0:0"
    sub.mkdir()
    (sub / "constraint_0_name").write_text("long_term\n")
    (sub / "constraint_0_power_limit_uw").write_text("0\n")
    return root


NVPMODEL = '''#!{python}
"""Stand-in nvpmodel: the mode lives in a file; modes as on a Jetson Orin Nano."""
import sys
from pathlib import Path
state = Path({state!r})
args = sys.argv[1:]
names = {{0: "15W", 1: "7W", 2: "MAXN_SUPER"}}
if args[:2] == ["-q", "--verbose"]:
    for i, n in names.items():
        print(f"NVPM VERB: POWER_MODEL: ID={{i}} NAME={{n}}")
    m = int(state.read_text())
    print(f"NV Power Mode: {{names[m]}}\\n{{m}}")
elif args == ["-q"]:
    m = int(state.read_text())
    print(f"NV Power Mode: {{names[m]}}\\n{{m}}")
elif args[:1] == ["-m"] and int(args[1]) in names:
    state.write_text(args[1])
else:
    print("NVPM ERROR: bad arguments", file=sys.stderr)
    sys.exit(1)
'''


def nvpmodel(bin_dir: Path, state: Path, mode: int = 0) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    state.write_text(str(mode))
    exe = bin_dir / "nvpmodel"
    exe.write_text(NVPMODEL.format(python=sys.executable, state=str(state)))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def wait_for(check, timeout_s: float = 30.0) -> bool:
    """Poll until check() holds: a hang guard, not a timing assertion."""
    def holds() -> bool:
        try:
            return bool(check())
        except ValueError:  # caught between a fake file's truncation and its write (sysfs writes are whole)
            return False

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if holds():
            return True
        time.sleep(0.02)
    return holds()


def env_with(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("ENERGYPROF_POWERCAP_ROOT", None)
    env.update(extra)
    return env
