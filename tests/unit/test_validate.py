"""validate_graph and prism-validate-graph on the synthetic tp=2 pp=2 dp=2 graph and corruptions of it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from test_graph_io import DEFAULTS, LAYOUT, graph_rows, metadata, write_graph, write_raw
from typer.testing import CliRunner

from prism.graph.io.parquet import GraphFormatError, GraphReader
from prism.graph.io.validate import (
    _AMOUNTS,
    _INTS,
    _STRINGS,
    GraphValidationError,
    _Pending,
    _Scan,
    validate_graph,
)
from prism.graph.io.validate_cli import app
from prism.schemas import graph_format as gf
from prism.schemas.graph_format import NodeKind
from prism.schemas.layout import ParallelLayout

Rows = list[dict]


def find(rows: Rows, rank: int, **match: object) -> dict:
    return next(r for r in rows if r[gf.RANK] == rank and all(r[k] == v for k, v in match.items()))


def to_compute(row: dict) -> None:
    """Turn a comm node into a compute node: the index stays, the comm disappears."""
    keep = {k: row[k] for k in (gf.RANK, gf.STREAM, gf.INDEX, gf.STAGE, gf.DEPS)}
    row.clear()
    row.update({**DEFAULTS, **keep, gf.KIND: NodeKind.COMPUTE.value, gf.NAME: "aten::add", gf.PHASE: "fwd"})


def corrupt(change: Callable[[Rows], None]) -> Rows:
    rows = graph_rows()
    change(rows)
    return rows


@pytest.mark.parametrize("far_ranks", [_Pending.FAR_RANKS, 0], ids=["near", "far"])
def test_valid_graph_passes_with_its_counts(
    tmp_path: Path, far_ranks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_Pending, "FAR_RANKS", far_ranks)
    calls: list[tuple[int, int]] = []
    report = validate_graph(write_graph(tmp_path / "g.parquet"), progress=lambda d, t: calls.append((d, t)))
    assert report.ok, report.problems
    assert (report.ranks, report.nodes, report.collectives, report.p2p_pairs) == (8, 56, 9, 4)
    assert report.bytes_by_group == {"dp": 8 << 20, "pp": 4 * 4096, "tp": 8 * 65536, "world": 8 * 8}
    assert calls == [(1, 3), (2, 3), (3, 3)]
    report.raise_if_failed()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda rows: to_compute(find(rows, 3, **{gf.COLL_ID: 101})), "coll_id 101 (tp group 1): rank 3 missing"),
        (
            lambda rows: find(rows, 0, **{gf.INDEX: 0}).update({**find(rows, 0, **{gf.INDEX: 1}), gf.INDEX: 0}),
            "coll_id 100 (tp group 0): rank 0 appears 2 times",
        ),
        (
            lambda rows: find(rows, 2, **{gf.COLL_ID: 101}).update({gf.COLL_ID: 100, gf.GROUP_INDEX: 0}),
            "coll_id 100 (tp group 0): rank 2 is not a member",
        ),
        (
            lambda rows: find(rows, 3, **{gf.COLL_ID: 201}).update({gf.BYTES: 12}),
            "coll_id 201: members disagree on bytes (rank 1: 1048576, rank 3: 12, ...)",
        ),
        (
            lambda rows: find(rows, 1, **{gf.COLL_ID: 100}).update({gf.NAME: "all_gather"}),
            "coll_id 100: members disagree on name (rank 0: 'all_reduce', rank 1: 'all_gather', ...)",
        ),
        (lambda rows: to_compute(find(rows, 6, **{gf.KIND: "recv"})), "send rank 2 -> rank 6 p2p_seq 0 has no matching recv"),
        (lambda rows: to_compute(find(rows, 2, **{gf.KIND: "send"})), "recv rank 2 -> rank 6 p2p_seq 0 has no matching send"),
        (
            lambda rows: find(rows, 1, **{gf.KIND: "send"}).update({gf.BYTES: 1}),
            "send rank 1 -> rank 5 p2p_seq 0: 1 bytes sent, the recv expects 4096",
        ),
        (
            lambda rows: find(rows, 4, **{gf.INDEX: 3}).update({gf.DEPS: [2, 4]}),
            "rank 4 stream 0 index 3: deps entry 4 does not point to an earlier node of its (rank, stream)",
        ),
        (
            lambda rows: find(rows, 4, **{gf.INDEX: 3}).update({gf.DEPS: [3]}),
            "rank 4 stream 0 index 3: deps entry 3 does not point to an earlier node",
        ),
        (lambda rows: find(rows, 7, **{gf.INDEX: 0}).update({gf.STAGE: 0}), "rank 7 index 0: stage 0, but the layout puts rank 7 in stage 1"),
        (
            lambda rows: [r.update({gf.GROUP_SIZE: 4}) for r in rows if r[gf.COLL_ID] == 100],
            "coll_id 100 (tp group 0): group_size 4, the group has 2 ranks",
        ),
        (
            lambda rows: [r.update({gf.GROUP_INDEX: 9}) for r in rows if r[gf.COLL_ID] == 201],
            "coll_id 201: the layout tp=2 pp=2 dp=2 (tp-dp-pp, 8 ranks) has no 'dp' group 9",
        ),
        (lambda rows: find(rows, 3, **{gf.INDEX: 5}).update({gf.INDEX: 6}), "rank 3 stream 0: index 6 where 5 was expected"),
        (lambda rows: find(rows, 5, **{gf.INDEX: 2}).update({gf.DUR_NS: -7}), "rank 5 index 2: dur_ns -7 is negative"),
        (lambda rows: find(rows, 5, **{gf.INDEX: 2}).update({gf.ALLOC_BYTES: -1}), "rank 5 index 2: alloc_bytes -1 is negative"),
        (lambda rows: find(rows, 6, **{gf.INDEX: 1}).update({gf.GAP_NS: 2**62}), "rank 6: durations, gaps and skews add up to"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("far_ranks", [_Pending.FAR_RANKS, 0], ids=["near", "far"])
def test_each_corruption_is_named(
    tmp_path: Path,
    change: Callable[[Rows], None],
    message: str,
    far_ranks: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # far_ranks 0: every comm row waits apart until the scan reaches its group's last member, as
    # a data-parallel group's rows do in a graph of thousands of ranks.
    monkeypatch.setattr(_Pending, "FAR_RANKS", far_ranks)
    report = validate_graph(write_graph(tmp_path / "g.parquet", corrupt(change)))
    assert not report.ok
    assert any(problem.startswith(message) for problem in report.problems), report.problems
    with pytest.raises(GraphValidationError, match="g.parquet: "):
        report.raise_if_failed()


def with_all_to_all(splits: list[int]) -> Rows:
    """The synthetic graph with tp group 0's first collective (65,536 bytes) an all_to_all."""
    rows = graph_rows()
    for rank in (0, 1):
        find(rows, rank, **{gf.COLL_ID: 100}).update({gf.NAME: "all_to_all", gf.SPLIT_BYTES: splits})
    return rows


