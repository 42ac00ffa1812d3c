"""The routing-imbalance what-if: which all-to-alls carry tokens, and what a skew does to them and
to the experts' work between them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_simulate import collective, compute, config, write

from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.moe_skew import token_pairs, zipf_shares
from prism.graph.sim.simulate import SimulationError, simulate
from prism.graph.sim.whatif import WhatIf, WhatIfError, apply_what_if
from prism.schemas import graph_format as gf
from prism.schemas.cluster import preset

# Nodes of two: ranks 0 and 1 share one, 2 and 3 the other.
CLUSTER = replace(preset("h100-ib"), name="pairs", gpus_per_node=2)


def all_to_all(coll_id: int, nbytes: int, dur: int) -> dict:
    return collective(
        coll_id,
        dur,
        4,
        **{gf.NAME: "all_to_all", gf.GROUP_KIND: "dp", gf.BYTES: nbytes, gf.SPLIT_BYTES: [nbytes // 4] * 4},
    )


def moe_graph(tmp_path: Path) -> Path:
    """One MoE layer on four ranks: token counts exchanged, tokens dispatched, the experts' work,
    the results combined; then dense work."""
    program = [
        all_to_all(1, 32, 5000),  # the counts
        compute(200),  # split sizes from the counts
        all_to_all(2, 4000, 10_000),  # dispatch
        compute(1000),  # the experts
        all_to_all(3, 4000, 10_000),  # combine
        compute(500),  # dense
    ]
    return write(tmp_path / "g.parquet", config(dp=4), [program] * 4)


def test_a_dispatch_pairs_with_the_next_all_to_all_of_its_group_and_size() -> None:
    lane = np.array([0, 0, 0, 0, 0, 1, 1])
    kind = np.array(["ep"] * 5 + ["ep", "ep"])
    nbytes = np.array([32, 4000, 4000, 32, 4000, 4000, 4000])  # counts, dispatch, combine, counts, ...
    assert token_pairs(lane, kind, nbytes).tolist() == [[1, 2], [5, 6]]  # not across lanes


def test_a_skew_makes_the_first_expert_of_each_group_the_busiest(tmp_path: Path) -> None:
    path = moe_graph(tmp_path)
    g = load_sim_graph(path)
    skewed = apply_what_if(g, path, WhatIf(cluster=CLUSTER, moe_skew=1.0))
    even = apply_what_if(g, path, WhatIf(cluster=CLUSTER))
    dur, base = skewed.dur.reshape(4, 6), even.dur.reshape(4, 6)
    shares = zipf_shares(4, 1.0)  # 12/25 · (1, 1/2, 1/3, 1/4)
    assert np.allclose(shares, np.array([12, 6, 4, 3]) / 25)
    # The experts' work scales with the tokens each member receives: 1.92, 0.96, 0.64, 0.48 of it.
    assert dur[:, 3].tolist() == np.round(1000 * 4 * shares).astype(int).tolist()
    # The counts, the work between them and the dispatch, and the dense work keep their times.
    assert np.array_equal(dur[:, [0, 1, 5]], base[:, [0, 1, 5]])
    # Rank 0 receives 0.48 of 4,000 bytes from each member, 3,840 of them off its node (evenly,
    # each member sends 2,000 off its node): every member's dispatch and combine take longer, alike.
    assert (dur[:, [2, 4]] > base[:, [2, 4]]).all() and len(np.unique(dur[:, [2, 4]])) == 1
    before, after = (simulate(x, iterations=1).iteration_ns.max() for x in (even, skewed))
    assert after > before


def test_no_skew_is_an_even_share_and_a_graph_without_experts_is_refused(tmp_path: Path) -> None:
    path = moe_graph(tmp_path)
    g = load_sim_graph(path)
    # The graph's routing was even: a skew of 0 changes nothing.
    even = apply_what_if(g, path, WhatIf(cluster=CLUSTER))
    assert np.array_equal(apply_what_if(g, path, WhatIf(cluster=CLUSTER, moe_skew=0.0)).dur, even.dur)
    with pytest.raises(WhatIfError, match="0 or more and finite"):
        WhatIf(moe_skew=-0.5)
    dense = write(
        tmp_path / "dense.parquet",
        config(dp=4),
        [[compute(100), collective(1, 10, 4, **{gf.NAME: "all_reduce", gf.GROUP_KIND: "dp"})]] * 4,
    )
    with pytest.raises(ValueError, match="no all-to-all of known splits"):
        apply_what_if(load_sim_graph(dense), dense, WhatIf(cluster=CLUSTER, moe_skew=1.0))


@pytest.mark.parametrize("what_if", [WhatIf(cluster=CLUSTER, moe_skew=1.0), WhatIf(cluster=CLUSTER)])
def test_splits_that_do_not_match_their_group_are_refused_by_every_what_if(
    tmp_path: Path, what_if: WhatIf
) -> None:
    # A damaged dispatch: three splits on a group of four. Read as four, the splits would run
    # into the next node's list and price the call with another call's bytes.
    program = [all_to_all(1, 32, 5000), compute(1000), all_to_all(2, 4000, 10_000)]
    program[2][gf.SPLIT_BYTES] = [1000, 1000, 2000]
    path = write(tmp_path / "g.parquet", config(dp=4), [program] * 4)
    with pytest.raises(SimulationError, match="disagree with its group size"):
        apply_what_if(load_sim_graph(path), path, what_if)
