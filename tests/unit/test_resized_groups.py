"""A program's graph at another data-parallel degree: which layouts and calls can be resized."""

from __future__ import annotations

import pandas as pd
import pytest

from prism.graph.build import op_table as ot
from prism.graph.build.resized_groups import check_resizable, resized_kinds, target_layout
from prism.graph.build.templates import TemplateError
from prism.schemas.layout import ParallelLayout

DDP = ParallelLayout(tp=1, pp=1, dp=2)
HSDP = ParallelLayout(tp=1, pp=1, dp=4, dp_replicate=2)  # 2 replicas of 2 shards
TP_DP = ParallelLayout(tp=2, pp=2, dp=2)


def given(**degrees: int) -> dict[str, int | None]:
    names = ("tp", "pp", "dp", "dp_replicate", "dp_shard", "cp", "ep", "etp")
    return {name: degrees.get(name) for name in names}


def calls(*made: tuple[str, str]) -> pd.DataFrame:
    """A captured rank's op table: a compute unit, then each (op, group label) call."""
    rows = [{ot.IS_COMM: False, ot.COMM_OP: "", ot.GROUP_LABEL: ""}]
    rows += [{ot.IS_COMM: True, ot.COMM_OP: op, ot.GROUP_LABEL: label} for op, label in made]
    return pd.DataFrame(rows)


def test_no_degree_given_keeps_the_captured_layout() -> None:
    assert target_layout(given(), TP_DP) == TP_DP
    assert target_layout(given(tp=2, pp=2, dp=2), TP_DP) == TP_DP


def test_the_data_parallel_and_pipeline_degrees_change_and_nothing_else() -> None:
    assert target_layout(given(dp=512), TP_DP) == ParallelLayout(tp=2, pp=2, dp=512)
    wider = target_layout(given(dp_replicate=64), HSDP)
    assert (wider.dp_replicate, wider.dp_shard, wider.dp) == (64, 2, 128)
    assert target_layout(given(pp=4), TP_DP) == ParallelLayout(tp=2, pp=4, dp=2)
    with pytest.raises(TemplateError, match=r"keeps its captured tp.*build without --tp 4"):
        target_layout(given(tp=4, dp=8), TP_DP)
    with pytest.raises(TemplateError, match="build without --cp 2"):
        target_layout(given(cp=2), TP_DP)


def test_an_axis_of_one_rank_is_a_different_program() -> None:
    with pytest.raises(TemplateError, match="capture with --dp 8"):
        target_layout(given(dp=8), ParallelLayout(tp=2, pp=1, dp=1))
    with pytest.raises(TemplateError, match="capture with --dp 1"):
        target_layout(given(dp=1), DDP)
    with pytest.raises(TemplateError, match="capture with --dp-replicate 2"):
        target_layout(given(dp_replicate=2), ParallelLayout(tp=1, pp=1, dp=4))


def test_resized_kinds_are_every_group_whose_size_changes() -> None:
    assert resized_kinds(DDP, target_layout(given(dp=8), DDP)) == {"dp": (2, 8), "world": (2, 8)}
    wider = resized_kinds(HSDP, target_layout(given(dp_replicate=8), HSDP))
    assert wider["dp_replicate"] == (2, 8) and wider["dp"] == (4, 16) and "dp_shard" not in wider
    assert resized_kinds(TP_DP, TP_DP) == {}


def test_calls_whose_bytes_do_not_depend_on_the_size_are_resized() -> None:
    made = calls(
        ("all_reduce", "dp.0"), ("broadcast", "world.0"), ("barrier", "dp.0"), ("all_gather", "tp.0")
    )
    check_resizable([(0, made)], (), TP_DP, target_layout(given(dp=64), TP_DP))


def test_a_call_sending_a_share_on_a_resized_group_is_refused() -> None:
    hsdp = calls(
        ("all_gather", "dp_shard.0"), ("reduce_scatter", "dp_shard.0"), ("all_reduce", "dp_replicate.0")
    )
    check_resizable([(0, hsdp)], (), HSDP, target_layout(given(dp_replicate=8), HSDP))  # the shards stay
    with pytest.raises(
        TemplateError, match=r"rank 3 calls all_gather on group 'dp_shard.0'.*2 ranks captured, 4"
    ):
        check_resizable([(3, hsdp)], (), HSDP, target_layout(given(dp_shard=4), HSDP))
    with pytest.raises(TemplateError, match="all_to_all on group 'world.0'"):
        check_resizable([(0, calls(("all_to_all", "world.0")))], (), DDP, target_layout(given(dp=4), DDP))


def test_a_rank_variant_on_a_resized_axis_is_refused() -> None:
    made = calls(("all_reduce", "dp.0"))
    check_resizable([(0, made)], ("tp",), TP_DP, target_layout(given(dp=8), TP_DP))
    with pytest.raises(TemplateError, match="ranks at an end of dp call differently"):
        check_resizable([(0, made)], ("dp",), TP_DP, target_layout(given(dp=8), TP_DP))
