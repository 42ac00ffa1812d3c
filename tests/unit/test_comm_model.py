"""The α-β comm model and the cluster spec: hand-computed formulas, node spans, TOML, presets."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prism.peers.comm_model import (
    OPS,
    CommModel,
    layout_nodes_spanned,
    nodes_spanned,
    p2p_nodes_spanned,
    single_node_terms,
)
from prism.schemas.cluster import OP_CLASSES, ClusterSpec, ClusterSpecError, preset, preset_names
from prism.schemas.layout import ParallelLayout

# Round numbers so that every expected value below can be checked by hand:
# B_i = 100 GB/s, α_i = 1 µs, B_e = 10 GB/s, α_e = 5 µs, no base latency, all factors 1.
SPEC = ClusterSpec(
    name="test",
    gpus_per_node=8,
    intra_bandwidth_bytes_per_s=100e9,
    intra_latency_s=1e-6,
    inter_bandwidth_bytes_per_s=10e9,
    inter_latency_s=5e-6,
)
MODEL = CommModel(SPEC)
US = 1000  # ns


@pytest.mark.parametrize(
    ("op", "n", "p", "k", "expected_ns"),
    [
        # ring: 2(p-1)α_i + 2(p-1)/p·n/B_i = 14 µs + 140 µs (tree would be 14 + 160)
        ("all_reduce", 8_000_000, 8, 1, 154 * US),
        # (p-1)α_i + (p-1)·n/B_i = 7 µs + 70 µs (n is one shard; the output is 8 MB)
        ("all_gather", 1_000_000, 8, 1, 77 * US),
        # (p-1)α_i + (p-1)/p·n/B_i = 7 µs + 70 µs
        ("reduce_scatter", 8_000_000, 8, 1, 77 * US),
        # (p-1)α_i + n/B_i = 7 + 10
        ("broadcast", 1_000_000, 8, 1, 17 * US),
        ("reduce", 1_000_000, 8, 1, 17 * US),
        # (p-1)α_i + (p-1)·n/B_i = 3 + 30
        ("gather", 1_000_000, 4, 1, 33 * US),
        ("scatter", 1_000_000, 4, 1, 33 * US),
        # g = 8: 7α_i + 8α_e = 47 µs; max(7·n/p/B_i, 8·n/p/B_e) = max(70, 800) µs
        ("all_to_all", 16_000_000, 16, 2, 847 * US),
        # α + n/B on the link: intra 1 + 10, inter 5 + 100
        ("send", 1_000_000, 2, 1, 11 * US),
        ("recv", 1_000_000, 2, 2, 105 * US),
        # latency only: min(ring 2(p-1)α_i, tree 2(g-1)α_i) on one node = 14 µs
        ("barrier", 0, 8, 1, 14 * US),
        # 64 nodes, one member each: tree 2·log2(64)·α_e = 60 µs beats ring 2·63·α_e = 630 µs
        ("barrier", 0, 64, 64, 60 * US),
        # two nodes of 8: B = min(B_i, 8·B_e) = 80 GB/s; ring 2(14α_i + 1α_e) + 2·15/16·n/B
        ("all_reduce", 16_000_000, 16, 2, 38 * US + 375 * US),
    ],
)
def test_hand_computed_durations(op: str, n: int, p: int, k: int, expected_ns: int) -> None:
    assert MODEL.duration_ns(op, n, p, k) == expected_ns


def test_ring_or_tree_whichever_is_cheaper() -> None:
    # A DP group of 64 ranks on 64 nodes (B = 1·B_e = 10 GB/s).
    small = MODEL.duration_ns("all_reduce", 1000, 64, 64)
    assert small == 60 * US + 200  # tree: 2·6·α_e + 2n/B; the ring would pay 2·63·α_e = 630 µs
    large = MODEL.duration_ns("all_reduce", 10**9, 64, 64)
    ring = 630e3 + 2 * 63 / 64 * 1e9 / 10e9 * 1e9
    assert large == round(ring)  # ring: 197.5 ms; the tree would take 200.06 ms
    # One node: the tree has the ring's hop count and more volume, so the ring always wins.
    for n in (0, 10, 10**6, 10**9):
        ring_one_node = 14e3 + 2 * 7 / 8 * n / 100e9 * 1e9
        assert MODEL.duration_ns("all_reduce", n, 8, 1) == round(ring_one_node)


def test_base_latency_and_per_class_factors() -> None:
    spec = ClusterSpec(
        **{
            **SPEC.to_dict(),
            "base_latency_s": 2e-6,
            "bandwidth_efficiency": {"all_gather": 0.5},
            "latency_factor": {"all_gather": 2.0},
        }
    )
    # α_0 + f·(p-1)α_i + (p-1)·n/(e·B_i) = 2 + 14 + 140 µs
    assert CommModel(spec).duration_ns("all_gather", 1_000_000, 8, 1) == 156 * US
    assert CommModel(spec).duration_ns("broadcast", 1_000_000, 8, 1) == 19 * US  # other classes: 1.0


@pytest.mark.parametrize("op", [op for op in OPS if op not in ("send", "recv")])
def test_group_of_one_costs_nothing(op: str) -> None:
    assert MODEL.duration_ns(op, 10**6, 1, 1) == 0


def test_nodes_spanned_by_layout_groups() -> None:
    layout = ParallelLayout(tp=8, pp=16, dp=64)
    tp, dp, pp = (layout_nodes_spanned(layout, axis, 8) for axis in ("tp", "dp", "pp"))
    assert tp.shape == (1024,) and set(tp.tolist()) == {1}  # a TP group is one node
    assert dp.shape == (128,) and set(dp.tolist()) == {64}  # a DP group: one member per node
    assert pp.shape == (512,) and set(pp.tolist()) == {16}
    assert nodes_spanned(layout.group(5, "dp"), 8) == 64
    assert nodes_spanned(list(range(8192)), 8) == 1024


def test_nodes_spanned_helpers() -> None:
    assert nodes_spanned([6, 7, 8], 8) == 2
    assert nodes_spanned(np.array([[0, 1], [7, 8], [8, 24]]), 8).tolist() == [1, 2, 2]
    assert p2p_nodes_spanned(np.array([0, 7, 7]), np.array([1, 8, 7 + 8 * 3]), 8).tolist() == [1, 2, 2]
    with pytest.raises(ValueError):
        nodes_spanned([0, 1], 0)


op_st = st.sampled_from(OPS)


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, int, int]:
    op = draw(op_st)
    if op in ("send", "recv"):
        return op, 2, draw(st.integers(1, 2))
    p = draw(st.integers(1, 4096))
    return op, p, draw(st.integers(1, p))


@given(calls(), st.integers(0, 2**34), st.integers(0, 2**34), st.sampled_from(["test", "h100-ib"]))
def test_monotonic_in_bytes(call: tuple[str, int, int], a: int, b: int, which: str) -> None:
    op, p, k = call
    model = MODEL if which == "test" else CommModel(preset("h100-ib"))
    lo, hi = sorted((a, b))
    assert 0 <= model.duration_ns(op, lo, p, k) <= model.duration_ns(op, hi, p, k)


@given(st.lists(st.tuples(calls(), st.integers(0, 2**32)), min_size=1, max_size=60))
def test_vectorised_equals_scalar(rows: list[tuple[tuple[str, int, int], int]]) -> None:
    ops = np.array([op for (op, _, _), _ in rows])
    p = np.array([p for (_, p, _), _ in rows])
    k = np.array([k for (_, _, k), _ in rows])
    n = np.array([n for _, n in rows])
    vector = MODEL.durations_ns(ops, n, p, k)
    assert vector.dtype == np.int64
    assert vector.tolist() == [MODEL.duration_ns(*row) for row in zip(ops, n, p, k, strict=True)]
    single = MODEL.durations_ns("all_gather", n, p, k)  # one op name for every row
    assert single.tolist() == [MODEL.duration_ns("all_gather", *row) for row in zip(n, p, k, strict=True)]


@pytest.mark.parametrize("op", OPS)
def test_single_node_terms_match_the_model(op: str) -> None:
    """Calibration fits T = f·hops·α + volume/(e·B); the model must agree on one node."""
    spec = ClusterSpec(
        **{
            **SPEC.to_dict(),
            "bandwidth_efficiency": {c: 0.5 for c in OP_CLASSES},
            "latency_factor": {c: 3.0 for c in OP_CLASSES},
        }
    )
    n, p = np.array([0, 4096, 10**6, 10**8]), np.array([2, 4, 8, 2])
    hops, volume = single_node_terms(op, n, p)
    expected = 3.0 * hops * 1e-6 + volume / (0.5 * 100e9)
    assert CommModel(spec).durations_ns(op, n, p, 1).tolist() == np.rint(expected * 1e9).astype(int).tolist()


def test_bad_calls_rejected() -> None:
    with pytest.raises(ValueError, match="unknown comm op"):
        MODEL.duration_ns("allreduce", 10, 2, 1)
    with pytest.raises(ValueError, match="unknown comm op"):
        MODEL.durations_ns(np.array(["all_reduce", "nope"]), np.array([1, 2]), 2, 1)
    with pytest.raises(ValueError, match="nodes_spanned"):
        MODEL.duration_ns("all_reduce", 10, 4, 5)
    with pytest.raises(ValueError, match="group_size"):
        MODEL.duration_ns("all_gather", 10, 0, 1)
    assert MODEL.duration_ns("send", 10, 0, 1) == MODEL.duration_ns("send", 10, 2, 1)  # p unused
    with pytest.raises(ValueError, match="bytes"):
        MODEL.duration_ns("all_reduce", -1, 4, 1)
    with pytest.raises(ValueError, match="send/recv"):
        MODEL.duration_ns("send", 10, 8, 3)


# -- the spec ----------------------------------------------------------------------------------


def test_toml_round_trip(tmp_path) -> None:
    spec = preset("h100-ib")
    assert ClusterSpec.from_toml(spec.to_toml()) == spec
    assert ClusterSpec.from_dict(spec.to_dict()) == spec
    path = spec.save(tmp_path / "sub" / "spec.toml")
    assert ClusterSpec.load(path) == spec
    assert not list(path.parent.glob(".*.tmp"))  # written through a temporary file


@given(
    st.text(min_size=1, max_size=20),
    st.floats(1e-3, 1e15),
    st.floats(0, 1),
    st.dictionaries(st.sampled_from(OP_CLASSES), st.floats(1e-6, 10)),
)
def test_toml_round_trip_of_any_values(name: str, bw: float, lat: float, eff: dict[str, float]) -> None:
    spec = ClusterSpec(
        name=name,
        gpus_per_node=3,
        intra_bandwidth_bytes_per_s=bw,
        intra_latency_s=lat,
        inter_bandwidth_bytes_per_s=bw / 3,
        inter_latency_s=lat * 2,
        bandwidth_efficiency=eff,
        latency_factor=eff,
        notes='quotes " and \\ and\nnewlines',
    )
    assert ClusterSpec.from_toml(spec.to_toml()) == spec


def test_h100_preset_numbers() -> None:
    spec = preset("h100-ib")
    assert spec.gpus_per_node == 8
    assert spec.intra_bandwidth_bytes_per_s == 450e9  # 900 GB/s NVLink, bidirectional
    assert spec.inter_bandwidth_bytes_per_s == 50e9  # 400 Gb/s NDR
    assert 0 < spec.intra_latency_s < spec.inter_latency_s < 1e-5
    assert all(0 < spec.efficiency(c) <= 1 for c in OP_CLASSES)
    assert "h100-ib" in preset_names()


def test_local_preset(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PRISM_LOCAL_CLUSTER", str(tmp_path / "local.toml"))
    with pytest.raises(ClusterSpecError, match="prism-calibrate"):
        preset("local")
    spec = ClusterSpec(**{**SPEC.to_dict(), "name": "local"})
    spec.save(tmp_path / "local.toml")
    assert preset("local") == spec
    with pytest.raises(ClusterSpecError, match="unknown cluster preset"):
        preset("tpu-v5")


GOOD = SPEC.to_toml()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            GOOD.replace("intra_bandwidth_bytes_per_s = 100000000000.0", "intra_bandwidth_bytes_per_s = 0"),
            "positive",
        ),
        (
            GOOD.replace("inter_bandwidth_bytes_per_s = 10000000000.0", "inter_bandwidth_bytes_per_s = -1.0"),
            "positive",
        ),
        (GOOD.replace("intra_latency_s = 1e-06", "intra_latency_s = -1e-06"), "non-negative"),
        (GOOD.replace("gpus_per_node = 8", "gpus_per_node = 0"), "gpus_per_node"),
        (GOOD.replace("gpus_per_node = 8", "gpus_per_node = true"), "gpus_per_node"),
        (GOOD.replace("intra_latency_s = 1e-06", 'intra_latency_s = "fast"'), "finite number"),
        (GOOD.replace("gpus_per_node = 8", "gpus_per_node = 8\nnvlink_gen = 4"), "unknown cluster spec key"),
        (GOOD.replace("gpus_per_node = 8\n", ""), "lacks required key"),
        (GOOD.replace("[latency_factor]", "[latency_factor]\nall_reduce = -1.0"), "non-negative"),
        (GOOD.replace("[wake_compute]", "[wake_compute]\nfast = 0.001"), "whole microseconds"),
        (GOOD.replace("[wake_compute]", "[wake_compute]\n1000 = inf"), "finite number"),
        # Unicode digits that int() refuses: the spec's own error, not a ValueError.
        (GOOD.replace("[wake_compute]", '[wake_compute]\n"²" = 0.001'), "whole microseconds"),
        (GOOD + '\n[measured.gather]\n"²" = [[512, 0.001]]\n', "group sizes of 2 or more"),
        (GOOD.replace("[busy_call]", "[busy_call]\nsmall = 2.0"), "call sizes in bytes"),
        (GOOD.replace("[busy_call]", "[busy_call]\n0 = 2.0"), "call sizes in bytes"),
        (GOOD.replace("[busy_call]", "[busy_call]\n512 = 0"), "must be positive"),
        (GOOD.replace("[busy_call]", "[busy_call]\n512 = inf"), "finite number"),
        ("busy_call = 3\n" + GOOD.replace("[busy_call]\n", ""), "bytes -> factor"),
        (
            GOOD.replace("[bandwidth_efficiency]", "[bandwidth_efficiency]\nallreduce = 0.9"),
            "unknown op class",
        ),
        (GOOD.replace("[bandwidth_efficiency]", "[bandwidth_efficiency]\nall_reduce = 0"), "positive"),
        ("name = ", "not valid TOML"),
    ],
)
def test_bad_specs_rejected(text: str, message: str) -> None:
    with pytest.raises(ClusterSpecError, match=message):
        ClusterSpec.from_toml(text)


def test_busy_factor_interpolates_in_log_bytes_and_never_goes_below_one() -> None:
    spec = replace(SPEC, busy_call={"65536": 3.0, "1048576": 2.0, "16777216": 0.8})
    assert ClusterSpec.from_toml(spec.to_toml()) == spec
    # 262144 is halfway in log2 between 64 KiB and 1 MiB; flat outside; 0.8 floored to 1.
    # 4 MiB: halfway between 1 MiB (2.0) and 16 MiB (0.8).
    assert spec.busy_factor([512, 65536, 262144, 1048576, 4194304, 2**30]).tolist() == pytest.approx(
        [3.0, 3.0, 2.5, 2.0, 1.4, 1.0]
    )
    assert SPEC.busy_factor([512, 2**30]).tolist() == [1.0, 1.0]  # no table: no stretch


def test_a_collective_its_rank_computes_beside_is_stretched_by_processor_sharing() -> None:
    """A price D with factor f: the call runs at 1/f of its rate while its rank computes, at the
    full rate after; at most f·D."""
    spec = replace(SPEC, busy_call={"65536": 3.0})
    model, plain = CommModel(spec), CommModel(SPEC)
    ops = np.array(["all_reduce"] * 4 + ["send", "all_reduce"])
    args = (np.full(6, 65536), np.array([2, 2, 2, 2, 2, 1]), np.ones(6, np.int64))
    d = int(plain.durations_ns("all_reduce", np.array([65536]), np.array([2]), np.array([1]))[0])
    overlap = np.array([0, 3 * d // 2, 3 * d, 100 * d, 100 * d, 100 * d])
    busy = model.durations_ns(ops, *args, overlap_ns=overlap)
    # D + overlap·(1 − 1/3): 1.5 D of compute -> 2 D; 3 D and more -> capped at 3 D.
    assert busy[:4].tolist() == [d, 2 * d, 3 * d, 3 * d]
    assert busy[4] == plain.durations_ns(ops, *args)[4]  # a transfer: not a collective's threads
    assert busy[5] == 0  # a group of one costs nothing
    assert (model.durations_ns(ops, *args) == plain.durations_ns(ops, *args)).all()  # no overlap given


def test_an_earlier_versions_cold_call_tables_are_read_and_ignored() -> None:
    old = GOOD + "\n[cold_call]\n500 = -0.0001\n4000 = 0.0004\n\n[cold_call_by_size.65536]\n500 = -0.0003\n"
    assert ClusterSpec.from_toml(old) == SPEC
    assert "cold_call" not in SPEC.to_toml()


# -- measured points ---------------------------------------------------------------------------

# All-reduce of two on one node as a 2-core VM measures it: 512 B slower than 64 KiB.
MEASURED = replace(
    SPEC,
    measured={
        "all_reduce": {2: ((512, 1.7e-3), (65536, 1.2e-3), (1048576, 2.2e-3))},
        "p2p": {2: ((65536, 3e-4),)},
    },
)


def test_measured_points_price_one_node_calls_by_interpolation() -> None:
    model = CommModel(MEASURED)
    cost = {n: model.duration_ns("all_reduce", n, 2, 1) for n in (0, 512, 65536, 557056, 1048576)}
    # Flat below the first point, exact at points, linear in bytes between them.
    assert cost == {0: 1_700_000, 512: 1_700_000, 65536: 1_200_000, 557056: 1_700_000, 1048576: 2_200_000}
    # Past the last point it grows by the α-β line's slope (ring of 2: n/B = 10 µs per MB).
    line = CommModel(SPEC)
    growth = line.duration_ns("all_reduce", 9_048_576, 2, 1) - line.duration_ns("all_reduce", 1048576, 2, 1)
    assert model.duration_ns("all_reduce", 9_048_576, 2, 1) == 2_200_000 + growth == 2_280_000
    # p2p within a node uses its table; send and recv are one class.
    assert model.duration_ns("send", 65536, 2, 1) == model.duration_ns("recv", 65536, 2, 1) == 300_000


def test_measured_points_leave_other_groups_on_the_line() -> None:
    model, line = CommModel(MEASURED), CommModel(SPEC)
    for call in [
        ("all_reduce", 65536, 4, 1),  # a group size the table lacks
        ("all_reduce", 65536, 2, 2),  # across nodes
        ("send", 65536, 2, 2),
        ("all_gather", 65536, 2, 1),  # an op class the table lacks
        ("all_reduce", 65536, 1, 1),  # a group of one still costs nothing
    ]:
        assert model.duration_ns(*call) == line.duration_ns(*call), call
    # Vectorised over mixed rows as per row.
    ops = np.array(["all_reduce", "send", "all_reduce", "all_reduce"])
    n, p, k = np.array([512, 65536, 65536, 512]), np.array([2, 2, 4, 2]), np.array([1, 1, 1, 2])
    rows = [
        model.duration_ns(*row) for row in zip(ops.tolist(), n.tolist(), p.tolist(), k.tolist(), strict=True)
    ]
    assert model.durations_ns(ops, n, p, k).tolist() == rows


def test_measured_table_round_trips_and_bad_tables_are_rejected() -> None:
    assert ClusterSpec.from_toml(MEASURED.to_toml()) == MEASURED
    assert ClusterSpec.from_dict(MEASURED.to_dict()) == MEASURED
    assert "[measured.all_reduce]\n2 = [[512, 0.0017]" in MEASURED.to_toml()
    for table, message in [
        ({"allreduce": {2: [(4, 1e-3)]}}, "unknown op class"),
        ({"all_reduce_tree": {2: [(4, 1e-3)]}}, "unknown op class"),
        ({"all_reduce": {1: [(4, 1e-3)]}}, "group sizes of 2 or more"),
        ({"all_reduce": {2: []}}, "non-empty list"),
        ({"all_reduce": {2: [(4, 1e-3, 7)]}}, r"\[bytes, seconds\]"),
        ({"all_reduce": {2: [(4.5, 1e-3)]}}, "non-negative integer"),
        ({"all_reduce": {2: [(4, -1e-3)]}}, "non-negative"),
        ({"all_reduce": {2: [(4, 1e-3), (4, 2e-3)]}}, "once"),
        ({"all_reduce": [(4, 1e-3)]}, "table of group size"),
    ]:
        with pytest.raises(ClusterSpecError, match=message):
            replace(SPEC, measured=table)


def test_an_all_to_all_of_known_splits_is_priced_by_its_volumes_on_and_off_node() -> None:
    # The 16 MB all_to_all above, g = 8: even shares put 8 MB off the node (800 µs). Sent all to
    # its node's members, 16 MB over NVLink: 160 µs; all off it, 1,600 µs; latency 47 µs either way.
    calls = dict(
        op="all_to_all", bytes=np.full(3, 16_000_000), group_size=np.full(3, 16), nodes_spanned=np.full(3, 2)
    )
    even = [7e6, 8e6]  # (g-1)/p·n and (p-g)/p·n: what the even line assumes
    volumes = np.array([[16e6, 0.0], [0.0, 16e6], even])
    assert MODEL.durations_ns(**calls, split_volumes=volumes).tolist() == [207 * US, 1647 * US, 847 * US]
    # Unknown splits (NaN) and calls of other ops keep the even line.
    unknown = np.full((3, 2), np.nan)
    assert MODEL.durations_ns(**calls, split_volumes=unknown).tolist() == [847 * US] * 3
    assert (
        MODEL.durations_ns(
            "all_gather",
            np.array([1_000_000]),
            np.array([8]),
            np.array([1]),
            split_volumes=np.array([[1e9, 1e9]]),
        )[0]
        == 77 * US
    )
