"""Megatron-core's own process groups (``initialize_model_parallel`` with tensor, context, expert
and pipeline parallelism, in its rank order) are groups of prism's mesh: a program that reduces
over each of them and sends between its stages, captured at 8,192 target ranks, built, and every
call bound to the group Megatron built it on. Megatron's layers need CUDA (benchmarks/gpu_checks.sh
runs its GPT); its groups do not."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prism.graph.export.cli import app as export_app
from prism.schemas import graph_format as gf
from prism.schemas.annotations import group_label
from tests.integration.programs import captured_and_built

pytest.importorskip("megatron.core", reason="needs megatron-core (the test extra)")
pytestmark = pytest.mark.slow

PROGRAM = Path(__file__).resolve().parents[1] / "data" / "programs" / "megatron_groups.py"
AXES = ("--tp", "2", "--cp", "2", "--ep", "2", "--pp", "2")
# Megatron's expert tensor parallel is its tensor parallel unless set: etp 2 as well.
LAYOUT = (*AXES, "--etp", "2", "--dp", "1024")


def test_megatrons_groups_bind_to_the_mesh_at_8192_ranks(tmp_path: Path) -> None:
    _, graph = captured_and_built(tmp_path / "cap", LAYOUT, (str(PROGRAM), *AXES), warmup=3)
    nodes = pq.read_table(
        graph, columns=[gf.RANK, gf.KIND, gf.GROUP_KIND, gf.GROUP_INDEX, gf.GROUP_SIZE]
    ).to_pandas()
    calls = nodes[nodes[gf.KIND] == gf.NodeKind.COLLECTIVE]
    sizes = calls.groupby(calls[gf.GROUP_KIND].astype(str))[gf.GROUP_SIZE].unique()
    # tensor, context (and expert: ranks 2 apart), data (and expert data), data with context,
    # Megatron's model group (tensor x pipeline), its tensor-data-context group, and the first
    # stage's position-embedding group of one rank, labelled by an axis of degree 1.
    assert {k: list(v) for k, v in sizes.items()} == {
        "tp": [2], "cp": [2], "dp": [1024], "dp_cp": [2048], "pp_tp": [4], "dp_cp_tp": [4096],
        "dp_replicate": [1],
    }  # fmt: skip
    # Eight reductions a rank each iteration and one more on each first-stage rank, none lost.
    assert len(calls) == 8 * 8192 + 4096
    # Rank 4099: stage 1, tensor rank 1, context rank 1, data rank 0 (tp fastest, then cp, dp, pp).
    mine = calls[calls[gf.RANK] == 4099].drop_duplicates(gf.GROUP_KIND)
    assert dict(zip(mine[gf.GROUP_KIND].astype(str), mine[gf.GROUP_INDEX].astype(int), strict=True)) == {
        "tp": 2049, "cp": 2049, "dp": 7, "dp_cp": 3, "pp_tp": 1, "dp_cp_tp": 1,
    }  # fmt: skip
    kinds = nodes[gf.KIND].astype(str)
    assert (kinds == gf.NodeKind.SEND).sum() == (kinds == gf.NodeKind.RECV).sum() == 4096
    # Exported for a network simulator, every group a written rank's collectives name is listed
    # with its members, the one-rank group too.
    et = tmp_path / "et"
    result = CliRunner().invoke(export_app, ["chakra", str(graph), "-o", str(et), "--ranks", "3,4099"])
    assert result.exit_code == 0, result.output
    groups = json.loads((et / "comm_group.json").read_text())
    named = calls[calls[gf.RANK].isin([3, 4099])]
    for rank, kind, index in zip(
        named[gf.RANK], named[gf.GROUP_KIND].astype(str), named[gf.GROUP_INDEX], strict=True
    ):
        assert rank in groups[group_label(kind, int(index))]
    (one,) = named[named[gf.GROUP_KIND].astype(str) == "dp_replicate"][gf.GROUP_INDEX].unique()
    assert groups[group_label("dp_replicate", int(one))] == [3]
