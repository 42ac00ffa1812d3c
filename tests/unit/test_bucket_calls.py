"""DDP's bucket all-reduces taken out of an iteration and planned again for other parameters."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from prism.graph.build import op_table as ot
from prism.graph.build.bucket_calls import READY, WHOLE, BucketCaps, insert_bucket_calls, strip_bucket_calls
from prism.graph.build.templates import TemplateError

CAPS = BucketCaps(bucket_bytes=400, first_bucket_bytes=100, itemsize=4)


def _unit(name: str, *, call_bytes: int = -1, dur: int = 10) -> dict:
    return {
        ot.NAME: name, ot.PHASE: "bwd", ot.LAYER: -1, ot.IS_COMM: call_bytes >= 0, ot.IS_ASYNC: call_bytes >= 0,
        ot.BYTES: call_bytes, ot.DUR_NS: dur, ot.GAP_NS: 1, ot.ALLOC_BYTES: 4, ot.FREE_BYTES: 4,
    }  # fmt: skip


def _backward(numels: tuple[int, ...]) -> pd.DataFrame:
    """Gradients ready last parameter first; where DDP's plan fills a bucket, the accumulation is
    split around its all-reduce, as the profiler records it."""
    closing = {len(numels) - 1 - min(b.params): b.numel * 4 for b in CAPS.plan(numels)}
    units = []
    for k in range(len(numels)):
        units.append(_unit("AddmmBackward0"))
        if k in closing:
            units += [
                _unit(READY),
                _unit("torch::distributed::reducer::mul_out"),
                _unit("all_reduce", call_bytes=closing[k]),
            ]
        else:
            units.append(_unit(WHOLE))
    units.append(_unit("finalize"))
    return pd.DataFrame(units)


def test_the_calls_come_out_and_the_accumulations_are_whole_again() -> None:
    numels = (30, 10, 10, 10)  # ready: 10, 10, 10 (40 bytes each): the first bucket closes at 120 bytes
    units = _backward(numels)
    calls = np.flatnonzero(units[ot.IS_COMM])
    waits = {len(units) - 1: calls.tolist()}
    stripped, _, left, taken = strip_bucket_calls(units, [units], waits, CAPS, numels)
    assert not stripped[ot.IS_COMM].any()
    assert (stripped[ot.NAME] == WHOLE).sum() == len(numels)
    assert left == {}
    assert taken.waited_after == len(stripped) - 1
    # The joined accumulation holds its pieces' time and memory.
    joined = stripped[ot.NAME].eq(WHOLE) & stripped[ot.DUR_NS].gt(10)
    assert stripped[joined][ot.DUR_NS].tolist() == [21, 21] and stripped[joined][ot.ALLOC_BYTES].tolist() == [
        8,
        8,
    ]


def test_the_target_buckets_are_made_after_the_gradients_that_fill_them() -> None:
    numels = (30, 10, 10, 10)
    units = _backward(numels)
    stripped, _, _, taken = strip_bucket_calls(units, [units], {}, CAPS, numels)
    target = (30, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10)  # more layers: 10 more gradients
    grown = pd.concat([stripped.iloc[:1], *[stripped.iloc[1:3]] * 7, stripped.iloc[1:]], ignore_index=True)
    out, waits = insert_bucket_calls(grown, {}, taken, len(grown) - 1, CAPS, target)
    calls = np.flatnonzero(out[ot.IS_COMM])
    ready = np.flatnonzero(out[ot.NAME] == WHOLE)
    # First bucket: three gradients (120 bytes >= 100); the next 400-byte cap: ten more, then the rest.
    assert [int(np.searchsorted(ready, c)) for c in calls] == [3, 11]
    assert out[ot.BYTES].iloc[calls].tolist() == [120, 4 * (7 * 10 + 30)]
    assert waits == {len(out) - 1: calls.tolist()}


def test_calls_that_are_not_the_planned_buckets_are_refused() -> None:
    numels = (30, 10, 10, 10)
    units = _backward(numels)
    call = int(np.flatnonzero(units[ot.IS_COMM])[0])
    units.loc[call, ot.BYTES] = 999
    with pytest.raises(TemplateError, match="do not follow the parameters' reverse order"):
        strip_bucket_calls(units, [units], {}, CAPS, numels)
    with pytest.raises(TemplateError, match="accumulated 4 gradients for 5 parameters"):
        strip_bucket_calls(_backward(numels), [units], {}, CAPS, (*numels, 1))
