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
