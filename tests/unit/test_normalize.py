"""normalize_rank on small synthetic captures: Kineto trace, ET and comm log written here."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest

from prism.graph.build import op_table as T
from prism.graph.build.normalize import (
    ITERATION_END,
    NormalizeError,
    baseline_bytes,
    block_signatures,
    et_join_coverage,
    normalize_capture,
    normalize_rank,
)
from prism.schemas.comm_log import CommCall, CommGroup, CommLog, write_comm_log
from prism.schemas.manifest import CaptureFiles

END = ITERATION_END
RANK = 5
TID = 100
BASE_NS = 1_700_000_000_000_000_000
LOG_BEHIND_NS = 20_000
TP_GROUP = CommGroup(name="g-tp", label="tp.0", ranks=(4, 5), real_ranks=(5,))


@dataclass
class Capture:
    """Builder of one rank's files; times are µs after BASE_NS, as Kineto writes them."""

    root: Path
    events: list[dict] = field(default_factory=list)
    et_nodes: list[tuple[int, list, list]] = field(default_factory=list)
    groups: list[CommGroup] = field(default_factory=lambda: [TP_GROUP])
    calls: list[CommCall] = field(default_factory=list)
    _rf: int = 0

    def op(self, name: str, ts: float, dur: float, *, tid: int = TID, et: bool = True) -> int:
        self._rf += 1
        self.events.append(_span(name, "cpu_op", ts, dur, tid, self._rf))
        if et:
            self.et_nodes.append((self._rf, [[2, 3]], [f"Tensor({name})"]))
        return self._rf

    def mark(self, name: str, ts: float, dur: float, *, tid: int = TID) -> None:
        self._rf += 1
        self.events.append(_span(name, "user_annotation", ts, dur, tid, self._rf))

    def comm(
        self, ts: float, dur: float, gseq: int, *, group: CommGroup = TP_GROUP, op: str = "all_reduce",
        waited_at: float | None = None, named: bool = True,
    ) -> None:  # fmt: skip
        """A call whose log is on a clock 20 µs behind the trace's; ``waited_at``: where the
        program waited for it, in the trace's µs; ``named``: its mark names its process group
        (as the backend writes it), else only its label (as older captures did)."""
        pg = f"|pg={group.name}" if named else ""
        self.mark(f"prism:comm|op={op}|group={group.label}{pg}|gseq={gseq}|bytes=64", ts, dur)
        enter = BASE_NS + int(ts * 1000) - LOG_BEHIND_NS
        self.calls.append(
            CommCall(
                seq=len(self.calls),
                op=op,
                group=group.name,
                label=group.label,
                group_size=len(group.ranks),
                gseq=gseq,
                bytes=64,
                dtype="float32",
                shape=(16,),
                async_op=op == "send",
                peer=4 if op == "send" else None,
                enter_ns=enter,
                exit_ns=enter + int(dur * 1000) + 30_000,
                first_wait_ns=0 if waited_at is None else BASE_NS + int(waited_at * 1000) - LOG_BEHIND_NS,
            )
        )

    def memory(self, ts: float, nbytes: int, total: int) -> None:
        args = {"Total Allocated": total, "Bytes": nbytes, "Device Id": -1, "Device Type": 0}
        self.events.append({"ph": "i", "name": "[memory]", "pid": 1, "tid": TID, "ts": ts, "args": args})

    def write(self, *, torch_layout: bool = True) -> Path:
        files = CaptureFiles(self.root)
        for path in (files.kineto(RANK), files.et(RANK), files.comm(RANK)):
            path.parent.mkdir(parents=True, exist_ok=True)
        trace = {"schemaVersion": 1, "baseTimeNanoseconds": BASE_NS, "traceEvents": self.events}
        files.kineto(RANK).write_bytes(gzip.compress(json.dumps(trace).encode()))
        files.et(RANK).write_text(_et_text(self.et_nodes, torch_layout))
        write_comm_log(
            CommLog(rank=RANK, world_size=8, groups=tuple(self.groups), calls=tuple(self.calls)),
            files.comm(RANK),
        )
        return self.root


