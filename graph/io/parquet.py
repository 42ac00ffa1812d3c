"""Write and read ``graph.parquet``, the format declared in ``prism.schemas.graph_format``.

Rows are sorted by (rank, stream, index) and every row group holds a fixed number of
consecutive ranks, so one rank is read by decoding one row group, found by binary search over
the ``rank`` statistics of the footer. Every reader parses the whole footer of a file, so a file
holds at most ``ROW_GROUPS_PER_FILE`` row groups: a larger graph is a directory of part files
(``graph/io/parts.py``), and reading one rank opens only its part. Writing is deterministic: the
same tables and metadata give byte-identical files (under the same pyarrow version, whose name is
in the footer).

This module is where callers import from: ``writer.py`` writes, ``reader.py`` reads, and
``file_layout.py`` holds what both follow on disk.
"""

from __future__ import annotations

from prism.graph.io.file_layout import RANKS_PER_ROW_GROUP, ROW_GROUPS_PER_FILE, GraphFormatError
from prism.graph.io.reader import GraphReader, iter_rank_chunks, read_metadata, read_rank
from prism.graph.io.writer import GraphWriter

__all__ = [
    "RANKS_PER_ROW_GROUP",
    "ROW_GROUPS_PER_FILE",
    "GraphFormatError",
    "GraphReader",
    "GraphWriter",
    "iter_rank_chunks",
    "read_metadata",
    "read_rank",
]
