"""What the fuzz tests share: how many examples, the corruptions (a JSON value replaced, a key
dropped, a file cut short, bytes overwritten, one cell of a graph set to another value, a graph's
layout edited to another world than its rows hold), and the property every command must keep."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from prism.graph.io.parquet import GraphReader, GraphWriter
from prism.schemas import graph_format as gf
from tests.graph_files import with_metadata

EXAMPLES = int(os.environ.get("PRISM_FUZZ_EXAMPLES", "25"))


def fuzz(examples: int = 25) -> settings:
    """``examples`` in CI, the same ones every run (derandomized); ``PRISM_FUZZ_EXAMPLES`` scales
    every test's count (25 is CI's) and, above 25, draws fresh ones."""
    return settings(
        max_examples=max(1, examples * EXAMPLES // 25), deadline=None, derandomize=EXAMPLES <= 25,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )  # fmt: skip


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def corrupted_json(draw: st.DrawFn, doc: object) -> bytes:
    """``doc`` with one corruption: a value somewhere replaced or a key dropped, or its text cut."""
    how = draw(st.sampled_from(["replace", "drop", "truncate"]))
    text = json.dumps(doc)
    if how == "truncate":
        return text.encode()[: draw(st.integers(0, max(len(text) - 1, 0)))]
    doc = json.loads(text)  # a copy to change
    parent, key = None, None
    node = doc
    while isinstance(node, dict | list) and node and draw(st.integers(0, 3)) > 0:  # walk down a random path
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        parent, key = node, draw(st.sampled_from(keys))
        node = node[key]
    if parent is None:
        return json.dumps(draw(JSON_VALUES)).encode()
    if how == "drop" and isinstance(parent, dict):
        del parent[key]
    else:
        parent[key] = draw(JSON_VALUES)
    return json.dumps(doc).encode()


@st.composite
def corrupted_bytes(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` cut short, or with a few bytes overwritten."""
    if draw(st.booleans()):
        return data[: draw(st.integers(0, len(data) - 1))]
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        out[draw(st.integers(0, len(out) - 1))] = draw(st.integers(0, 255))
    return bytes(out)


# A graph's cells as a user's edit or another tool could leave them: each column but the sort key.
_INT_BOUNDS = {pa.int16(): 2**15 - 1, pa.int32(): 2**31 - 1, pa.int64(): 2**63 - 1}


def _cell_value(field: pa.Field) -> st.SearchStrategy:
    if pa.types.is_dictionary(field.type):
        return st.sampled_from([k.value for k in gf.NodeKind]) | st.text(max_size=12)
    if pa.types.is_boolean(field.type):
        return st.booleans()
    if field.name == gf.LANE_DEPS:
        entry = st.fixed_dictionaries({
            gf.LANE_DEP_STREAM: st.integers(-2, 8), gf.LANE_DEP_INDEX: st.integers(-3, 5000),
            gf.LANE_DEP_LAG_NS: st.sampled_from([-1, 0, 20_000, 2**62]),
        })  # fmt: skip
        return st.lists(entry, max_size=3)
    if pa.types.is_list(field.type):
        return st.lists(st.integers(-3, 5000), max_size=3)
    top = _INT_BOUNDS[field.type]
    return st.sampled_from([-1, 0, 1, 2, 3, 7, top]) | st.integers(-top - 1, top)


EDITABLE = [f for f in gf.SCHEMA if f.name not in (gf.RANK, gf.STREAM, gf.INDEX)]


@st.composite
def edited_graph(draw: st.DrawFn, source: Path, target: Path) -> str:
    """``source`` with one cell set to another value, written (as prism writes graphs) to ``target``;
    returns what was edited."""
    with GraphReader(source) as reader:
        metadata = reader.metadata
        table = pa.concat_tables(list(reader.iter_rank_chunks()))
    field = draw(st.sampled_from([f for f in EDITABLE if f.name in gf.stored_columns(metadata)]))
    row = draw(st.integers(0, table.num_rows - 1))
    value = draw(_cell_value(field))
    cells = table.column(field.name).to_pylist()
    cells[row] = value
    plain = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
    column = pa.array(cells, type=plain)
    if pa.types.is_dictionary(field.type):
        column = column.dictionary_encode()
    table = table.set_column(table.schema.get_field_index(field.name), field.name, column)
    with GraphWriter(target, metadata) as writer:
        writer.write_ranks(table)
    return f"{field.name}[{row}] = {value!r}"


@st.composite
def edited_metadata(draw: st.DrawFn, source: Path, target: Path) -> str:
    """``source`` (one file) with one corruption of its metadata's JSON (``corrupted_json``: any
    value replaced, a key dropped, the text cut), its rows as they were, written to ``target``;
    returns what was edited."""
    raw = pq.read_schema(source).metadata[gf.METADATA_KEY]
    original = json.dumps(json.loads(raw)).encode()  # corrupted_json's spacing
    edited = draw(corrupted_json(json.loads(raw)))
    table = pq.read_table(source)
    schema = table.schema.with_metadata({**table.schema.metadata, gf.METADATA_KEY: edited})
    pq.write_table(table.cast(schema), target, write_statistics=[gf.RANK])
    at = next(
        (i for i, (a, b) in enumerate(zip(original, edited, strict=False)) if a != b),
        min(len(original), len(edited)),
    )
    return f"metadata edited at byte {at}: ...{edited[max(0, at - 80) : at + 80]!r}..."


@st.composite
def edited_layout(draw: st.DrawFn, source: Path, target: Path) -> str:
    """``source`` (one file) whose metadata's layout has one axis of another size, its rows as
    they were, written to ``target``; returns what was edited."""
    layout = json.loads(pq.read_schema(source).metadata[gf.METADATA_KEY])["layout"]
    axis = draw(st.sampled_from([a for a in ("tp", "pp", "dp") if a in layout]))
    size = draw(st.sampled_from([1, 2, 3, 4, 8, 1024]).filter(lambda n: n != layout[axis]))
    with_metadata(source, target, lambda metadata: metadata["layout"].update({axis: size}))
    return f"layout {axis}={size} (was {layout[axis]})"


def copy_capture(capture: Path, tmp_path: Path) -> Path:
    target = tmp_path / "capture"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(capture, target)
    return target


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def clean_exit(result, out_dir: Path, written: str | None, context: str = "") -> None:
    """The property of every command: exit 0, or exit 2 with an ``error:`` line; never a traceback,
    never a half-written output (``written`` absent after an error, no staged or temporary file)."""
    where = f"{context}\n{result.output}"
    assert result.exit_code in (0, 2), (result.exit_code, where, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), (result.exception, where)
    assert "Traceback" not in result.output, where
    if result.exit_code == 2:
        assert "error:" in result.output, where
        assert written is None or not (out_dir / written).exists(), where
    assert not [p for p in out_dir.iterdir() if p.name.startswith(".")], where
