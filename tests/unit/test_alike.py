"""The build's check that ranks it treats alike made the same calls."""

from __future__ import annotations

import pytest

from prism.graph.build.alike import check_alike
from prism.graph.build.templates import TemplateError

SEND = ("send", "pp", 1024, "float32", 1)
RECV = ("recv", "pp", 1024, "float32", -1)
REDUCE = ("all_reduce", "dp", 4096, "float32", 0)


def test_alike_sequences_pass() -> None:
    check_alike({3: [RECV, SEND, REDUCE], 9: [RECV, SEND, REDUCE]}, "run stage 1")


def test_the_first_difference_names_both_ranks_and_both_calls() -> None:
    with pytest.raises(TemplateError) as e:
        check_alike({9: [RECV, SEND, REDUCE], 3: [RECV, RECV, REDUCE]}, "run stage 1")
    message = str(e.value)
    assert message.startswith("ranks 3 and 9 run stage 1, but their calls differ at call 1")
    assert "rank 3 made recv on stage -1, 1024 bytes of float32, rank 9 send on stage +1" in message


def test_a_sequence_that_ends_early_differs() -> None:
    with pytest.raises(TemplateError, match="rank 4 no call"):
        check_alike({2: [SEND, REDUCE], 4: [SEND]}, "run stage 1")


def test_an_all_to_alls_bytes_are_its_ranks_routing_not_a_difference() -> None:
    import pandas as pd

    from prism.graph.build import op_table as ot
    from prism.graph.build.alike import call_sequence
    from prism.schemas.layout import ParallelLayout

    def ops(dispatched: int) -> pd.DataFrame:
        return pd.DataFrame({
            ot.ITERATION: [5, 5, 5], ot.IS_COMM: [True, True, True],
            ot.COMM_OP: ["all_to_all", "all_to_all", "all_reduce"], ot.GROUP_LABEL: ["ep.0", "ep.0", "dp.0"],
            ot.BYTES: [32, dispatched, 4096], ot.DTYPE: ["int64", "float32", "float32"], ot.PEER: [-1, -1, -1],
        })  # fmt: skip

    layout = ParallelLayout(tp=1, pp=1, dp=8, ep=4)
    # Rank 3 routed more tokens than rank 0: the same calls. A different all-reduce is not.
    check_alike(
        {0: call_sequence(ops(4000), 0, layout), 3: call_sequence(ops(5200), 3, layout)}, "run stage 0"
    )
    other = ops(4000)
    other.loc[2, ot.BYTES] = 2048
    with pytest.raises(TemplateError, match="call 2"):
        check_alike(
            {0: call_sequence(ops(4000), 0, layout), 3: call_sequence(other, 3, layout)}, "run stage 0"
        )
