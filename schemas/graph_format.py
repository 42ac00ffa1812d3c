"""``graph.parquet``: the full-scale execution graph, one row per node (an op instance on one rank).

Rows are sorted by (rank, stream, index) and written in row groups of consecutive ranks, so
that reading one rank prunes every other row group. A rank's streams are its lanes of
execution: stream 0 its main CPU thread, then (in a graph of GPU ranks) its other CPU threads
and its GPU streams. Program order is the row order within (rank, stream); ``deps`` lists extra
dependencies on earlier nodes of the same (rank, stream) (a wait on earlier asynchronous
transfers), ``lane_deps`` dependencies on nodes of the rank's other streams, each with a lag (a
kernel on the call that launched it, a stream on another's event, a synchronizing call on the
GPU work it waits for). Cross-rank dependencies are implicit: collective nodes of one instance
share a ``coll_id``; the n-th send from rank a to rank b meets the n-th recv at b from a
(``p2p_seq``).

File-level metadata (key ``prism``) is a JSON object: see ``GraphMetadata``. A graph of more
ranks than one file holds quickly is a directory of part files (``PartInfo``), each a graph file
of consecutive ranks with the same metadata.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa

from prism.schemas.checked import check_fields

SCHEMA_NAME = "prism.graph"
VERSION = 7
READABLE_VERSIONS = (2, 3, 4, 5, 6, 7)
"""Version 7 adds ``RANK_VARIANTS_KEY``, ranks of a stage that run another captured rank's program;
version 6 added ``split_bytes``, the bytes an all-to-all sends each member; version 5 added the N-dimensional layout (cp, dp_replicate, ep, etp in ``layout``) and its group
kinds in ``group_kind``; version 4 added streams beyond the main thread and ``lane_deps``; version
3 graphs of the user's own programs (``PROGRAM_KEY``, ``STATIC_BYTES_KEY``). Earlier files read
unchanged."""
METADATA_KEY = b"prism"
PROGRAM_KEY = "program"
"""Key of ``GraphMetadata.model`` for a graph of the user's own program (its ``ProgramSpec``)."""
TIME_SCALE_KEY = "time_scale"
"""Key of ``GraphMetadata.extra``: the profiler correction applied to each captured rank, or None."""
STATIC_BYTES_KEY = "stage_static_bytes"
"""Key of ``GraphMetadata.extra``: bytes a rank of each stage holds across iterations, measured at
capture (a program's) or from the parameters its role's captured rank held (a graph of other layers
than the captured ones: ``prism.graph.build.retarget``)."""
RANK_VARIANTS_KEY = "rank_variants"
"""Key of ``GraphMetadata.extra`` for a program's graph: the stages whose ranks past the first on
one axis run another captured rank's program (``prism.schemas.rank_programs.RankVariant``, as
dicts); absent or empty where every rank runs its stage's."""
STEADY_FROM_KEY = "steady_from"
"""Key of ``GraphMetadata.extra`` for a program's graph: the first iteration from which the
program's calls are the graph's (the latest over its captured ranks; before it, set-up and
one-time calls). A replay co-simulates from there."""
REPLICA_OF_KEY = "replica_of"
"""Key of ``GraphMetadata.extra``: for each data-parallel replica (the ranks of one dp index), the
first replica whose nodes it repeats position for position (itself when none does). A reader
may then read the representatives alone (``prism.graph.sim.folded``). Absent: not recorded."""
TRACES_KEY = "traces"
"""Key of ``GraphMetadata.model`` for a graph built from Kineto traces (``--from-traces``): the
directory, the ProfilerStep built, and each traced rank's file."""
RECORDED_STEP_KEY = "recorded_step_ns"
"""Key of ``GraphMetadata.extra`` for a graph built from traces: each traced rank's ProfilerStep
as the trace recorded it, ns (what its simulation is to reproduce)."""
STREAMS_KEY = "streams"
"""Key of ``GraphMetadata.extra`` for a graph whose ranks have several streams: the name of each
stream number, the same on every rank ("main thread", "thread 2", "cuda stream 7", ...)."""
CAPTURED_LAYOUT_KEY = "captured_layout"
"""Key of ``GraphMetadata.build_options`` for a program's graph built at another data-parallel
degree or pipeline depth than captured (``prism.graph.build.resized_groups``): the captured
layout, as ``layout``."""
RECEIVED_VALUES_KEY = "received_values"
"""Key of ``GraphMetadata.extra`` for a pipelined program's graph: per stage (a string key), the
base64 of its value-pass file (``prism.schemas.received_values``), so that a replay of the
graph gives the program the values its neighbours send without the capture directory."""


class NodeKind(enum.StrEnum):
    """What a node does."""

    COMPUTE = "compute"  # CPU/GPU work of the rank itself; takes dur_ns
    COLLECTIVE = "collective"  # starts when every member of coll_id has arrived
    SEND = "send"  # pipeline transfer to ``peer``
    RECV = "recv"  # pipeline transfer from ``peer``