def _span(name: str, cat: str, ts: float, dur: float, tid: int, rf: int) -> dict:
    args = {"External id": rf + 1000, "Record function id": rf}
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _et_text(nodes: list[tuple[int, list, list]], torch_layout: bool) -> str:
    """An ET in torch's line layout, or the same content as plain json.dumps."""
    empty = {"values": [], "shapes": [], "types": [], "strides": []}
    items = [
        {"id": i + 2, "name": "op", "ctrl_deps": 1, "inputs": {**empty, "shapes": shapes, "types": types},
         "outputs": empty, "attrs": [{"name": "rf_id", "type": "uint64", "value": rf}, {"name": "seq_id", "value": -1}]}
        for i, (rf, shapes, types) in enumerate(nodes)
    ]  # fmt: skip
    if not torch_layout:
        return json.dumps({"schema": "1.1.1-chakra.0.0.4", "nodes": items, "finish_ts": 9})
    body = ",\n".join(
        "      {\n"
        f'        "id": {n["id"]}, "name": "op", "ctrl_deps": 1,\n'
        f'        "inputs": {json.dumps(n["inputs"])},\n'
        f'        "outputs": {json.dumps(n["outputs"])},\n'
        f'        "attrs": [{",".join(json.dumps(a) for a in n["attrs"])}]\n'
        "      }"
        for n in items
    )
    head = '{\n  "schema": "1.1.1-chakra.0.0.4", "pid": 1, "start_ts": 1,\n  "nodes": [\n'
    return head + body + '\n  ],\n  "finish_ts": 9\n}'


def ops(df: pd.DataFrame) -> pd.DataFrame:
    """The table without its iterations' end units."""
    return df[df[T.NAME] != END].reset_index(drop=True)


def ns(us: float) -> int:
    return BASE_NS + round(us * 1000)


@pytest.fixture
def cap(tmp_path: Path) -> Capture:
    return Capture(root=tmp_path / "capture")


def test_top_level_ops_in_iterations_only(cap: Capture) -> None:
    cap.op("aten::before", 1, 2)  # outside every iteration: ignored
    cap.mark("prism:iter|iter=3", 10, 100)
    cap.op("aten::linear", 12, 20)
    cap.op("aten::t", 13, 2)  # nested: part of aten::linear
    cap.op("aten::addmm", 16, 10)
    cap.op("aten::relu", 40, 5.5)
    cap.mark("prism:iter|iter=4", 120, 50)
    cap.op("aten::mul", 125, 4)
    df = normalize_rank(cap.write(), RANK)
    T.check_op_table(df)
    # Each iteration ends with a unit from its last op to the end of its mark.
    assert df[T.NAME].tolist() == ["aten::linear", "aten::relu", END, "aten::mul", END]
    assert df[T.ITERATION].tolist() == [3, 3, 3, 4, 4]
    assert df[T.SEQ].tolist() == [0, 1, 2, 3, 4]
    assert df[T.START_NS].tolist() == [ns(12), ns(40), ns(45.5), ns(125), ns(129)]
    assert df[T.DUR_NS].tolist() == [20_000, 5_500, 64_500, 4_000, 41_000]
    # The first unit of an iteration counts its gap from the iteration mark.
    assert df[T.GAP_NS].tolist() == [2_000, 8_000, 0, 5_000, 0]
    assert (df[T.PHASE] == "iter").all() and (df[T.RANK] == RANK).all()
    assert not df[T.IS_COMM].any()


def test_fractional_timestamps_stay_exact_ns(cap: Capture) -> None:
    cap.mark("prism:iter|iter=0", 4463270010090.254, 1000)
    cap.op("aten::mm", 4463270010090.257, 0.123)
    df = ops(normalize_rank(cap.write(), RANK))
    assert df[T.START_NS].tolist() == [BASE_NS + 4463270010090257]
    assert df[T.DUR_NS].tolist() == [123] and df[T.GAP_NS].tolist() == [3]


