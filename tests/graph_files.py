"""Graph files edited as no prism writer would: for the tests that show a reader refuses them."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prism.schemas import graph_format as gf


def with_metadata(
    source: Path, target: Path, edit: Callable[[dict], None], *, ranks: Sequence[int] | None = None
) -> Path:
    """``source`` (one file), its rows of ``ranks`` (all by default), its metadata's JSON changed
    in place by ``edit``, written to ``target`` with the rank statistics a reader prunes by."""
    table = pq.read_table(source)
    if ranks is not None:
        table = table.filter(pc.is_in(table[gf.RANK], pa.array(list(ranks), pa.int32())))
    metadata = json.loads(table.schema.metadata[gf.METADATA_KEY])
    edit(metadata)
    schema = table.schema.with_metadata(
        {**table.schema.metadata, gf.METADATA_KEY: json.dumps(metadata).encode()}
    )
    pq.write_table(table.cast(schema), target, write_statistics=[gf.RANK])
    return target