WAIT_NAME = "prism:wait"
"""``name`` of a zero-cost compute node that waits for asynchronous calls."""
POST_NAME = "prism:post"
"""``name`` of a compute node right after an asynchronous call on CPU: the host time the call
took the program's thread (the post), which the comm model does not price."""


# Column names: every reader and writer uses these constants.
RANK = "rank"
STREAM = "stream"
INDEX = "index"
KIND = "kind"
NAME = "name"
PHASE = "phase"
STAGE = "stage"
MB = "mb"
LAYER = "layer"
PART = "part"
DUR_NS = "dur_ns"
GAP_NS = "gap_ns"
SKEW_NS = "skew_ns"
COLL_ID = "coll_id"
GROUP_KIND = "group_kind"
GROUP_INDEX = "group_index"
GROUP_SIZE = "group_size"
PEER = "peer"
P2P_SEQ = "p2p_seq"
BYTES = "bytes"
DTYPE = "dtype"
IS_ASYNC = "is_async"
ALLOC_BYTES = "alloc_bytes"
FREE_BYTES = "free_bytes"
DEPS = "deps"
SRC_RANK = "src_rank"
SRC_OP = "src_op"
LANE_DEPS = "lane_deps"
SPLIT_BYTES = "split_bytes"
LANE_DEP_STREAM, LANE_DEP_INDEX, LANE_DEP_LAG_NS = "stream", "index", "lag_ns"

NONE = -1
"""Integer columns use -1 for 'does not apply' (no microbatch, no peer, ...)."""

_DICT = pa.dictionary(pa.int32(), pa.string())
LANE_DEP = pa.struct(
    [
        pa.field(LANE_DEP_STREAM, pa.int16(), nullable=False),
        pa.field(LANE_DEP_INDEX, pa.int32(), nullable=False),
        pa.field(LANE_DEP_LAG_NS, pa.int64(), nullable=False),
    ]
)
"""One dependency on a node of another stream of the same rank: its (stream, index), and the ns
after its end the dependent node may start at the earliest (a launch latency; 0 for most)."""

SCHEMA = pa.schema(
    [
        pa.field(RANK, pa.int32(), nullable=False),  # global rank in the target layout
        pa.field(STREAM, pa.int16(), nullable=False),  # 0: the rank's main CPU thread
        pa.field(INDEX, pa.int32(), nullable=False),  # program order within (rank, stream)
        pa.field(KIND, _DICT, nullable=False),  # NodeKind
        pa.field(NAME, _DICT, nullable=False),  # op name, e.g. aten::mm or all_reduce
        pa.field(PHASE, _DICT, nullable=False),  # annotation phase of the block (fwd, bwd, ...)
        pa.field(STAGE, pa.int16(), nullable=False),  # pipeline stage of the rank
        pa.field(MB, pa.int32(), nullable=False),  # microbatch, or -1
        pa.field(LAYER, pa.int32(), nullable=False),  # global layer, or -1
        pa.field(PART, _DICT, nullable=False),  # embed / head / loss, or ""
        pa.field(DUR_NS, pa.int64(), nullable=False),  # compute: measured; comm: cost model
        pa.field(GAP_NS, pa.int64(), nullable=False),  # idle time before the node after its predecessor
        pa.field(
            SKEW_NS, pa.int64(), nullable=False
        ),  # collectives: expected wait for the last member, else 0
        pa.field(COLL_ID, pa.int64(), nullable=False),  # collective instance, or -1
        pa.field(GROUP_KIND, _DICT, nullable=False),  # a layout kind (tp, dp_cp, ...), world, or ""
        pa.field(GROUP_INDEX, pa.int32(), nullable=False),  # index of the group along its axis, or -1
        pa.field(GROUP_SIZE, pa.int32(), nullable=False),  # members of the group (2 for p2p), or 0
        pa.field(PEER, pa.int32(), nullable=False),  # other rank of a send/recv, or -1
        pa.field(P2P_SEQ, pa.int32(), nullable=False),  # n-th transfer between (src, dst), or -1
        pa.field(BYTES, pa.int64(), nullable=False),  # payload of comm nodes, 0 otherwise
        pa.field(
            SPLIT_BYTES, pa.list_(pa.int64()), nullable=False
        ),  # all_to_all: bytes sent to each member, in group order (summing to bytes); else []
        pa.field(DTYPE, _DICT, nullable=False),  # payload dtype, or ""
        pa.field(IS_ASYNC, pa.bool_(), nullable=False),  # completion does not block program order
        pa.field(ALLOC_BYTES, pa.int64(), nullable=False),  # bytes allocated by the node
        pa.field(FREE_BYTES, pa.int64(), nullable=False),  # bytes freed by the node
        pa.field(DEPS, pa.list_(pa.int32()), nullable=False),  # indices (same rank, stream) it waits on
        pa.field(SRC_RANK, pa.int32(), nullable=False),  # captured rank the node was taken from
        pa.field(SRC_OP, pa.int64(), nullable=False),  # op of the captured rank's table it copies
        pa.field(
            LANE_DEPS, pa.list_(LANE_DEP), nullable=False
        ),  # nodes of the rank's other streams it waits on
    ]
)

COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)
ADDED_IN = {LANE_DEPS: 4, SPLIT_BYTES: 6}
"""Columns later than the first readable version: a file of an earlier version lacks them, and a
reader gives them their empty value (``empty_lists``: no lane dependency, no known splits)."""
LANE_COLUMNS = (LANE_DEPS,)
"""Held only by a graph whose metadata names several streams a rank (``STREAMS_KEY``): a graph
of one stream a rank has no lane dependency to hold, and leaves them out (readers give them
their empty value), which keeps its writes and reads as fast as before they existed."""


@dataclass(frozen=True, kw_only=True)
class GraphMetadata:
    """File-level facts of a graph (stored as JSON under the ``prism`` metadata key)."""

    layout: dict
    """Target layout: tp, pp, dp, order."""
    model: dict
    """Workload of the target job: the built-in workload's record at the target's shape
    (``prism.schemas.workload``), or ``{"program": ProgramSpec}``."""
    cluster: dict
    """Cluster spec the comm durations were computed with."""
    capture_digest: str
    """sha256 of the capture's manifest.json."""
    build_options: dict
    """Options of the build (microbatches, layers, ...)."""
    prism_version: str
    """prism version that built the graph."""
    schema: str = SCHEMA_NAME
    """Always 'prism.graph'."""
    version: int = VERSION
    """Graph format version."""
    extra: dict = field(default_factory=dict)
    """Facts of the build: ``time_scale``, the profiler correction of each captured role, or None."""

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> GraphMetadata:
        """The metadata of ``data`` (ValueError or TypeError, one line, for anything else)."""
        values = json.loads(data)
        if not isinstance(values, dict):
            raise ValueError(f"the graph's metadata is a JSON {type(values).__name__}, not an object")
        if values.get("schema") != SCHEMA_NAME:
            raise ValueError(f"not a prism graph (schema={values.get('schema')!r})")
        if values.get("version") not in READABLE_VERSIONS:
            raise ValueError(
                f"graph format version {values.get('version')!r} is not supported "
                f"(reads {', '.join(map(str, READABLE_VERSIONS))})"
            )
        metadata = cls(**values)
        check_fields(metadata, "metadata ")  # a dict where a dict belongs, and so on
        return metadata


def stored_columns(metadata: GraphMetadata) -> tuple[str, ...]:
    """The columns a file of this metadata holds (``LANE_COLUMNS`` only where it names streams)."""
    lanes = STREAMS_KEY in metadata.extra
    return tuple(c for c in COLUMNS if lanes or c not in LANE_COLUMNS)


def schema_with_metadata(metadata: GraphMetadata) -> pa.Schema:
    """The schema of a file of this metadata: its ``stored_columns``, the metadata attached."""
    stored = stored_columns(metadata)
    return pa.schema([f for f in SCHEMA if f.name in stored]).with_metadata(
        {METADATA_KEY: metadata.to_bytes()}
    )


def empty_lists(column: str, rows: int) -> pa.ListArray:
    """A list column (one of ``ADDED_IN``) of ``rows`` nodes, every list empty: no lane dependency
    (a rank of one stream), no known all-to-all splits (a file before the column existed)."""
    kind = SCHEMA.field(column).type
    offsets = pa.py_buffer(np.zeros(rows + 1, np.int32))  # every list empty; no copy
    return pa.Array.from_buffers(kind, rows, [None, offsets], children=[pa.array([], kind.value_type)])


PART_KEY = b"prism.part"
"""Schema metadata key of each file of a graph split into parts: its ``PartInfo`` as JSON."""
PART_NAME = "ranks-{first:07d}-{last:07d}.parquet"
"""File name of a part in the graph's directory: its first and last rank."""
PART_PATTERN = re.compile(r"ranks-(\d+)-(\d+)\.parquet")


@dataclass(frozen=True)
class PartInfo:
    """Where one part file sits in its graph: the ranks it holds and the global row of its first
    node, so that one rank is read, and numbered, from its part alone."""

    first_rank: int
    ranks: int
    first_row: int
    """Nodes of every rank before ``first_rank`` (the global row of this part's first node)."""
    parts: int
    """Part files of the graph."""

    @property
    def name(self) -> str:
        return PART_NAME.format(first=self.first_rank, last=self.first_rank + self.ranks - 1)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> PartInfo:
        values = json.loads(data)
        if not isinstance(values, dict) or set(values) != {f for f in cls.__dataclass_fields__}:
            raise ValueError(f"part metadata {values!r} is not a PartInfo")
        if not all(type(v) is int and v >= 0 for v in values.values()):
            raise ValueError(f"part metadata {values!r} holds a value that is not a count")
        return cls(**values)
