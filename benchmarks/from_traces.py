"""Graphs built from GPU traces (``prism-build-graph --from-traces``) against the traces' own steps.

    .venv/bin/python benchmarks/from_traces.py [DIR ...] [--fetched benchmarks/traces]

For each directory of Kineto traces (default: the public GPU traces of tests/data/gpu_traces, a
directory per job, and those ``benchmarks/fetch_traces.py`` fetched), builds the graph of the
last ProfilerStep every trace holds (of a trace without one, its whole window), simulates it
as ``prism-simulate`` does, and prints per traced rank the step as recorded and as simulated,
and the end of the step's GPU work as the trace's own timeline puts it and as simulated: first
with the launch and stream delays fitted on each trace, then with delays fitted on none of the
job's traces (``held_out_delays``: the other jobs of its GPU family, else the whole corpus).
Then each job of several traced ranks is built from one of them alone and its other ranks
predicted (``cross_rank_table``), and the public traces that are not GPU timelines are listed
with the line that refuses them.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from fetch_traces import LIST, read_list  # the fetched traces' list (a script beside this one)
from fetch_traces import OUT as FETCHED
from rich.console import Console
from rich.table import Table

from prism.graph.build.from_traces import TracedRank, TraceGraphError, as_one_step, build_from_traces
from prism.graph.io.parquet import read_rank
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.predict import predict
from prism.graph.sim.simulate import SimGraph, SimResult, simulate
from prism.graph.traces.gpu import read_gpu_trace
from prism.graph.traces.gpu_timeline import LaunchModel, simulate_timeline, step_times
from prism.graph.traces.kineto import NormalizeError
from prism.schemas import graph_format as gf

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpu_traces"
WHOLE = {  # traces recorded without torch.profiler's schedule: each built whole (--whole-trace)
    "simple add on one A100": ["a100_simple_add.json.gz"],
    "simple add on one A100, its Execution Trace run": ["a100_simple_add_et_run.json.gz"],
    "inference rank, 2021 trace format": ["inference_rank1_legacy.json.gz"],
    "AlexNet on one A100, two streams": ["alexnet.json.gz"],
    "three streams with event waits": ["event_sync_multi_stream.json.gz"],
}
JOBS = {
    "one GPU, stream/event/device syncs": ["event_sync.json.gz"],
    "rank 0 of a 2-rank NCCL DDP job": ["nccl_ddp_rank0.json.gz"],
    "ranks 0 and 1 of a 128-rank job": ["sampled_rank0.json.gz", "sampled_rank1.json.gz"],
    "AMD MI250 (ROCm 6.2), MLP step": ["amd_mi250_rocm.json.gz"],
    "8-rank DLRM job, V100": [f"dlrm_rank{r}.json.gz" for r in range(8)],
    "rank 3 of an 8-rank A100 job": ["a100_rank3_of_8.json.gz"],
    "rank 0 of a 16-rank A100 job": ["a100_rank0_of_16.json.gz"],
    "rank 0 of a V100 job, epoch times": ["v100_epoch_times.json.gz"],
    "ResNet-50 on a V100, 2021 trace format": ["v100_resnet50_legacy.json.gz"],
    "MLP training step, one H200": ["h200_mlp.json.gz"],
    "4x wider MLP step, one H200": ["h200_mlp_wide.json.gz"],
    "a Triton kernel on one A100": ["a100_triton.json.gz"],
    "rank 1 of a 2-rank V100 job": ["v100_rank1_of_2.json.gz"],
    "trace_compare excerpt, before": ["excerpts/compare_base.json.gz"],
    "trace_compare excerpt, after": ["excerpts/compare_test.json.gz"],
    **WHOLE,
}


def _job_dirs(root: Path, fetched: Path) -> dict[str, Path]:
    """A directory of each job's traces: the kept ones, then the fetched ones that are there."""
    jobs = {name: [DATA / f for f in files] for name, files in JOBS.items()} | fetched_jobs(fetched)
    dirs = {}
    for name, paths in jobs.items():
        d = root / "".join(c if c.isalnum() else "_" for c in name)
        d.mkdir()
        for path in paths:
            shutil.copy(path, d / path.name)
        dirs[name] = d
    return dirs


def fetched_jobs(fetched: Path) -> dict[str, list[Path]]:
    """The jobs of ``public_traces.toml`` whose every trace ``fetch_traces.py`` brought into ``fetched``."""
    jobs: dict[str, list[Path]] = {}
    for trace in read_list(LIST):
        jobs.setdefault(trace.job, []).append(fetched / trace.dir / trace.file)
    return {name: paths for name, paths in jobs.items() if all(p.is_file() for p in paths)}


