"""Where a program's asynchronous calls are waited for in its graph."""

from __future__ import annotations

import pandas as pd

from prism.graph.build import op_table as ot
from prism.graph.build.program_stage import _wait_positions


def units(*rows: tuple[str, bool, bool, int, int]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                ot.NAME: name,
                ot.IS_COMM: comm,
                ot.IS_ASYNC: is_async,
                ot.START_NS: start,
                ot.FIRST_WAIT_NS: waited,
            }
            for name, comm, is_async, start, waited in rows
        ]
    )


def test_a_posted_receive_is_waited_for_where_the_program_waited() -> None:
    table = units(
        ("aten::linear", False, False, 100, 0),
        ("recv", True, True, 200, 450),  # posted early, waited for after the second op below
        ("aten::gelu", False, False, 300, 0),
        ("aten::linear", False, False, 400, 0),
        ("aten::add", False, False, 500, 0),
    )
    assert _wait_positions(table) == {3: [1]}


def test_without_a_seen_wait_a_call_is_waited_for_at_once_or_where_backward_ends() -> None:
    table = units(
        ("aten::linear", False, False, 100, 0),
        ("all_reduce", True, True, 200, 0),
        ("autograd::engine::evaluate_function: AddmmBackward0", False, False, 300, 0),
        ("all_reduce", True, True, 400, 0),  # DDP's bucket, from autograd's hook
        ("autograd::engine::evaluate_function: AddmmBackward0", False, False, 500, 0),
        ("aten::add_", False, False, 600, 0),
    )
    assert _wait_positions(table) == {1: [1], 4: [3]}