@pytest.mark.parametrize(
    ("splits", "message"),
    [
        ([40000, 25535], "all_to_all split_bytes of 2 members summing to 65535"),
        ([65536], "all_to_all split_bytes of 1 members summing to 65536"),
        ([70000, -4464], "all_to_all split_bytes of 2 members summing to 65536 (none may be negative)"),
    ],
)
def test_an_all_to_alls_splits_are_one_a_member_summing_to_its_bytes(
    tmp_path: Path, splits: list[int], message: str
) -> None:
    assert validate_graph(write_graph(tmp_path / "ok.parquet", with_all_to_all([40000, 25536]))).ok
    report = validate_graph(write_graph(tmp_path / "g.parquet", with_all_to_all(splits)))
    assert any(message in problem for problem in report.problems), report.problems


def test_splits_on_a_node_that_is_no_all_to_all_are_refused(tmp_path: Path) -> None:
    rows = graph_rows()
    find(rows, 0, **{gf.COLL_ID: 100}).update({gf.SPLIT_BYTES: [32768, 32768]})
    report = validate_graph(write_graph(tmp_path / "g.parquet", rows))
    assert report.problems == ("rank 0 index 1: split_bytes on a node that is no all_to_all",), (
        report.problems
    )


def test_duplicate_send_is_named(tmp_path: Path) -> None:
    rows = graph_rows()
    send = find(rows, 0, **{gf.KIND: "send"})
    find(rows, 0, **{gf.INDEX: 0}).update(
        {**send, gf.INDEX: 0, gf.DEPS: []}
    )  # a second send 0 -> 4, p2p_seq 0
    report = validate_graph(write_graph(tmp_path / "g.parquet", rows))
    assert report.problems == ("send rank 0 -> rank 4 p2p_seq 0 appears 2 times",)