FAMILIES = ("A100", "V100", "H100", "H200", "MI250", "MI300")


def gpu_family(name: str | None) -> str:
    """The GPU family a trace's device name names ("NVIDIA A100-SXM4-80GB" -> A100), else the
    name itself (HTA's MI250 trace names its GPU "AMD Radeon Graphics"), or unknown."""
    found = [f for f in FAMILIES if name and f in name.upper()]
    return found[0] if found else (name or "unknown")


@dataclass(frozen=True)
class Built:
    directory: Path
    family: str
    models: list[LaunchModel]
    """The delays fitted on each traced rank."""


def _median_model(models: list[LaunchModel]) -> LaunchModel:
    return LaunchModel(
        launch_ns=int(np.median([m.launch_ns for m in models])),
        stream_ns=int(np.median([m.stream_ns for m in models])),
    )


def held_out_delays(name: str, built: dict[str, Built]) -> tuple[LaunchModel, str]:
    """The delays a job is judged with, fitted on none of its traces: the median over the other
    jobs of its GPU family, else over every other job (the corpus default)."""
    others = {n: b for n, b in built.items() if n != name}
    same = [m for b in others.values() if b.family == built[name].family for m in b.models]
    if same and built[name].family != "unknown":
        return _median_model(same), built[name].family
    return _median_model([m for b in others.values() for m in b.models]), "corpus"


def _errors(out: Path, built, whole: bool) -> dict[int, tuple[float, float, float, float]]:
    """Per traced rank: recorded step, simulated step, the trace's own GPU end, the graph's (ms)."""
    summary = predict(out)
    graph = load_sim_graph(out)
    result = simulate(graph, iterations=1)
    rows = {}
    for rank, traced in built.traced.items():
        trace = read_gpu_trace(traced.path)
        trace = as_one_step(trace) if whole else trace
        recorded_gpu = (
            step_times(trace, simulate_timeline(trace)).set_index("step").at[built.step, "gpu_recorded_ms"]
        )
        rows[rank] = (
            traced.recorded_ns / 1e6, summary.ranks["iteration_ns"][rank] / 1e6, recorded_gpu,
            _gpu_end_ms(graph, result, rank, built.streams, out),
        )  # fmt: skip
    return rows


def _pct(a: float, b: float) -> str:
    return f"{100 * (a / b - 1):+.3f}" if b else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path)
    parser.add_argument("--fetched", type=Path, default=FETCHED, help="where fetch_traces.py put its traces")
    parser.add_argument("--whole-trace", action="store_true", help="build each given DIR's whole windows")
    args = parser.parse_args()
    table = Table(title="graphs from traces: each traced rank's ProfilerStep, recorded vs simulated")
    columns = ("job", "GPU", "ranks", "nodes", "build s", "rank", "step", "recorded ms", "simulated ms", "err %",
               "GPU work: trace's timeline ms", "graph ms", "err %", "held-out delays from", "step err %", "GPU work err %")  # fmt: skip
    for column in columns:
        table.add_column(
            column, justify="left" if column in ("job", "GPU", "held-out delays from") else "right"
        )
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {d.name: d for d in args.dirs} if args.dirs else _job_dirs(Path(tmp), args.fetched)
        whole = set(dirs) if args.whole_trace else set(WHOLE)
        built, rows, refused = {}, {}, {}
        for name, directory in dirs.items():
            out = Path(tmp) / f"{directory.name}.parquet"
            t0 = time.perf_counter()
            try:
                job = build_from_traces(directory, out, whole=name in whole)
            except (TraceGraphError, NormalizeError) as e:
                refused[name] = str(e).splitlines()[0]
                continue
            took = time.perf_counter() - t0
            first = read_gpu_trace(next(iter(job.traced.values())).path)
            built[name] = Built(
                directory, gpu_family(first.device_name), [t.model for t in job.traced.values()]
            )
            rows[name] = (job, took, len(load_sim_graph(out).kind), _errors(out, job, name in whole))
        for name, (job, took, nodes, fitted) in rows.items():
            delays, source = held_out_delays(name, built) if len(built) > 1 else (None, "")
            held = {}
            if delays is not None:
                out = Path(tmp) / f"{built[name].directory.name}.held.parquet"
                again = build_from_traces(built[name].directory, out, whole=name in whole, delays=delays)
                held = _errors(out, again, name in whole)
            for rank, (recorded, simulated, recorded_gpu, gpu) in fitted.items():
                h = held.get(rank)
                table.add_row(
                    name, built[name].family, f"{job.layout.world_size:,}", f"{nodes:,}", f"{took:.1f}", str(rank),
                    "whole" if name in whole else str(job.step), f"{recorded:.3f}", f"{simulated:.3f}", _pct(simulated, recorded),
                    f"{recorded_gpu:.3f}", f"{gpu:.3f}", _pct(gpu, recorded_gpu),
                    source, _pct(h[1], recorded) if h else "", _pct(h[3], recorded_gpu) if h else "",
                )  # fmt: skip
        console = Console(width=240)
        console.print(table)
        console.print(cross_rank_table(rows, dirs, Path(tmp)))
        console.print(refused_table(refused))
    if refused:  # a job that should build did not: the tables above say which and why
        raise SystemExit(f"error: {len(refused)} job(s) refused: {', '.join(refused)}")


