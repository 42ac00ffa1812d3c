"""Where a graph's lane dependencies point: one lookup for the loader and the validator."""

from __future__ import annotations

import numpy as np


def lane_dep_rows(
    rank: np.ndarray, stream: np.ndarray, owner: np.ndarray, to_stream: np.ndarray, to_index: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For the ``lane_deps`` entries of rows ``owner`` of a table sorted by (rank, stream, index)
    that holds each of its ranks whole (``rank``, ``stream``: its columns): the row each entry's
    (stream, index) names, and whether that is a node of another stream of the owner's rank (the
    rows are meaningful only there)."""
    key = rank.astype(np.int64) * 65536 + stream
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])  # each (rank, stream) lane's first row
    lanes, lengths = key[starts], np.diff(np.r_[starts, len(key)])
    wanted = key[owner] - stream[owner] + to_stream
    at = np.minimum(np.searchsorted(lanes, wanted), len(lanes) - 1)
    named = (lanes[at] == wanted) & (to_stream != stream[owner]) & (to_index >= 0) & (to_index < lengths[at])
    return starts[at] + to_index, named
