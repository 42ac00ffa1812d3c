"""How ``graph.parquet`` is laid out on disk: row groups, part files, encoding (shared by the
writer and the reader; the format itself is declared in ``prism.schemas.graph_format``)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from prism.schemas.graph_format import INDEX, RANK, SCHEMA, STAGE, STREAM

COMPRESSION = "zstd"
# Statistics only where they prune: every row group holds every stream, index and op name, so
# their min/max would only grow the footer that each read_rank parses.
STATISTICS_COLUMNS = [RANK, STAGE]
SORTING = [pq.SortingColumn(SCHEMA.get_field_index(c)) for c in (RANK, STREAM, INDEX)]
# Parquet dictionaries only for the string columns: the integer columns repeat with every rank of
# a stage, which zstd finds as well, and building their dictionaries halved the writer's speed
# (6-9 against 12-14 M rows/s, files 1.36 against 1.18 bytes a node, on the default graph).
DICTIONARY_COLUMNS = [f.name for f in SCHEMA if pa.types.is_dictionary(f.type)]
RANKS_PER_ROW_GROUP = 32
ROW_GROUPS_PER_FILE = 512
"""A reader parses the whole footer of a file, about 1.6 KiB a row group: one-shot reads of a
rank of a 131,072-rank graph took 10-12 ms (median) from files of 512 row groups of 32 ranks,
16-17 ms from files of 1,024, most of the difference the footer. A graph of more row groups
is a directory of part files of this many each (16,384 ranks by default)."""


class GraphFormatError(ValueError):
    """A file that is not a prism graph of the version this code reads."""