def test_missing_rank_is_named(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "g.parquet", [r for r in graph_rows() if r[gf.RANK] != 5])
    report = validate_graph(path)
    assert "1 of 8 ranks missing: 5" in report.problems
    assert "coll_id 300 (world group 0): rank 5 missing" in report.problems
    assert "coll_id 102 (tp group 2): rank 5 missing" in report.problems
    assert report.ranks == 7


def test_unsorted_rows_are_named(tmp_path: Path) -> None:
    rows = graph_rows()
    at = rows.index(find(rows, 2, **{gf.INDEX: 0}))
    rows[at], rows[at + 1] = rows[at + 1], rows[at]
    report = validate_graph(write_raw(tmp_path / "g.parquet", rows))
    assert report.problems[0] == (
        "rows not sorted by (rank, stream, index): rank 2 stream 0 index 0 follows rank 2 stream 0 index 1"
    )


def test_model_degrees_must_match_the_layout(tmp_path: Path) -> None:
    model = {"tp": 4, "pp": 2, "dp": 2}
    report = validate_graph(write_graph(tmp_path / "g.parquet", model=model))
    assert report.problems == ("metadata model has tp=4, the layout tp=2",)


def test_larger_layout_with_another_order_passes(tmp_path: Path) -> None:
    layout = ParallelLayout(tp=2, pp=3, dp=4, order="pp-tp-dp")
    path = write_graph(tmp_path / "g.parquet", graph_rows(layout), ranks_per_row_group=5, layout=layout,
                       model={})  # fmt: skip
    report = validate_graph(path)
    assert report.ok, report.problems
    assert (report.ranks, report.collectives, report.p2p_pairs) == (24, 12 + 6 + 1, 16)


def test_problems_are_capped_but_counted(tmp_path: Path) -> None:
    rows = [{**r, gf.STAGE: 5} for r in graph_rows()]  # one problem per rank
    report = validate_graph(write_graph(tmp_path / "g.parquet", rows))
    assert report.problem_count == 8 and len(report.problems) == 8


def _wrong_version(path: Path) -> Path:
    return write_raw(
        path,
        graph_rows(),
        json.dumps(json.loads(metadata().to_bytes()) | {"version": gf.VERSION + 1}).encode(),
    )


def test_wrong_version_is_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(GraphFormatError, match=f"graph format version {gf.VERSION + 1} is not supported"):
        validate_graph(_wrong_version(tmp_path / "g.parquet"))


# -- the command line ------------------------------------------------------------------------
runner = CliRunner()


def lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def test_cli_valid_graph_exits_0_with_a_summary(tmp_path: Path) -> None:
    result = runner.invoke(app, [str(write_graph(tmp_path / "g.parquet"))])
    assert result.exit_code == 0, result.output
    assert "collective instances" in result.output and "valid: 8 ranks, 56 nodes" in result.output
    assert not any(line.startswith("error:") for line in lines(result.output))


