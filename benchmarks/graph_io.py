"""Cost of graph.parquet at full scale: write time, file size, read_rank latency, validation time.

    .venv/bin/python benchmarks/graph_io.py [--tp 8 --pp 16 --dp 64] [--nodes 3000] [--ranks-per-row-group 32]

Builds a synthetic but valid graph (every rank of a stage runs the same ~3000-node program:
forward/backward ops per layer and microbatch with their TP all-reduces, pipeline sends and
recvs, DP bucket all-reduces) with the low entropy of a real one (names, durations and shapes
repeat across ranks), generated and written one row group at a time. Each phase runs in its
own process so that its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import resource
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from prism.graph.io.parquet import GraphReader, GraphWriter, read_rank
from prism.graph.io.validate import validate_graph
from prism.schemas import graph_format as gf
from prism.schemas.graph_format import GraphMetadata
from prism.schemas.layout import ParallelLayout

OPS = [f"aten::{n}" for n in ("mm", "add", "layer_norm", "gelu", "softmax", "dropout", "view", "transpose")]
COLL_SPAN = 1 << 20  # coll_id = (kind * 2**20 + group index) * 2**20 + j-th collective of the rank
STRINGS = (gf.KIND, gf.NAME, gf.PHASE, gf.PART, gf.GROUP_KIND, gf.DTYPE)


def stage_program(stage: int, pp: int, nodes: int, microbatches: int = 16, layers: int = 2) -> dict:
    """One stage's node list as columns; rank-specific values are filled in per rank."""
    rows: list[tuple] = []  # (kind, name, phase, mb, layer, dur_ns, comm: '', tp, dp, next, prev, bytes)
    for phase, ops, recv_from, send_to in (("fwd", 28, "prev", "next"), ("bwd", 53, "next", "prev")):
        for mb in range(microbatches):
            if (recv_from == "prev" and stage > 0) or (recv_from == "next" and stage < pp - 1):
                rows.append(("recv", "recv", phase, mb, -1, 40_000, recv_from, 8 << 20))
            for layer in range(stage * layers, (stage + 1) * layers):
                for k in range(ops):
                    if k in (ops // 2, ops - 1):
                        rows.append(("collective", "all_reduce", phase, mb, layer, 90_000, "tp", 8 << 20))
                    else:
                        rows.append(
                            ("compute", OPS[k % len(OPS)], phase, mb, layer, 20_000 + 1000 * (k % 7), "", 0)
                        )
            if (send_to == "next" and stage < pp - 1) or (send_to == "prev" and stage > 0):
                rows.append(("send", "send", phase, mb, -1, 40_000, send_to, 8 << 20))
    rows += [("collective", "all_reduce", "dp_sync", -1, -1, 2_000_000, "dp", 25 << 20)] * 8
    rows += [
        ("compute", OPS[k % len(OPS)], "optimizer", -1, -1, 5_000, "", 0) for k in range(nodes - len(rows))
    ]
    rows = rows[:nodes]
    cols = {name: np.array(values) for name, values in zip(("kind", "name", "phase", "mb", "layer", "dur", "comm", "bytes"), zip(*rows, strict=True), strict=True)}  # fmt: skip
    comm = cols["comm"]
    cols["coll_j"] = np.where(np.isin(comm, ["tp", "dp"]), np.cumsum(np.isin(comm, ["tp", "dp"])) - 1, -1)
    cols["seq"] = _nth(comm == "next", cols["kind"]) + _nth(comm == "prev", cols["kind"])
    # A node waits on the recv just before it (async recv, then the op that consumes it).
    cols["dep"] = np.r_[-1, np.where(cols["kind"][:-1] == "recv", np.arange(nodes - 1), -1)]
    return cols


def _nth(mask: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """Per send (or recv) to one neighbour, its sequence number; 0 elsewhere (added to another)."""
    out = np.zeros(mask.size, np.int64)
    for k in ("send", "recv"):
        sel = mask & (kind == k)
        out[sel] = np.arange(sel.sum())
    return out


def rank_table(rank: int, layout: ParallelLayout, prog: dict) -> dict[str, np.ndarray]:
    n, comm, stage = prog["kind"].size, prog["comm"], layout.stage(rank)
    tp_g, dp_g, pp_g = (layout.group_index(rank, a) for a in ("tp", "dp", "pp"))
    p2p = np.isin(comm, ["next", "prev"])
    step = layout.stride("pp")
    coll_id = (
        np.where(comm == "tp", tp_g * COLL_SPAN, (1 << 20) * COLL_SPAN + dp_g * COLL_SPAN) + prog["coll_j"]
    )
    return {
        gf.RANK: np.full(n, rank), gf.STREAM: np.zeros(n), gf.INDEX: np.arange(n), gf.STAGE: np.full(n, stage),
        gf.MB: prog["mb"], gf.LAYER: prog["layer"], gf.DUR_NS: prog["dur"], gf.GAP_NS: np.zeros(n),
        gf.SKEW_NS: np.zeros(n),
        gf.COLL_ID: np.where(prog["coll_j"] >= 0, coll_id, -1),
        gf.GROUP_INDEX: np.select([comm == "tp", comm == "dp", p2p], [tp_g, dp_g, pp_g], -1),
        gf.GROUP_SIZE: np.select([comm == "tp", comm == "dp", p2p], [layout.tp, layout.dp, 2], 0),
        gf.PEER: np.select([comm == "next", comm == "prev"], [rank + step, rank - step], -1),
        gf.P2P_SEQ: np.where(p2p, prog["seq"], -1), gf.BYTES: prog["bytes"], gf.IS_ASYNC: p2p,
        gf.ALLOC_BYTES: np.where(prog["kind"] == "compute", 1 << 20, 0), gf.FREE_BYTES: np.zeros(n),
        gf.SRC_RANK: np.full(n, layout.rank(tp=0, dp=0, pp=stage)), gf.SRC_OP: np.arange(n),
    }  # fmt: skip


def string_columns(prog: dict) -> dict[str, pa.DictionaryArray]:
    """A stage's string columns, dictionary-encoded once and shared by all its ranks."""
    group_kind = np.where(np.isin(prog["comm"], ["next", "prev"]), "pp", prog["comm"])
    values = {
        gf.KIND: prog["kind"],
        gf.NAME: prog["name"],
        gf.PHASE: prog["phase"],
        gf.GROUP_KIND: group_kind,
    }
    values |= {gf.PART: np.full(prog["kind"].size, ""), gf.DTYPE: np.where(prog["bytes"] > 0, "bfloat16", "")}
    return {k: pa.array(v).dictionary_encode().cast(gf.SCHEMA.field(k).type) for k, v in values.items()}


def chunk_table(ranks: range, layout: ParallelLayout, programs: list[dict], strings: list[dict]) -> pa.Table:
    parts = [rank_table(r, layout, programs[layout.stage(r)]) for r in ranks]
    cols = {k: pa.array(np.concatenate([p[k] for p in parts]), gf.SCHEMA.field(k).type) for k in parts[0]}
    cols |= {k: pa.chunked_array([strings[layout.stage(r)][k] for r in ranks]) for k in STRINGS}
    deps = np.concatenate([programs[layout.stage(r)]["dep"] for r in ranks])
    offsets = np.r_[0, np.cumsum(deps >= 0)].astype(np.int32)
    cols[gf.DEPS] = pa.ListArray.from_arrays(offsets, pa.array(deps[deps >= 0], pa.int32()))
    names = [c for c in gf.COLUMNS if c in cols]  # one stream a rank: no lane_deps
    return pa.table([cols[c] for c in names], schema=pa.schema([gf.SCHEMA.field(c) for c in names]))


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def phase_write(path: Path, layout: ParallelLayout, nodes: int, per_group: int) -> dict:
    programs = [stage_program(s, layout.pp, nodes) for s in range(layout.pp)]
    strings = [string_columns(p) for p in programs]
    meta = GraphMetadata(layout=layout.to_dict(), model={}, cluster={}, capture_digest="0" * 64,
                         build_options={"benchmark": True}, prism_version="bench")  # fmt: skip
    start, writing = time.perf_counter(), 0.0
    with GraphWriter(path, meta, ranks_per_row_group=per_group) as writer:
        for first in range(0, layout.world_size, per_group):
            table = chunk_table(
                range(first, min(first + per_group, layout.world_size)), layout, programs, strings
            )
            t0 = time.perf_counter()
            writer.write_ranks(table)
            writing += time.perf_counter() - t0
        t0 = time.perf_counter()
    writing += time.perf_counter() - t0  # the last row group and the footer
    return {"total_s": time.perf_counter() - start, "write_s": writing, "rss": peak_rss_mib()}


def phase_read(path: Path, world: int, samples: int = 20) -> dict:
    """Median time to read one rank, three ways, interleaved so that none gets a warmer cache."""
    ranks = random.Random(0).sample(range(world), min(samples, world))
    with GraphReader(path) as reader:
        ways = {
            "read_rank(path, r)": lambda r: read_rank(path, r),
            "pq.read_table(path, filters=rank==r)": lambda r: pq.read_table(
                path, filters=[(gf.RANK, "==", r)]
            ),
            "GraphReader.read_rank(r), file open": reader.read_rank,
        }
        for fn in ways.values():  # imports and first-touch costs out of the way
            fn(ranks[0])
        times: dict[str, list[float]] = {label: [] for label in ways}
        for i, r in enumerate(ranks):
            labels = list(ways)[i % len(ways) :] + list(ways)[: i % len(ways)]
            for label in labels:
                start = time.perf_counter()
                assert ways[label](r).num_rows > 0
                times[label].append(time.perf_counter() - start)
    return {
        "reads": {k: statistics.median(v) for k, v in times.items()},
        "samples": len(ranks),
        "rss": peak_rss_mib(),
    }


def phase_validate(path: Path) -> dict:
    start = time.perf_counter()
    report = validate_graph(path)
    return {"validate_s": time.perf_counter() - start, "ok": report.ok, "problems": report.problems[:3],
            "nodes": report.nodes, "collectives": report.collectives, "rss": peak_rss_mib()}  # fmt: skip


def in_process(fn, *args: object) -> dict:  # noqa: ANN001
    """``fn(*args)`` in a fresh process, so that its peak RSS is its own; its errors raise here."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("tp", 8), ("pp", 16), ("dp", 64), ("nodes", 3000), ("ranks-per-row-group", 32)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary dir)")
    args = parser.parse_args()
    layout = ParallelLayout(tp=args.tp, pp=args.pp, dp=args.dp)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "graph.parquet"
        w = in_process(phase_write, path, layout, args.nodes, args.ranks_per_row_group)
        r = in_process(phase_read, path, layout.world_size)
        v = in_process(phase_validate, path)
        md = pq.read_metadata(path)
        size = path.stat().st_size
    table = Table(title=f"graph.parquet: {layout}, {args.nodes} nodes per rank, {args.ranks_per_row_group} ranks per row group")  # fmt: skip
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("peak RSS (phase)", justify="right")
    table.add_row("rows / row groups", f"{md.num_rows:,} / {md.num_row_groups}", "")
    table.add_row("generate + write", f"{w['total_s']:.1f} s", f"{w['rss']:.0f} MiB")
    table.add_row("  of which GraphWriter", f"{w['write_s']:.1f} s", "")
    table.add_row("file size", f"{size / 2**20:.0f} MiB ({size / md.num_rows:.2f} B/row)", "")
    table.add_row("footer", f"{md.serialized_size / 2**10:.0f} KiB", "")
    for label, seconds in r["reads"].items():
        table.add_row(f"{label}, median of {r['samples']}", f"{seconds * 1e3:.1f} ms", f"{r['rss']:.0f} MiB")
    status = "valid" if v["ok"] else f"INVALID: {v['problems']}"
    table.add_row(f"validate_graph ({status}, {v['collectives']:,} collectives)", f"{v['validate_s']:.1f} s", f"{v['rss']:.0f} MiB")  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    main()