def test_comm_mark_absorbs_its_ops_and_joins_the_log(cap: Capture) -> None:
    cap.mark("prism:iter|iter=0", 0, 100)
    cap.op("aten::add", 1, 2)
    cap.comm(10, 8, gseq=7)
    cap.op("aten::copy_", 11, 3)  # the backend's own work: absorbed
    df = ops(normalize_rank(cap.write(), RANK))
    assert df[T.NAME].tolist() == ["aten::add", "all_reduce"]
    comm = df.iloc[1]
    assert comm[T.IS_COMM] and comm[T.COMM_OP] == "all_reduce" and comm[T.DUR_NS] == 8_000
    assert (comm[T.GROUP_NAME], comm[T.GROUP_LABEL], comm[T.GROUP_SIZE]) == ("g-tp", "tp.0", 2)
    assert (comm[T.GSEQ], comm[T.BYTES], comm[T.DTYPE], comm[T.PEER]) == (7, 64, "float32", -1)
    assert not comm[T.IS_ASYNC] and comm[T.ET_INPUT_SHAPES] == ""
    plain = df.iloc[0]
    assert (plain[T.COMM_OP], plain[T.GSEQ], plain[T.PEER], plain[T.GROUP_NAME]) == ("", -1, -1, "")


def test_where_the_program_waited_is_on_the_traces_clock(cap: Capture) -> None:
    cap.mark("prism:iter|iter=0", 0, 100)
    cap.comm(10, 8, gseq=0, waited_at=50)
    cap.op("aten::add", 30, 30)
    cap.comm(70, 8, gseq=1)
    df = ops(normalize_rank(cap.write(), RANK))
    assert df[T.FIRST_WAIT_NS].tolist() == [ns(50), 0, 0]  # within aten::add, as the program was


def test_op_wrapping_a_comm_is_opened(cap: Capture) -> None:
    # _ReduceFromTP (an autograd Function) around the tensor-parallel all-reduce.
    cap.mark("prism:iter|iter=0", 0, 100)
    cap.op("_ReduceFromTP", 10, 40)
    cap.op("aten::contiguous", 11, 2)
    cap.comm(15, 20, gseq=0)
    cap.op("aten::view", 40, 3)
    cap.op("aten::as_strided", 41, 1)
    df = ops(normalize_rank(cap.write(), RANK))
    assert df[T.NAME].tolist() == ["aten::contiguous", "all_reduce", "aten::view"]
    assert df[T.GAP_NS].tolist() == [11_000, 2_000, 5_000]


def test_an_op_straddling_a_calls_start_does_not_hide_the_call(cap: Capture) -> None:
    # A dispatch mode's op (spmd types' PythonDispatchMode) begins the collective it dispatches
    # and closes before the call returns: the call is still a unit, the op's time a gap.
    cap.mark("prism:iter|iter=0", 0, 100)
    cap.op("_AllGatherShard", 10, 50)
    cap.op("aten::empty", 11, 2)
    cap.op("PythonDispatchMode", 14, 6)
    cap.comm(16, 20, gseq=0, op="all_gather")
    cap.op("aten::view", 40, 3)
    df = ops(normalize_rank(cap.write(), RANK))
    assert df[T.NAME].tolist() == ["aten::empty", "all_gather", "aten::view"]
    assert df[T.GAP_NS].tolist() == [11_000, 3_000, 4_000]


