"""The headline CPU is the program's: what the shell ran before energyprof is not in it.

`bash -c 'A && python -m energyprof ...'` execs energyprof in the shell's process, which has reaped A:
the kernel's RUSAGE_CHILDREN figure of that process holds A's CPU before energyprof starts anything."""

from __future__ import annotations

import shlex
import subprocess
import sys

from energyprof import load

from conftest import profiled, script

# Burns until its own CPU clock (not the wall clock, so a loaded machine changes nothing) reaches 1.5 s,
# then prints that figure as the kernel counted it.
BURN_CPU = """
import resource

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

s = 0
while cpu() < 1.5:
    for i in range(10_000):
        s += i
print(cpu())
"""


def test_an_empty_script_after_a_cpu_bound_command_shows_its_own_cpu(here):
    script(here, "burn.py", BURN_CPU)
    script(here, "empty.py", "")
    energyprof = shlex.join([sys.executable, "-m", "energyprof", *profiled("empty.py")])
    burn = shlex.join([sys.executable, "burn.py"])
    res = subprocess.run(["bash", "-c", f"{burn} > burn.txt && {energyprof}"], cwd=here, capture_output=True,
                         text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    burnt = float((here / "burn.txt").read_text())
    assert burnt >= 1.5
    cpu = load(here / "p.json").totals["cpu_time_s"]
    # Before: the burn's CPU plus the empty script's (1.55 s measured). The empty script's own is its
    # interpreter's start and end, a small fraction of the burn's: counting the burn at all gives >= 1.5 s.
    assert 0 < cpu < burnt / 3, f"headline CPU {cpu:.3f} s holds the command before it ({burnt:.3f} CPU-s)"
