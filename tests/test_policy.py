"""facts/policy.py: the one vocabulary of idle policies, read by every place that chooses one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from energyprof.facts.policy import (DEFAULT_POLICY, IDLE_FLOOR, IDLE_POLICIES, PolicyError, PolicyPair, check_policy,
                                    common_policy, cpu_share, other)

PACKAGE = Path(__file__).resolve().parent.parent / "energyprof"


def test_pair_picks_by_policy_and_refuses_others() -> None:
    pair = PolicyPair(share=1.5, all=4.0)
    assert [pair.pick(p) for p in IDLE_POLICIES] == [1.5, 4.0]
    with pytest.raises(PolicyError, match="idle policy must be one of share, all, not 'most'"):
        pair.pick("most")  # type: ignore[arg-type]
    assert [other(p) for p in IDLE_POLICIES] == ["all", "share"]
    assert check_policy("all") == "all" and DEFAULT_POLICY == IDLE_POLICIES[0]


def test_a_join_keeps_the_one_policy_its_parts_agree_on() -> None:
    assert common_policy(["all", "all"]) == "all"
    assert common_policy(["share"]) == "share"
    assert common_policy(["all", "share"]) == DEFAULT_POLICY  # disagreeing parts: the default view
    assert common_policy([]) == DEFAULT_POLICY


@given(st.floats(-1e9, 1e12), st.floats(0, 1e12), st.floats(0, 1e12))
def test_cpu_share_is_a_fraction_and_idle_below_the_floor(proc: float, busy: float, capacity: float) -> None:
    s = cpu_share(proc, busy, capacity)
    assert 0.0 <= s <= 1.0
    if proc > 0 and busy < IDLE_FLOOR * capacity and proc < IDLE_FLOOR * capacity:
        assert s == pytest.approx(proc / (IDLE_FLOOR * capacity), rel=1e-12)  # the rest is the idle machine's


def test_no_module_spells_the_policy_tuple_again() -> None:
    """The choices live in facts/policy.py only: a second ("share", "all") drifts from it."""
    copies = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "policy.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Tuple) and [getattr(e, "value", None) for e in node.elts] == ["share", "all"]:
                copies.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert copies == []
