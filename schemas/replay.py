"""Files of a replay directory: the job of a replayed rank, what it measured, and ``report.json``.

::

    replay/
      report.json                 ReplayReport: measured vs predicted, rank by rank
      job.json                    ReplayJob: the program (a capture RankJob) and the graph
      kineto/rank{r}.trace.json.gz  the real rank's profiled iterations (emulated waits added)
      et/rank{r}.et.json          its Execution Trace
      comm/rank{r}.comm.json      its process-group calls
      logs/rank{r}.result.json    RankResult (wall time of every iteration)
      logs/rank{r}.replay.json    ReplayRankStats (the co-simulation's side)
      logs/rank{r}.log            its output
      peers/rank{p}.trace.json    --trace-peers: Chrome traces of virtual ranks
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from prism.schemas.manifest import CaptureFiles, RankJob

REPORT_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class ReplayJob:
    """What a replayed rank process runs (``job.json``)."""

    program: RankJob
    """The original program with the target job's shapes (peers outside ``real_ranks`` virtual)."""
    graph: str
    """graph.parquet whose co-simulation times the virtual peers."""
    trace_peers: tuple[int, ...] = ()
    """Virtual ranks whose co-simulated nodes are written as Chrome traces."""
    delays: tuple[dict, ...] = ()
    """Straggler delays: ``{"phase", "layer", "delay_ns", "rank"}`` (``prism.graph.sim.whatif.BlockDelay``)."""
    coordinator: str | None = None
    """Address of the co-simulation (``prism.replay.coordinator``) the rank processes talk to;
    None: the rank runs its own, in its thread (the fidelity benchmark's load ranks)."""
    clock_from: int = 0
    """A program's first co-simulated iteration (``gf.STEADY_FROM_KEY``): the ones before it run
    against no graph (set-up and one-time calls); 0 for the built-in GPT."""

    def to_dict(self) -> dict:
        return {
            "clock_from": self.clock_from,
            "program": self.program.to_dict(),
            "graph": self.graph,
            "trace_peers": list(self.trace_peers),
            "delays": list(self.delays),
            "coordinator": self.coordinator,
        }

    @classmethod
    def from_dict(cls, data: dict) -> ReplayJob:
        return cls(
            program=RankJob.from_dict(data["program"]),
            graph=data["graph"],
            trace_peers=tuple(data.get("trace_peers", ())),
            delays=tuple(data.get("delays", ())),
            coordinator=data.get("coordinator"),
            clock_from=int(data.get("clock_from", 0)),
        )


@dataclass(frozen=True, kw_only=True)
class ReplayIteration:
    """The co-simulation's view of one iteration of the real rank."""

    calls: int
    """Virtual calls the program made."""
    engine_ns: int
    """Time the co-simulation computed for the pass, beside the program (in the coordinator)."""
    stall_ns: int
    """Time the replay held the program beyond what the job would have: the clock's own work
    in the program's thread (matching, telling the co-simulation) where the program would have
    run on, and waits past a call's modelled end for an answer that came late. Removed from the
    emulated time, never from the wall time."""
    emulated_ns: int
    """The iteration in graph time: wall time with stall removed."""
    phase_ns: dict[str, int]
    """The real rank's emulated time by phase of its blocks."""
    ahead: int = 0
    """Calls answered at once by an answer rule the co-simulation had sent ahead of them."""
    late_ns: int = 0
    """The part of ``stall_ns`` that waited for answers found after the call's modelled end; the
    rest is the clock's own work in the program's thread."""


@dataclass(frozen=True, kw_only=True)
class ReplayRankStats:
    """What a replayed rank process writes besides its RankResult (``logs/rank{r}.replay.json``)."""

    rank: int
    iterations: tuple[ReplayIteration, ...]
    """Every iteration, warm-up ones first (as ``RankResult.iteration_ns``)."""
    predicted_iteration_ns: int
    """The offline simulation's steady iteration time of this rank."""
    predicted_peak_bytes: int
    """The offline simulation's peak memory of this rank."""
    predicted_phase_ns: dict[str, int]
    """The offline simulation's time of this rank by phase (steady iteration)."""
    graph_load_s: float
    """Time the co-simulation took to read and fold the graph."""
    replay_rss_bytes: int
    """Resident memory the graph and the engine added to the process they run in (the
    launcher's, beside the program's)."""
    virtual_iteration_ns: tuple[int, ...] = ()
    """Every rank's co-simulated iteration time, median over the clean unprofiled iterations."""
    simulated_from: int = 0
    """The first iteration run against the graph (``ReplayJob.clock_from``); the ones before it
    are in ``iterations`` with their wall time and no co-simulation."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ReplayRankStats:
        return cls(
            **{
                **data,
                "iterations": tuple(ReplayIteration(**it) for it in data["iterations"]),
                "virtual_iteration_ns": tuple(data.get("virtual_iteration_ns", ())),
            }
        )


def read_replay_stats(path: str | os.PathLike) -> ReplayRankStats:
    """A replayed rank's ``ReplayRankStats`` (``ReplayFiles.replay_stats``)."""
    return ReplayRankStats.from_dict(json.loads(Path(path).read_text()))


class ReplayFiles(CaptureFiles):
    """Paths inside a replay directory (a capture directory's layout, plus the replay's own files)."""

    @property
    def report(self) -> Path:
        return self.root / "report.json"

    def replay_stats(self, rank: int) -> Path:
        return self.root / "logs" / f"rank{rank}.replay.json"

    def peer_trace(self, rank: int) -> Path:
        return self.root / "peers" / f"rank{rank}.trace.json"


@dataclass(frozen=True, kw_only=True)
class PhaseComparison:
    """One phase of the real rank's iteration: measured vs predicted."""

    phase: str
    measured_ms: float
    predicted_ms: float


@dataclass(frozen=True, kw_only=True)
class RankReport:
    """One replayed rank: measured against the graph's prediction."""

    rank: int
    stage: int
    role: str
    measured_iter_ms: float
    """A correction: median of the clean unprofiled iterations with the co-simulation's stall
    removed (for a rank replayed alone)."""
    predicted_iter_ms: float
    """The offline simulation of the graph."""
    iter_err_pct: float
    """Of ``measured_iter_ms``."""
    measured_peak_bytes: int | None
    """Static bytes + the allocator's peak over the profiled iterations (None: not recorded)."""
    predicted_peak_bytes: int
    mem_err_pct: float | None
    engine_ms_per_iter: float
    """Median engine time per clean iteration."""
    stall_ms_per_iter: float
    """Median of it that held the program."""
    calls_per_iter: int
    replay_rss_bytes: int
    phases: tuple[PhaseComparison, ...] = field(default_factory=tuple)
    wall_iter_ms: float | None = None
    """The measurement: median wall time of the same clean iterations, nothing subtracted (None in
    reports written before it was recorded)."""
    wall_err_pct: float | None = None
    """Of ``wall_iter_ms`` against the prediction."""


@dataclass(frozen=True, kw_only=True)
class ReplayReport:
    """``report.json``."""

    graph: str
    layout: str
    device: str
    warmup: int
    iterations: int
    ranks: tuple[RankReport, ...]
    version: int = REPORT_VERSION
    cores: dict | None = None
    """The cores each real rank run at once and the co-simulation were held to
    (``{"ranks": [[0]], "launcher": [1]}``), or None where they were not pinned."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ReplayReport:
        ranks = tuple(
            RankReport(**{**r, "phases": tuple(PhaseComparison(**p) for p in r["phases"])})
            for r in data["ranks"]
        )
        return cls(**{**data, "ranks": ranks})
