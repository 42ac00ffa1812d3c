"""Ranks the build treats as alike must have made the same calls, up to the layout's symmetry.

A program's graph gives every rank of a stage the calls of one captured rank, and with
``--roles first-middle-last`` every middle stage the calls of a captured middle one. Before it
does, the captured ranks that stand for the same thing are compared call by call over their
first profiled iteration: the operation, the layout axis of its group, bytes, dtype and, for a
transfer, the stage offset of the peer. An all-to-all's bytes are left out: they are the tokens
its rank's data routed, and the graph gives every rank the captured rank's routing (the virtual
peers' rule). The first difference is an error that names both ranks and both calls.
"""

from __future__ import annotations

import pandas as pd

from prism.graph.build import op_table as ot
from prism.graph.build.templates import TemplateError
from prism.schemas.layout import ParallelLayout

Call = tuple[str, str, int, str, int]


def call_sequence(ops: pd.DataFrame, rank: int, layout: ParallelLayout) -> list[Call]:
    """(op, group axis, bytes, dtype, peer stage offset) of each call of the first profiled iteration."""
    first = ops[ops[ot.ITERATION] == ops[ot.ITERATION].min()]
    calls = first[first[ot.IS_COMM].astype(bool)]
    stage = layout.stage(rank)
    sequence = []
    for op, label, nbytes, dtype, peer in zip(
        calls[ot.COMM_OP].astype(str), calls[ot.GROUP_LABEL].astype(str), calls[ot.BYTES],
        calls[ot.DTYPE].astype(str), calls[ot.PEER], strict=True,
    ):  # fmt: skip
        offset = (
            layout.stage(int(peer)) - stage if op in ("send", "recv") and pd.notna(peer) and peer >= 0 else 0
        )
        routed = op in ("all_to_all", "all_to_all_single")
        sequence.append((op, label.split(".")[0], -1 if routed else int(nbytes), dtype, offset))
    return sequence


def _describe(call: Call | None) -> str:
    if call is None:
        return "no call (its sequence ended)"
    op, axis, nbytes, dtype, offset = call
    where = f"stage {offset:+d}" if op in ("send", "recv") else f"group {axis}"
    size = "routed bytes" if nbytes < 0 else f"{nbytes} bytes"
    return f"{op} on {where}, {size} of {dtype}"


def check_alike(sequences: dict[int, list[Call]], why: str) -> None:
    """TemplateError naming the first call where the ranks of ``sequences`` differ."""
    ranks = sorted(sequences)
    base = ranks[0]
    for other in ranks[1:]:
        a, b = sequences[base], sequences[other]
        for i in range(max(len(a), len(b))):
            left = a[i] if i < len(a) else None
            right = b[i] if i < len(b) else None
            if left != right:
                raise TemplateError(
                    f"ranks {base} and {other} {why}, but their calls differ at call {i} of the first "
                    f"profiled iteration: rank {base} made {_describe(left)}, rank {other} {_describe(right)}"
                )