def test_innermost_mark_sets_each_field(cap: Capture) -> None:
    cap.mark("prism:iter|iter=0", 0, 1000)
    cap.mark("prism:bwd|stage=1|mb=3", 10, 500)
    cap.op("aten::ones_like", 12, 2)
    cap.mark("prism:bwd|stage=1|mb=3|layer=9", 20, 100)
    cap.op("aten::mm", 30, 10)
    cap.comm(50, 5, gseq=0)
    cap.mark("prism:send|dir=bwd|stage=1|mb=3|peer=4", 600, 50)
    cap.comm(610, 5, gseq=1, op="send")
    cap.mark("prism:grad_sync|bucket=2", 700, 50)
    cap.op("aten::div_", 710, 5)
    cap.op("aten::zero_", 800, 5)
    df = ops(normalize_rank(cap.write(), RANK)).set_index(T.SEQ)
    fields = [T.PHASE, T.STAGE, T.MB, T.LAYER, T.PART, T.BUCKET, T.DIR]
    assert df[fields].values.tolist() == [
        ["bwd", 1, 3, -1, "", -1, ""],
        ["bwd", 1, 3, 9, "", -1, ""],
        ["bwd", 1, 3, 9, "", -1, ""],
        ["send", 1, 3, -1, "", -1, "bwd"],
        ["grad_sync", -1, -1, -1, "", 2, ""],
        ["iter", -1, -1, -1, "", -1, ""],
    ]
    assert df.loc[3, T.PEER] == 4 and df.loc[3, T.IS_ASYNC]


def test_runs_of_one_phase_in_a_row_are_told_apart_by_their_outermost_mark(cap: Capture) -> None:
    cap.mark("prism:iter|iter=0", 0, 1000)
    for start in (10, 200):  # two runs of the engine, nothing between them
        cap.mark("prism:bwd", start, 190)
        cap.mark("prism:bwd|layer=0", start + 5, 100)
        cap.op("aten::mm", start + 10, 10)
        cap.op("aten::add_", start + 150, 10)
    cap.op("aten::zero_", 800, 5)
    df = ops(normalize_rank(cap.write(), RANK)).set_index(T.SEQ)
    outer = df[T.OUTER_MARK].tolist()
    assert outer[0] == outer[1] != outer[2] == outer[3] and outer[0] >= 0 and outer[2] >= 0
    assert outer[4] == -1  # inside no mark
    assert df[T.PHASE].tolist() == ["bwd"] * 4 + ["iter"]


def test_op_straddling_a_hook_mark_belongs_to_the_mark_holding_its_end(cap: Capture) -> None:
    # Gradient hooks close layer 3 and open layer 2 a few µs into layer 2's first autograd op.
    cap.mark("prism:iter|iter=0", 0, 1000)
    cap.mark("prism:bwd|stage=1|mb=0", 10, 500)
    cap.op("autograd::engine::evaluate_function: AddBackward0", 20, 50)
    cap.mark("prism:bwd|stage=1|mb=0|layer=3", 28, 117)  # opens inside the op above
    cap.op("autograd::engine::evaluate_function: MmBackward0", 80, 40)
    cap.op("autograd::engine::evaluate_function: AddBackward0", 125, 50)
    # Closing layer 3 and opening layer 2 are two Python calls apart: the op's midpoint (150)
    # falls between the two marks; its end is in layer 2.
    cap.mark("prism:bwd|stage=1|mb=0|layer=2", 160, 100)
    df = ops(normalize_rank(cap.write(), RANK))
    assert df[T.LAYER].tolist() == [3, 3, 2]
    assert df[T.PHASE].tolist() == ["bwd"] * 3


def test_backward_on_an_autograd_device_thread_is_merged_in_time(cap: Capture) -> None:
    # On CUDA the autograd engine runs backward on a device thread while the caller waits.
    cap.mark("prism:iter|iter=0", 0, 1000)
    cap.op("aten::linear", 10, 20)
    cap.mark("prism:bwd|stage=0|mb=0", 50, 300)
    cap.mark("prism:bwd|stage=0|mb=0|layer=0", 62, 100, tid=200)
    cap.op("autograd::engine::evaluate_function: MmBackward0", 60, 50, tid=200)
    cap.op("aten::mm", 70, 10, tid=200)
    cap.op("aten::copy_", 65, 10, tid=300)  # a helper thread with no autograd work: not training
    cap.op("aten::add_", 400, 5)
    df = ops(normalize_rank(cap.write(), RANK))
    assert df[T.NAME].tolist() == [
        "aten::linear",
        "autograd::engine::evaluate_function: MmBackward0",
        "aten::add_",
    ]
    assert df[T.TID].tolist() == [TID, 200, TID]
    assert df[T.LAYER].tolist() == [-1, 0, -1] and df[T.PHASE].tolist() == ["iter", "bwd", "iter"]
    assert df[T.GAP_NS].tolist() == [10_000, 30_000, 290_000]


