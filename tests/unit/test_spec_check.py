"""A spec's drift: each op class's median of what its calls cost now over the spec's price."""

from __future__ import annotations

import pytest

from prism.graph.comm.bench import Sample
from prism.graph.comm.calibrate import Check
from prism.graph.comm.spec_check import SpecDrift


def _check(op: str, now_us: float, spec_us: float) -> Check:
    return Check(
        sample=Sample(op=op, bytes=4096, group_size=2, seconds=now_us * 1e-6), predicted_s=spec_us * 1e-6
    )


def test_a_class_is_stale_by_its_median_not_by_one_point() -> None:
    drift = SpecDrift(
        checks=(
            _check("all_reduce", 130, 100), _check("all_reduce", 125, 100), _check("all_reduce", 90, 100),
            _check("all_gather", 100, 100), _check("all_gather", 300, 100), _check("all_gather", 95, 100),
            _check("send", 50, 100), _check("send", 45, 100), _check("send", 60, 100),
        ),
        tolerance=0.2,
    )  # fmt: skip
    assert drift.by_class == pytest.approx({"all_gather": 1.0, "all_reduce": 1.25, "p2p": 0.5})
    assert drift.stale == ("all_reduce", "p2p")
    assert SpecDrift(checks=drift.checks, tolerance=0.6).stale == ()


def test_a_point_the_spec_prices_at_nothing_is_left_out_and_a_class_of_few_points_not_judged() -> None:
    checks = (_check("barrier", 40, 0), _check("all_reduce", 100, 100), _check("all_reduce", 300, 100))
    drift = SpecDrift(checks=checks, tolerance=0.2)
    assert drift.by_class == {"all_reduce": 2.0} and drift.judged == () and drift.stale == ()
