"""One rule for the degrees of every command: an axis not given is the job's own."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from prism.capture.cli import app as capture_app
from prism.schemas.layout import LayoutError, ParallelLayout
from prism.schemas.layout_options import ONE, given_differs, layout_of

GPT = ParallelLayout(tp=8, pp=16, dp=64)


def test_a_programs_axes_not_given_are_one_and_the_gpts_are_its_defaults() -> None:
    assert layout_of({"dp": 64}) == ParallelLayout(tp=1, pp=1, dp=64)
    assert layout_of({"dp": 64}, GPT) == GPT
    assert layout_of({"pp": 2}, GPT) == ParallelLayout(tp=8, pp=2, dp=64)


def test_dp_is_given_whole_or_by_its_two_parts() -> None:
    hsdp = ParallelLayout(tp=1, pp=1, dp=8, dp_replicate=2)
    assert layout_of({"dp_replicate": 2, "dp_shard": 4}) == hsdp
    assert layout_of({"dp": 8, "dp_replicate": 2}) == hsdp
    assert layout_of({"dp": 8, "dp_replicate": 2, "dp_shard": 4}) == hsdp
    assert layout_of({"dp_shard": 4}) == ParallelLayout(tp=1, pp=1, dp=4)
    assert layout_of({"dp_replicate": 4}, hsdp) == ParallelLayout(
        tp=1, pp=1, dp=16, dp_replicate=4
    )  # shards kept
    with pytest.raises(LayoutError, match="--dp 6 is not --dp-replicate 2 x --dp-shard 4 = 8"):
        layout_of({"dp": 6, "dp_replicate": 2, "dp_shard": 4})
    with pytest.raises(LayoutError, match="--cp must be a positive integer, got 0"):
        layout_of({"cp": 0})


def test_what_a_build_changes_is_named() -> None:
    captured = ParallelLayout(tp=2, pp=1, dp=8, dp_replicate=2, cp=2)
    assert given_differs({"tp": 2, "dp_shard": 4, "cp": None}, captured) == []
    assert given_differs({"tp": 4, "cp": 1, "pp": None}, captured) == ["--tp 4", "--cp 1"]
    assert layout_of({}, captured) == captured


def test_the_built_in_gpt_refuses_the_axes_it_has_not() -> None:
    result = CliRunner().invoke(capture_app, ["--cp", "2", "-o", "unused"])
    assert result.exit_code != 0
    assert "the built-in GPT has tp, pp and dp only; --cp are for programs" in result.output
    assert ONE.world_size == 1