def test_memory_events_split_into_units_and_gaps(cap: Capture) -> None:
    cap.memory(1, 100, 100)  # before the iteration
    cap.mark("prism:iter|iter=0", 10, 100)
    cap.memory(11, 50, 150)  # gap before the first unit
    cap.op("aten::empty", 20, 10)
    cap.memory(21, 1000, 1150)
    cap.memory(25, -100, 1050)
    cap.memory(35, -1000, 50)  # Python freed a tensor between two ops
    cap.op("aten::add", 40, 10)
    cap.memory(45, 8, 58)
    cap.memory(70, 8, 66)  # after the last op: the iteration's end
    cap.mark("prism:iter|iter=1", 200, 100)
    cap.op("aten::mul", 210, 10)
    cap.memory(211, 30, 96)  # a temporary, freed inside the op, then the result
    cap.memory(213, -30, 66)
    cap.memory(215, 20, 86)
    df = normalize_rank(cap.write(), RANK)
    assert df[T.NAME].tolist() == ["aten::empty", "aten::add", END, "aten::mul", END]
    # Each unit: how far the total rose at its highest, and fell from there by its end.
    assert df[T.ALLOC_BYTES].tolist() == [1000, 8, 8, 30, 0]
    assert df[T.FREE_BYTES].tolist() == [100, 0, 0, 10, 0]
    assert df[T.GAP_ALLOC_BYTES].tolist() == [50, 0, 0, 0, 0]
    assert df[T.GAP_FREE_BYTES].tolist() == [0, 1000, 0, 0, 0]
    assert df[T.ALLOC_TOTAL_AT_START].tolist() == [150, 50, 58, 66, 86]
    assert baseline_bytes(df, 0) == 100 and baseline_bytes(df, 1) == 66
    with pytest.raises(KeyError):
        baseline_bytes(df, 7)


@pytest.mark.parametrize("torch_layout", [True, False])
def test_et_join_by_record_function_id(cap: Capture, torch_layout: bool) -> None:
    cap.mark("prism:iter|iter=0", 0, 100)
    rf = cap.op("aten::mm", 1, 2)
    cap.op("aten::lost", 5, 2, et=False)
    cap.comm(10, 5, gseq=0)
    df = ops(normalize_rank(cap.write(torch_layout=torch_layout), RANK))
    assert df[T.RF_ID].iloc[0] == rf
    assert df[T.ET_INPUT_SHAPES].tolist() == ["[[2,3]]", "", ""]
    assert df[T.ET_INPUT_TYPES].tolist() == ['["Tensor(aten::mm)"]', "", ""]
    assert et_join_coverage(df) == 0.5 and df.attrs["et_join_coverage"] == 0.5


def test_block_signatures_compare_instances(cap: Capture) -> None:
    cap.mark("prism:iter|iter=0", 0, 1000)
    for mb, t0 in enumerate((10, 100)):
        cap.mark(f"prism:fwd|stage=0|mb={mb}|layer=1", t0, 50)
        cap.op("aten::linear", t0 + 1, 10)
        cap.op("aten::gelu", t0 + 20, 10)
    cap.mark("prism:fwd|stage=0|mb=2|layer=1", 200, 50)
    cap.op("aten::linear", 201, 10)
    sig = block_signatures(normalize_rank(cap.write(), RANK))
    sig = sig[sig[T.MB] >= 0]  # the iteration's end is a unit of no block
    assert sig[T.MB].tolist() == [0, 1, 2]
    assert sig["units"].tolist() == [2, 2, 1]
    assert sig["names"].iloc[0] == ("aten::linear", "aten::gelu")
    s = sig["signature"].tolist()
    assert s[0] == s[1] != s[2]


# -- errors --------------------------------------------------------------------------------------
def _simple(cap: Capture) -> Path:
    cap.mark("prism:iter|iter=0", 0, 100)
    cap.comm(10, 5, gseq=0)
    return cap.write()


