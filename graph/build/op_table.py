"""The op table: one row per unit of a captured rank's training thread, in program order.

``prism.graph.build.normalize.normalize_rank`` writes it; the graph builder reads it. A *unit* is a
top-level cpu_op of the training thread or one process-group call (a ``prism:comm`` mark, the
backend's own ops inside it absorbed). Every reader and writer uses the names below.

Absent values are -1 for integer columns and "" for string columns, so that every column has
one plain dtype (no nullable integers, no NaN in strings).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

# -- identity and timing -----------------------------------------------------------------------
RANK = "rank"  # captured global rank
ITERATION = "iteration"  # training iteration, from the enclosing prism:iter mark
SEQ = "seq"  # 0.. program order within the rank across its profiled iterations
NAME = "name"  # op name; the comm op (e.g. 'all_reduce') for comm units
TID = "tid"  # thread the unit ran on (the main thread, or the autograd thread on CUDA)
START_NS = "start_ns"  # absolute wall time: baseTimeNanoseconds + ts * 1000
DUR_NS = "dur_ns"  # duration of the unit
GAP_NS = "gap_ns"  # start minus the end of the previous unit (or the iteration start), less held time; >= 0
IS_COMM = "is_comm"  # True for a process-group call

# -- enclosing marks (innermost mark that sets each field) -------------------------------------
PHASE = "phase"  # fwd/bwd/send/recv/p2p_wait/grad_sync/optim; 'iter' inside no other mark
STAGE = "stage"
MB = "mb"
LAYER = "layer"
PART = "part"  # embed / head / loss
BUCKET = "bucket"
DIR = "dir"  # pipeline transfer direction, fwd / bwd
OUTER_MARK = "outer_mark"  # the outermost mark holding the unit, numbered in the rank's trace; -1 in none

# -- comm fields (from the comm log; absent for compute units) --------------------------------
COMM_OP = "comm_op"
GROUP_NAME = "group_name"  # torch.distributed group name (unique per process)
GROUP_LABEL = "group_label"  # layout label such as 'tp.3'
GROUP_SIZE = "group_size"
GSEQ = "gseq"  # per-group sequence number of the call
BYTES = "bytes"  # payload bytes this rank contributes (recv: receives)
DTYPE = "dtype"
PEER = "peer"  # global rank of the other side of send/recv/broadcast
IS_ASYNC = "is_async"  # CommCall.async_op
FIRST_WAIT_NS = "first_wait_ns"  # CommCall.first_wait_ns, on the trace's clock (0: not waited on)
SPLIT_BYTES = "split_bytes"  # all_to_all: JSON list, bytes to the member d places after this rank
BUFFER = "buffer"  # send / recv: address of the payload's storage (CommCall.buffer; 0: not known)
POST_NS = "post_ns"  # derived by the build: an async transfer's post, host time run after its call

# -- memory (one device: the accelerator when the trace has its events, else the CPU) ---------
ALLOC_BYTES = "alloc_bytes"  # how far allocated bytes rise inside the unit's span, at their highest
FREE_BYTES = "free_bytes"  # how far they fall from there by the unit's end (positive number)
GAP_ALLOC_BYTES = "gap_alloc_bytes"  # allocated in the gap before the unit (between ops)
GAP_FREE_BYTES = "gap_free_bytes"  # freed in the gap before the unit
ALLOC_TOTAL_AT_START = "alloc_total_at_start"  # allocator's Total Allocated just before the unit

# -- Execution Trace join ----------------------------------------------------------------------
RF_ID = "rf_id"  # Kineto args['Record function id'] (= ET attr rf_id)
ET_INPUT_SHAPES = "et_input_shapes"  # JSON of the ET node's inputs.shapes; "" when not joined
ET_INPUT_TYPES = "et_input_types"  # JSON of the ET node's inputs.types; "" when not joined

# Column order of the table, with its pandas dtype.
DTYPES: dict[str, str] = {
    RANK: "int64",
    ITERATION: "int64",
    SEQ: "int64",
    NAME: "object",
    TID: "int64",
    START_NS: "int64",
    DUR_NS: "int64",
    GAP_NS: "int64",
    IS_COMM: "bool",
    PHASE: "object",
    STAGE: "int64",
    MB: "int64",
    LAYER: "int64",
    PART: "object",
    BUCKET: "int64",
    DIR: "object",
    OUTER_MARK: "int64",
    COMM_OP: "object",
    GROUP_NAME: "object",
    GROUP_LABEL: "object",
    GROUP_SIZE: "int64",
    GSEQ: "int64",
    BYTES: "int64",
    DTYPE: "object",
    PEER: "int64",
    IS_ASYNC: "bool",
    FIRST_WAIT_NS: "int64",
    SPLIT_BYTES: "object",
    BUFFER: "int64",
    ALLOC_BYTES: "int64",
    FREE_BYTES: "int64",
    GAP_ALLOC_BYTES: "int64",
    GAP_FREE_BYTES: "int64",
    ALLOC_TOTAL_AT_START: "int64",
    RF_ID: "int64",
    ET_INPUT_SHAPES: "object",
    ET_INPUT_TYPES: "object",
}
COLUMNS: tuple[str, ...] = tuple(DTYPES)

# The fields of the enclosing marks, in key order; strings are "" when absent, ints -1.
MARK_INT_FIELDS: tuple[str, ...] = (STAGE, MB, LAYER, BUCKET)
MARK_STR_FIELDS: tuple[str, ...] = (PART, DIR)

# What identifies one block instance, and what makes two instances of the same kind.
BLOCK_KEY: tuple[str, ...] = (ITERATION, PHASE, MB, LAYER, PART, BUCKET, DIR)


def _arrow_type(dtype: str) -> pa.DataType:
    return {"int64": pa.int64(), "bool": pa.bool_(), "object": pa.string()}[dtype]


ARROW_SCHEMA: pa.Schema = pa.schema([pa.field(c, _arrow_type(t), nullable=False) for c, t in DTYPES.items()])


def empty_op_table() -> pd.DataFrame:
    """A table with every column and no rows."""
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in DTYPES.items()})


def check_op_table(df: pd.DataFrame) -> None:
    """Raise ValueError when ``df`` lacks a column or has one of the wrong dtype."""
    for column, dtype in DTYPES.items():
        if column not in df.columns:
            raise ValueError(f"op table lacks column {column!r}")
        if df[column].dtype != np.dtype(dtype):
            raise ValueError(f"op table column {column!r} has dtype {df[column].dtype}, expected {dtype}")


def to_arrow(df: pd.DataFrame) -> pa.Table:
    """The op table as an Arrow table with ``ARROW_SCHEMA`` (extra columns dropped)."""
    return pa.Table.from_pandas(df[list(COLUMNS)], schema=ARROW_SCHEMA, preserve_index=False)
