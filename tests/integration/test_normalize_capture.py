"""normalize_capture on a real tiny capture (target tp=2 pp=4 dp=2, one real rank per role)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from prism.capture.runner import CaptureOptions, run_capture
from prism.capture.workloads.gpt.config import GPTConfig
from prism.graph.build import op_table as T
from prism.graph.build.normalize import baseline_bytes, block_signatures, et_join_coverage, normalize_capture
from prism.schemas.comm_log import read_comm_log
from prism.schemas.manifest import CaptureFiles, read_manifest

pytestmark = pytest.mark.slow

CONFIG = GPTConfig(layers=4, hidden=64, heads=4, seq_len=16, vocab=128, microbatches=4, tp=2, pp=4, dp=2)
WARMUP, ITERATIONS = 1, 2


@pytest.fixture(scope="module")
def capture_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("normalize") / "capture"
    run_capture(CaptureOptions(config=CONFIG, out_dir=out, warmup=WARMUP, iterations=ITERATIONS))
    return out


@pytest.fixture(scope="module")
def tables(capture_dir: Path) -> dict[int, pd.DataFrame]:
    return normalize_capture(capture_dir)


def test_every_captured_rank_and_profiled_iteration(
    capture_dir: Path, tables: dict[int, pd.DataFrame]
) -> None:
    assert set(tables) == {r.rank for r in read_manifest(capture_dir).ranks}
    profiled = set(range(WARMUP, WARMUP + ITERATIONS))  # iterations count from 0, warm-up first
    for rank, df in tables.items():
        T.check_op_table(df)
        assert set(df[T.ITERATION]) == profiled, rank
        assert [i["iteration"] for i in df.attrs["iterations"]] == sorted(profiled)
        assert (df[T.RANK] == rank).all()
        assert df[T.SEQ].tolist() == list(range(len(df)))
        assert df[T.START_NS].is_monotonic_increasing


def test_gaps_are_never_negative(tables: dict[int, pd.DataFrame]) -> None:
    # Units of one thread never overlap and times are exact ns: no tolerance is needed.
    for df in tables.values():
        assert (df[T.GAP_NS] >= 0).all() and (df[T.DUR_NS] >= 0).all()


def test_units_cover_the_iteration(tables: dict[int, pd.DataFrame]) -> None:
    for rank, df in tables.items():
        for it in df.attrs["iterations"]:
            units = df[df[T.ITERATION] == it["iteration"]]
            covered = int((units[T.GAP_NS] + units[T.DUR_NS]).sum())
            # Gaps are measured from the previous unit's end, so they telescope exactly.
            last_end = int((units[T.START_NS] + units[T.DUR_NS]).iloc[-1])
            assert covered == last_end - it["start_ns"], (rank, it)
            assert it["start_ns"] < last_end <= it["end_ns"]


def test_comm_units_are_the_logged_calls_of_the_profiled_iterations(
    capture_dir: Path, tables: dict[int, pd.DataFrame]
) -> None:
    for rank, df in tables.items():
        windows = [(i["start_ns"], i["end_ns"]) for i in df.attrs["iterations"]]
        calls = [
            c
            for c in read_comm_log(CaptureFiles(capture_dir).comm(rank)).calls
            if any(s <= c.enter_ns < e for s, e in windows)
        ]
        comm = df[df[T.IS_COMM]]
        assert len(comm) == len(calls) > 0
        assert list(zip(comm[T.GROUP_NAME], comm[T.GSEQ], strict=True)) == [(c.group, c.gseq) for c in calls]
        assert comm[T.NAME].tolist() == [c.op for c in calls] == comm[T.COMM_OP].tolist()
        assert comm[T.BYTES].tolist() == [c.bytes for c in calls]


def test_block_instances_of_one_kind_agree(tables: dict[int, pd.DataFrame]) -> None:
    kind = [T.PHASE, T.LAYER, T.PART, T.DIR, T.BUCKET]
    for rank, df in tables.items():
        sig = block_signatures(df)
        layers = sig[sig[T.PHASE].isin(["fwd", "bwd"]) & (sig[T.LAYER] >= 0)]
        assert len(layers) == 2 * CONFIG.microbatches * ITERATIONS * (CONFIG.layers // CONFIG.pp), rank
        disagree = sig.groupby(kind)["signature"].nunique()
        assert (disagree == 1).all(), (rank, disagree[disagree > 1])
        # Every layer's forward runs the same ops (backward differs for a stage's first layer).
        fwd = layers[layers[T.PHASE] == "fwd"]
        assert fwd["signature"].nunique() == 1, rank


def test_et_join_and_memory(tables: dict[int, pd.DataFrame]) -> None:
    for rank, df in tables.items():
        assert et_join_coverage(df) >= 0.99, rank
        assert (df[T.ALLOC_BYTES] > 0).any() and (df[T.FREE_BYTES] > 0).any()
        for it, units in df.groupby(T.ITERATION):
            # Total Allocated is a running sum of the events, all of which land in a unit or a gap.
            total = units[T.ALLOC_TOTAL_AT_START].to_numpy()
            step = (units[T.ALLOC_BYTES] - units[T.FREE_BYTES]).to_numpy()
            gap = (units[T.GAP_ALLOC_BYTES] - units[T.GAP_FREE_BYTES]).to_numpy()
            np.testing.assert_array_equal(total[1:], total[:-1] + step[:-1] + gap[1:])
            assert baseline_bytes(df, it) >= 0