@pytest.mark.parametrize("which", ["kineto", "et", "comm"])
def test_missing_file(cap: Capture, which: str) -> None:
    root = _simple(cap)
    path = getattr(CaptureFiles(root), which)(RANK)
    path.unlink()
    with pytest.raises(NormalizeError, match=f"{path}: file is missing"):
        normalize_rank(root, RANK)


@pytest.mark.parametrize(
    ("which", "data", "message"),
    [
        ("kineto", b"not gzip at all", "cannot read"),
        ("kineto", gzip.compress(b'{"traceEvents": [ {', mtime=0), "not valid JSON"),
        ("comm", b"{", "not valid JSON"),
        ("comm", b'{"schema": "other"}', "not a readable comm log"),
        ("et", b'{"nodes": [', "not valid JSON"),
    ],
)
def test_corrupt_file(cap: Capture, which: str, data: bytes, message: str) -> None:
    root = _simple(cap)
    path = getattr(CaptureFiles(root), which)(RANK)
    path.write_bytes(data)
    with pytest.raises(NormalizeError, match=f"{path}: {message}"):
        normalize_rank(root, RANK)


def test_trace_without_iteration_marks(cap: Capture) -> None:
    cap.op("aten::mm", 1, 2)
    with pytest.raises(NormalizeError, match="no prism:iter marks"):
        normalize_rank(cap.write(), RANK)


def test_comm_mark_without_log_entry(cap: Capture) -> None:
    root = _simple(cap)
    cap.calls.clear()
    cap.write()
    with pytest.raises(
        NormalizeError, match=r"comm\.json: no call for trace mark 'prism:comm\|op=all_reduce"
    ):
        normalize_rank(root, RANK)


def test_two_groups_of_one_label_are_told_apart_by_name(cap: Capture) -> None:
    # Megatron makes several groups of the same ranks (data parallel, and its distributed
    # optimizer's), and reduces alike on each: label, call number, op and bytes all match.
    twin = CommGroup(name="g-twin", label="tp.0", ranks=(4, 5), real_ranks=(5,))
    cap.groups.append(twin)
    cap.mark("prism:iter|iter=0", 0, 100)
    cap.comm(10, 5, gseq=0)
    cap.comm(20, 5, gseq=0, group=twin)
    df = ops(normalize_rank(cap.write(), RANK))
    assert df[T.GROUP_NAME].tolist() == ["g-tp", "g-twin"]
    assert df[T.START_NS].is_monotonic_increasing


def test_marks_of_an_older_capture_are_resolved_by_op_and_bytes_or_refused(cap: Capture) -> None:
    twin = CommGroup(name="g-twin", label="tp.0", ranks=(4, 5), real_ranks=(5,))
    cap.groups.append(twin)
    cap.mark("prism:iter|iter=0", 0, 100)
    cap.comm(10, 5, gseq=0, named=False)
    cap.comm(20, 5, gseq=0, group=twin, op="send", named=False)  # same label and gseq, other op
    df = ops(normalize_rank(cap.write(), RANK))
    assert df[T.GROUP_NAME].tolist() == ["g-tp", "g-twin"]
    cap.calls[1] = CommCall(**{**cap.calls[1].__dict__, "op": "all_reduce"})
    cap.events[-1]["name"] = cap.events[-1]["name"].replace("op=send", "op=all_reduce")
    with pytest.raises(NormalizeError, match="matches calls of several groups"):
        normalize_rank(cap.write(), RANK)


def test_empty_iteration_gives_an_empty_table(cap: Capture) -> None:
    cap.mark("prism:iter|iter=0", 0, 100)
    df = normalize_rank(cap.write(), RANK)
    assert df.empty and list(df.columns) == list(T.COLUMNS)
    T.check_op_table(df)
    assert isinstance(block_signatures(df), pd.DataFrame)


def test_capture_without_manifest(tmp_path: Path) -> None:
    with pytest.raises(NormalizeError, match="manifest.json is missing"):
        normalize_capture(tmp_path)
