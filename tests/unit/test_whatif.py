"""What-ifs change exactly the timings they name."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_simulate import collective, compute, config, write

from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import simulate
from prism.graph.sim.whatif import (
    BlockDelay,
    SlowRank,
    WhatIf,
    WhatIfError,
    apply_what_if,
    parse_delay,
    parse_duration,
    parse_slow_rank,
)
from prism.schemas import graph_format as gf


def test_parsing() -> None:
    assert parse_duration("+200us") == 200_000 and parse_duration("1.5ms") == 1_500_000
    assert parse_slow_rank("123:+20%") == SlowRank(rank=123, factor=1.2)
    assert parse_slow_rank("7:x2") == SlowRank(rank=7, factor=2.0)
    assert parse_delay("bwd,layer=3:+1ms") == BlockDelay(phase="bwd", layer=3, delay_ns=1_000_000)
    assert parse_delay("fwd:+2us@5") == BlockDelay(phase="fwd", layer=None, delay_ns=2000, rank=5)
    for bad, parse in (("1h", parse_duration), ("x:+1%", parse_slow_rank), ("fwd+1ms", parse_delay)):
        with pytest.raises(WhatIfError):
            parse(bad)


@pytest.mark.parametrize(
    ("bad", "parse"),
    [
        ("0:x0", parse_slow_rank),  # compute that takes no time
        ("0:x0.0", parse_slow_rank),
        ("0:x1.2.3", parse_slow_rank),  # not a number (a float() traceback before)
        ("0:+1..5%", parse_slow_rank),
        ("fwd:+1.2.3ms", parse_delay),
        ("+.ms", parse_duration),
    ],
)
def test_what_ifs_out_of_range_or_not_numbers_are_refused(bad: str, parse) -> None:
    with pytest.raises(WhatIfError):
        parse(bad)


def test_a_slow_rank_made_in_code_is_checked_too() -> None:
    for factor in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(WhatIfError, match="above 0 and finite"):
            SlowRank(rank=3, factor=factor)


def graph(tmp_path: Path):
    cfg = config(tp=2)
    nodes = [
        compute(100, **{gf.PHASE: "fwd", gf.MB: 0}), compute(100, **{gf.PHASE: "fwd", gf.MB: 0}),
        compute(100, **{gf.PHASE: "fwd", gf.MB: 1}), compute(100, **{gf.PHASE: "bwd", gf.MB: 0}),
    ]  # fmt: skip
    programs = [[*nodes, collective(9, 10, 2)] for _ in range(2)]
    path = write(tmp_path / "g.parquet", cfg, programs)
    return path, load_sim_graph(path)


def test_block_delay_is_added_once_per_instance(tmp_path: Path) -> None:
    path, g = graph(tmp_path)
    base = simulate(g, iterations=1).iteration_ns
    delayed = apply_what_if(g, path, WhatIf(delays=(parse_delay("fwd:+1us"),)))
    assert list(simulate(delayed, iterations=1).iteration_ns - base) == [2000, 2000]  # two fwd instances
    one_rank = apply_what_if(g, path, WhatIf(delays=(parse_delay("fwd:+1us@1"),)))
    # rank 0 waits for rank 1 in the final collective: both end 2 us later.
    assert list(simulate(one_rank, iterations=1).iteration_ns - base) == [2000, 2000]
    assert (g.gap == 0).all()  # the original graph is untouched


def test_slow_rank_scales_only_its_compute(tmp_path: Path) -> None:
    path, g = graph(tmp_path)
    slow = apply_what_if(g, path, WhatIf(slow_ranks=(SlowRank(rank=1, factor=1.5),)))
    assert list(simulate(slow, iterations=1).iteration_ns) == [610, 610]
    with pytest.raises(WhatIfError, match="not in the graph"):
        apply_what_if(g, path, WhatIf(slow_ranks=(SlowRank(rank=9, factor=2.0),)))


def test_a_cluster_what_if_prices_async_calls_by_the_compute_they_fly_beside(tmp_path: Path) -> None:
    from dataclasses import replace

    import numpy as np

    from prism.peers.comm_model import CommModel
    from prism.schemas.cluster import preset

    cfg = config(tp=2)
    call = collective(9, 10, 2, **{gf.NAME: "all_reduce", gf.BYTES: 65536, gf.IS_ASYNC: True})
    wait = compute(0, **{gf.DEPS: [0]})
    programs = [
        [call, compute(1000), compute(2000), wait, collective(10, 10, 2, **{gf.NAME: "all_reduce"})]
    ] * 2
    path = write(tmp_path / "g.parquet", cfg, programs)
    g = load_sim_graph(path)
    plain = replace(preset("h100-ib"), name="plain")
    busy = replace(plain, busy_call={"65536": 2.0})
    d = CommModel(plain).duration_ns("all_reduce", 65536, 2, 1)
    priced = apply_what_if(g, path, WhatIf(cluster=busy)).dur
    # In flight beside 3,000 ns of compute, at half its rate: D + 1,500 ns, at most 2 D.
    assert (
        priced.tolist()
        == [min(2 * d, d + 1500), 1000, 2000, 0, CommModel(plain).duration_ns("all_reduce", 0, 2, 1)] * 2
    )
    assert (apply_what_if(g, path, WhatIf(cluster=plain)).dur[[0, 5]] == d).all()
    assert np.array_equal(g.dur[[0, 5]], [10, 10])  # the original is untouched


def test_a_cluster_what_if_prices_an_all_to_all_by_what_crosses_its_nodes(tmp_path: Path) -> None:
    from dataclasses import replace

    import numpy as np

    from prism.peers.comm_model import CommModel
    from prism.schemas.cluster import preset

    # Four ranks, each sending its whole 1 MB to the next member of its group: on nodes of two,
    # ranks 1 and 3 send theirs off the node, ranks 0 and 2 on it.
    relative = [0, 1 << 20, 0, 0]
    programs = [
        [
            collective(
                9,
                10,
                4,
                **{
                    gf.NAME: "all_to_all",
                    gf.GROUP_KIND: "dp",
                    gf.BYTES: 1 << 20,
                    gf.SPLIT_BYTES: list(np.roll(relative, r)),
                },
            )
        ]
        for r in range(4)
    ]
    path = write(tmp_path / "g.parquet", config(dp=4), programs)
    g = load_sim_graph(path)
    pairs = replace(preset("h100-ib"), name="pairs", gpus_per_node=2)
    model = CommModel(pairs)
    by_volume = model.durations_ns(
        "all_to_all", np.array([1 << 20]), np.array([4]), np.array([2]), split_volumes=[[1 << 20, 1 << 20]]
    )
    even = model.duration_ns("all_to_all", 1 << 20, 4, 2)
    assert apply_what_if(g, path, WhatIf(cluster=pairs)).dur.tolist() == [by_volume[0]] * 4
    assert by_volume[0] > even  # a whole megabyte through one NIC, not half of it
