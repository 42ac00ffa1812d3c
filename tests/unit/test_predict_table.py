"""The stage table prism-build-graph and prism-simulate print."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from prism.graph.sim.predict import predict, stage_table

TINY = Path(__file__).parents[1] / "data" / "tiny_graph.parquet"


def test_every_cell_sits_under_its_named_column() -> None:
    summary = predict(TINY)
    table = stage_table(summary, "tiny")
    headers = [str(c.header) for c in table.columns]
    assert all(headers) and len(headers) == 9  # a row longer than the header adds unnamed columns
    column = {h: [str(cell) for cell in c.cells] for h, c in zip(headers, table.columns, strict=True)}
    stages = np.unique(summary.ranks["stage"])
    assert column["stage"] == [str(s) for s in stages]
    iteration_ns = np.asarray(summary.ranks["iteration_ns"])
    on = np.asarray(summary.ranks["stage"]) == stages[0]
    assert float(column["iter ms (median)"][0]) == round(float(np.median(iteration_ns[on])) / 1e6, 2)
    for share in ("compute", "overhead", "exposed comm", "bubble"):
        assert all(cell.endswith("%") for cell in column[share]), share
    peak = np.asarray(summary.ranks["peak_bytes"])[on].max() / 2**20
    assert float(column["peak MiB (max)"][0]) == round(peak, 1)