def refused_table(refused: dict[str, str]) -> Table:
    """The public traces that are not GPU timelines (``tests/data/gpu_traces/not_timelines``)
    and any job above that was refused, each with the line that refuses it."""
    table = Table(title="traces refused, with the line that says why")
    table.add_column("trace")
    table.add_column("refused with")
    for path in sorted((DATA / "not_timelines").glob("*.json.gz")):
        try:
            read_gpu_trace(path)
        except NormalizeError as e:
            table.add_row(path.name, str(e).splitlines()[0].replace(f"{path}: ", ""))
        else:
            table.add_row(path.name, "read (no longer refused)")
    for name, line in refused.items():
        table.add_row(name, line)
    return table


def gpu_work(traced: TracedRank) -> frozenset:
    """The step's GPU work as a multiset of kernel and copy names: ranks of one role run the same."""
    rows = traced.rows
    on_gpu = np.array([" stream " in traced.lanes[lane] for lane in rows["lane"]], dtype=bool)
    return frozenset(Counter(rows["name"][on_gpu]).items())


def cross_rank_table(rows: dict, dirs: dict[str, Path], tmp: Path) -> Table:
    """Each multi-rank job built from one traced rank alone (as a capture records one rank a
    role), its other traced ranks of the same role (the same GPU work in the step) predicted by
    it, against what they recorded; ranks of other roles are listed, not predicted."""
    table = Table(title="one rank's trace for its role: the role's other traced ranks predicted")
    for column in ("job", "role", "from rank", "predicted ms", "rank", "recorded ms", "err %"):
        table.add_column(column, justify="left" if column in ("job", "role") else "right")
    for name, (job, _, _, _) in rows.items():
        if len(job.traced) < 2:
            continue
        roles: dict[frozenset, list[int]] = {}
        for rank, traced in sorted(job.traced.items()):
            roles.setdefault(gpu_work(traced), []).append(rank)
        for members in roles.values():
            label = ", ".join(map(str, members))
            if len(members) == 1:
                table.add_row(name, label, "", "", "", "", "its own role")
                continue
            for rank in members:
                traced = job.traced[rank]
                alone = tmp / f"{dirs[name].name}.from{rank}"
                alone.mkdir()
                shutil.copy(traced.path, alone / traced.path.name)
                out = tmp / f"{alone.name}.parquet"
                build_from_traces(alone, out)
                predicted = predict(out).ranks["iteration_ns"]
                for other in members:
                    if other != rank:
                        recorded = job.traced[other].recorded_ns
                        table.add_row(
                            name, label, str(rank), f"{predicted[other] / 1e6:.3f}", str(other),
                            f"{recorded / 1e6:.3f}", _pct(predicted[other], recorded),
                        )  # fmt: skip
    return table


def _gpu_end_ms(graph: SimGraph, result: SimResult, rank: int, streams: list[str], path: Path) -> float:
    """When the rank's last GPU work ends after its step began, in one simulated pass."""
    stream = read_rank(path, rank, columns=[gf.STREAM])[gf.STREAM].to_numpy()
    on_gpu = np.array([streams[s].startswith("cuda") for s in stream], bool)
    rows = int(graph.rank_first_row()[rank]) + np.flatnonzero(on_gpu)
    return float(result.end_ns[rows].max() - result.rank_start_ns[rank]) / 1e6 if len(rows) else 0.0


if __name__ == "__main__":
    main()
