"""The smallest energyprof demo: three functions that spend energy very differently.

    python -m energyprof examples/quickstart.py          # profile it, write energyprof-report.html
    python examples/quickstart.py                         # or just run it

`crunch` keeps a core busy and should carry most of the program's energy; `tidy` does a
little work; `wait` sleeps, so under the default idle policy ("share") its time costs the
program almost nothing: the machine's idle draw goes to [other processes and idle].
"""

from __future__ import annotations

import argparse
import time


def crunch(n: int) -> int:
    """CPU-heavy: a pure-Python prime sieve."""
    sieve = bytearray([1]) * (n + 1)
    sieve[0:2] = b"\x00\x00"
    for i in range(2, int(n**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytes(len(range(i * i, n + 1, i)))
    total = 0
    for i, flag in enumerate(sieve):  # a slow Python loop on purpose
        if flag:
            total += i
    return total


def tidy(words: int) -> int:
    """Lighter: build and sort a few strings."""
    return len(sorted(f"w{i * 7919 % 10007}" for i in range(words)))


def wait(seconds: float) -> None:
    """Idle: sleeping uses no CPU."""
    time.sleep(seconds)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=1.0, help="multiply the work (default 1.0: about 1.5 s)")
    a = p.parse_args(argv)
    print("sum of primes:", crunch(int(20_000_000 * a.scale)))
    print("sorted words:", tidy(int(400_000 * a.scale)))
    wait(0.5 * a.scale)


if __name__ == "__main__":
    main()
