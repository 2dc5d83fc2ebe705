"""render/format.py's rounding: `sig` rounds a float's exact value half-up, as decimal's quantize does."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

from hypothesis import example, given, settings
from hypothesis import strategies as st

from energyprof.render.format import fmt_energy, sig


def _decimal_sig(x: float, digits: int) -> str:
    """The reference: the exact binary value in decimal, quantized half-up at the digit kept."""
    if x == 0:
        return "0"
    d = Decimal(abs(x))
    q = d.quantize(Decimal(1).scaleb(d.adjusted() - digits + 1), rounding=ROUND_HALF_UP)
    s = format(q, "f")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return ("-" if x < 0 else "") + s


@settings(max_examples=3000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False), st.integers(min_value=1, max_value=8))
@example(999.5, 3).via("rounds up into the next power")
@example(9.995, 3).via("the nearest float is below the half: down")
@example(0.0005, 1).via("exactly half below one")
@example(1e23, 3).via("log10 rounds across the power")
@example(5e-324, 3).via("the smallest subnormal")
@example(1.7976931348623157e308, 3).via("the largest float")
def test_sig_is_decimals_half_up_of_the_exact_value(x: float, digits: int) -> None:
    assert sig(x, digits) == _decimal_sig(x, digits)


def test_a_unit_rolls_over_where_rounding_reaches_a_thousand() -> None:
    assert fmt_energy(999.5) == "1 kJ" and fmt_energy(999.4) == "999 J" and fmt_energy(-0.0015) == "-1.5 mJ"
    assert sig(math.pi) == "3.14" and sig(2.675, 3) == "2.67"  # 2.675 is 2.67499999... as a float