def test_cli_invalid_graph_exits_2_with_one_error_line_per_problem(tmp_path: Path) -> None:
    path = write_graph(
        tmp_path / "g.parquet",
        corrupt(lambda rows: find(rows, 3, **{gf.COLL_ID: 201}).update({gf.BYTES: 12})),
    )
    result = runner.invoke(app, [str(path)])
    assert result.exit_code == 2
    assert [line for line in lines(result.output) if line.startswith("error:")] == [
        "error: coll_id 201: members disagree on bytes (rank 1: 1048576, rank 3: 12, ...)"
    ]  # fmt: skip


def test_cli_shows_20_problems_then_a_count(tmp_path: Path) -> None:
    layout = ParallelLayout(tp=2, pp=2, dp=8)
    rows = [{**r, gf.STAGE: 7} for r in graph_rows(layout)]
    path = write_graph(tmp_path / "g.parquet", rows, layout=layout, model={})
    result = runner.invoke(app, [str(path)])
    assert result.exit_code == 2
    assert sum(line.startswith("error:") for line in lines(result.output)) == 20
    assert lines(result.output)[-1] == "... and 12 more problems"


def _text_file(path: Path) -> Path:
    path.write_text("not parquet")
    return path


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: p, "no such file"),
        (_text_file, "not a Parquet file"),
        (_wrong_version, f"graph format version {gf.VERSION + 1} is not supported (reads 2, 3, 4, 5, 6, 7)"),
    ],
)
def test_cli_unreadable_file_is_one_error_line(
    tmp_path: Path, make: Callable[[Path], Path], needle: str
) -> None:
    path = make(tmp_path / "g.parquet")
    result = runner.invoke(app, [str(path)])
    assert result.exit_code == 2
    assert len(lines(result.output)) == 1 and lines(result.output)[0].startswith("error: ")
    assert needle in result.output


def test_layout_fixture_is_the_documented_one() -> None:
    assert LAYOUT.world_size == 8


def test_collectives_and_transfers_are_checked_once_the_scan_has_passed_their_ranks(tmp_path: Path) -> None:
    """Memory flat in the world size: a row group's tp collectives and pp transfers are checked
    and dropped as soon as the scan has passed their last member, not kept to the end."""
    path = write_graph(tmp_path / "g.parquet")
    with GraphReader(path) as reader:
        scan = _Scan(ParallelLayout.from_dict(reader.metadata.layout), streams=True)
        for chunk in reader.iter_rank_chunks([*_INTS, *_STRINGS, *_AMOUNTS, gf.DEPS, gf.LANE_DEPS]):
            scan.chunk(chunk)
            passed = scan.last[0] - 1
            kinds = scan.coll.rows.get(gf.GROUP_KIND, np.empty(0))
            tp = kinds == scan.strings.id("tp")
            assert not (scan.coll.until[tp] <= passed).any()
            assert not (scan.p2p.until <= passed).any()
    assert scan.collectives > 0 and scan.p2p_pairs > 0  # some were checked before the end
    assert scan.report(str(path)).ok


def test_a_validator_left_on_an_exception_does_not_wait_for_a_wakeup_a_signal_lost() -> None:
    """A signal raised inside the queue's notify leaves a released waiter at the head of the
    condition's waiters (gh-92530): the next notify wakes that one, not the waiting thread. Left on
    the signal's exception, the validator must return at once rather than join a thread never woken."""
    import threading
    import time

    from prism.graph.io.validate import RowGroupValidator

    validator = RowGroupValidator(LAYOUT, {})
    waiters = validator._queue.not_empty._waiters
    deadline = time.monotonic() + 10
    while not waiters:  # the thread waits for its first row group
        assert time.monotonic() < deadline
        time.sleep(0.01)
    stale = threading.Lock()
    stale.acquire()  # re-acquired by the thread it woke, as after the interrupted notify
    waiters.appendleft(stale)

    def leave_on_a_signal() -> None:
        with pytest.raises(KeyboardInterrupt), validator:
            raise KeyboardInterrupt

    leaving = threading.Thread(target=leave_on_a_signal, daemon=True)
    leaving.start()
    leaving.join(timeout=10)
    assert not leaving.is_alive(), "leaving the validator waited for a thread that is never woken"
