"""The capture directory: its file names, the job each rank process runs, and ``manifest.json``.

    capture/
      manifest.json               CaptureManifest (written last: its presence means complete)
      job.json                    RankJob every rank process of the capture ran
      kineto/rank{r}.trace.json.gz   Kineto trace (hta.TraceAnalysis(trace_dir=capture/kineto))
      et/rank{r}.et.json          PyTorch Execution Trace of the profiled iterations
      comm/rank{r}.comm.json      comm log (prism.schemas.comm_log)
      logs/rank{r}.log            the rank process's stdout/stderr
      logs/rank{r}.result.json    RankResult of the rank process
      values/job.json             RankJob of the value pass (pipelined programs only)
      values/rank{r}.pt           what rank r received from real peers in the value pass
                                  (prism.schemas.received_values)

ET files live apart from Kineto files because HTA loads every JSON file of its directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from prism.schemas.checked import check_fields
from prism.schemas.cluster import ClusterSpec
from prism.schemas.files import write_json_atomic
from prism.schemas.held_parameters import HeldParameters
from prism.schemas.layout import ParallelLayout, Role
from prism.schemas.program import ProgramSpec
from prism.schemas.workload import RecordError, record_device, record_layout

SCHEMA = "prism.capture_manifest"
VERSION = 2
READABLE_VERSIONS = (1, 2)
"""Version 2 adds program captures (``RankJob.program``); version 1 files read unchanged."""

GPT = "gpt"
PROGRAM = "program"

MANIFEST_FILE = "manifest.json"
JOB_FILE = "job.json"
KINETO_DIR = "kineto"
ET_DIR = "et"
COMM_DIR = "comm"
LOG_DIR = "logs"
VALUES_DIR = "values"


class ManifestError(ValueError):
    """A capture directory or manifest that prism cannot read."""


@dataclass(frozen=True)
class CaptureFiles:
    """Paths of the files of one capture directory."""

    root: Path
    """The capture directory."""

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST_FILE

    @property
    def job(self) -> Path:
        return self.root / JOB_FILE

    @property
    def kineto_dir(self) -> Path:
        return self.root / KINETO_DIR

    def kineto(self, rank: int) -> Path:
        return self.root / KINETO_DIR / f"rank{rank}.trace.json.gz"

    def et(self, rank: int) -> Path:
        return self.root / ET_DIR / f"rank{rank}.et.json"

    def comm(self, rank: int) -> Path:
        return self.root / COMM_DIR / f"rank{rank}.comm.json"

    def log(self, rank: int) -> Path:
        return self.root / LOG_DIR / f"rank{rank}.log"

    def result(self, rank: int) -> Path:
        return self.root / LOG_DIR / f"rank{rank}.result.json"

    @property
    def values_job(self) -> Path:
        return self.root / VALUES_DIR / JOB_FILE

    def values(self, rank: int) -> Path:
        return self.root / VALUES_DIR / f"rank{rank}.pt"

    def rank_files(self, rank: int) -> tuple[Path, ...]:
        """The files every captured rank must leave behind."""
        return (self.kineto(rank), self.et(rank), self.comm(rank), self.result(rank))


@dataclass(frozen=True, kw_only=True)
class RankJob:
    """What one rank process of a capture runs (``job.json``); replay re-runs it."""

    workload: str
    """'gpt' (the built-in workload, ``config``) or 'program' (the user's own, ``program``)."""
    config: Mapping[str, Any] | None = field(default=None, hash=False)
    """The built-in workload's settings record (``prism.schemas.workload``: the model and the
    target layout; every real rank gets the per-rank shapes of this job). None for a program."""
    program: ProgramSpec | None = None
    """The user's program and its target layout; None for the built-in GPT."""
    real_ranks: tuple[int, ...] | None
    """Ranks that run as real processes at the same time; None means all of them, and an
    empty tuple means the rank being run alone (every peer virtual, as in a roles capture)."""

    def __post_init__(self) -> None:
        if (self.workload == PROGRAM) != (self.program is not None) or (self.config is None) == (
            self.program is None
        ):
            raise ManifestError(
                f"a {self.workload!r} job needs exactly its own settings (workload record or program)"
            )
        if self.config is not None:
            try:
                record_layout(self.config), record_device(self.config)
            except (RecordError, ValueError) as e:
                raise ManifestError(str(e).splitlines()[0]) from None

    @property
    def layout(self) -> ParallelLayout:
        """The target layout."""
        return self.program.layout if self.program is not None else record_layout(self.config)

    @property
    def device(self) -> str:
        """'cpu' or 'cuda'."""
        return self.program.device if self.program is not None else record_device(self.config)

    def real_ranks_for(self, rank: int) -> frozenset[int] | None:
        """The real ranks seen by the process that runs ``rank``."""
        if self.real_ranks is None:
            return None
        return frozenset(self.real_ranks) if self.real_ranks else frozenset({rank})

    warmup: int
    """Iterations run before profiling starts."""
    iterations: int
    """Iterations profiled."""
    threads: int
    """torch intra-op threads per rank process."""
    value_pass: bool = False
    """A program's value pass: the real ranks run together through the first optimizer step
    and write what they received from each other (``values/rank{r}.pt``); nothing is profiled."""
    host_ns_per_byte: Mapping[str, float] = field(default_factory=dict, hash=False)
    """CPU ranks: the host-side work of a virtual collective, per byte by op class
    (``ClusterSpec.host_ns_per_byte``), that the rank's process does beside the program as the
    call's real backend would (``prism.peers.host_work``); empty: none."""
    hold_calls: ClusterSpec | None = None
    """CPU ranks: a spec of this machine (``prism-calibrate``'s) under whose price every virtual
    call holds the program, asleep, as the real call's wait would (``prism.peers.clock.HoldingClock``);
    None: virtual calls complete at once."""

    def to_dict(self) -> dict:
        data = asdict(replace(self, hold_calls=None))  # a spec's tables are read-only mappings
        data["hold_calls"] = None if self.hold_calls is None else self.hold_calls.to_dict()
        data["config"] = None if self.config is None else dict(self.config)
        data["program"] = None if self.program is None else self.program.to_dict()
        data["host_ns_per_byte"] = dict(self.host_ns_per_byte)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> RankJob:
        real = data["real_ranks"]
        config, program = data.get("config"), data.get("program")
        return cls(
            workload=data["workload"],
            config=None if config is None else dict(config),
            program=None if program is None else ProgramSpec.from_dict(program),
            real_ranks=None if real is None else tuple(real),
            warmup=int(data["warmup"]),
            iterations=int(data["iterations"]),
            threads=int(data["threads"]),
            value_pass=bool(data.get("value_pass", False)),
            host_ns_per_byte={str(k): float(v) for k, v in (data.get("host_ns_per_byte") or {}).items()},
            hold_calls=None if data.get("hold_calls") is None else ClusterSpec.from_dict(data["hold_calls"]),
        )


@dataclass(frozen=True, kw_only=True)
class RankResult:
    """What one rank process measured about itself (``logs/rank{r}.result.json``)."""

    rank: int
    """Global rank."""
    iteration_ns: tuple[int, ...]
    """Wall time of every iteration, warm-up ones first."""
    losses: tuple[float | None, ...]
    """Mean loss of every iteration (last stage only; None elsewhere)."""
    parameter_count: int
    """Parameters this rank holds."""
    peak_rss_bytes: int
    """Peak resident set size of the process."""
    peak_device_bytes: int | None
    """torch.cuda.max_memory_allocated on CUDA, None on CPU."""
    wall_s: float
    """Wall time of the whole rank process, start-up included."""
    held_ns: tuple[int, ...] = ()
    """Time of every iteration prism held the program (``prism.schemas.comm_log.HeldTime``): zero
    in a free-running capture; the emulated waits and the engine's work in a paced one."""
    static_bytes: int | None = None
    """A program's capture: bytes of the distinct tensor storages the program held when its profiled
    iterations began (weights, gradients, optimizer state; ``torch.cuda.memory_allocated`` on
    CUDA). The built-in GPT: ``torch.cuda.memory_allocated`` then on CUDA (which also counts
    what CUDA libraries keep, cuBLAS workspaces), None on CPU, where ``parameters`` give them."""
    steady_from: int | None = None
    """A program's capture: the first iteration from which every iteration made the same calls as
    the last (``prism.schemas.iterations.steady_from``); a replay co-simulates from there. None
    for the built-in GPT."""
    phase_ns: tuple[dict[str, int], ...] = ()
    """Own time of every iteration by kind of top-level block (``annotations.block_kind``, and
    ``annotations.GLUE`` before the first block and after the last): each block's wall time with
    the glue led into it, less the calls the comm model prices (``comm_log.PricedTime``: a posted
    transfer's post stays) and held time, cut as the build cuts the trace
    (``prism.capture.phase_timer.own_phase_ns``). Empty in captures made before it was recorded."""
    block_ns: tuple[dict[str, int], ...] = ()
    """Wall time of every iteration in its top-level blocks by kind, the calls made inside them and
    prism's holds included (``prism.capture.phase_timer.block_wall_ns``): measured as a fully real
    run without prism's process group measures itself (``prism.fidelity.timed_run``). Empty in
    captures made before it was recorded."""
    calls: tuple[int, ...] = ()
    """Process-group calls the program began in every iteration. Empty in captures made before it
    was recorded."""
    collective_ns: tuple[int, ...] = ()
    """Time of every iteration in collective calls, waits on them and prism's holds in them
    (``prism.schemas.comm_log.CollectiveTime``); the rest of the time in calls is point-to-point.
    Empty in captures made before it was recorded."""
    parameters: HeldParameters | None = None
    """The parameters the rank holds and the bytes each keeps (``prism.schemas.held_parameters``):
    the built-in GPT's read from its model and optimizer once it ran, a program's (each in the
    layer block its layer marks give it) when its profiled iterations began, with ``static_bytes``.
    None in captures made before it was recorded."""

    @property
    def own_iteration_ns(self) -> tuple[int, ...]:
        """Every iteration's wall time less the time prism held the program: its own time."""
        if not self.held_ns:
            return self.iteration_ns
        return tuple(t - b for t, b in zip(self.iteration_ns, self.held_ns, strict=True))

    @classmethod
    def from_dict(cls, data: dict) -> RankResult:
        return cls(
            **{
                **data,
                "iteration_ns": tuple(data["iteration_ns"]),
                "losses": tuple(data["losses"]),
                "held_ns": tuple(data.get("held_ns", ())),
                "collective_ns": tuple(data.get("collective_ns", ())),
                "calls": tuple(data.get("calls", ())),
                "phase_ns": tuple(dict(p) for p in data.get("phase_ns", ())),
                "block_ns": tuple(dict(p) for p in data.get("block_ns", ())),
                "parameters": None
                if data.get("parameters") is None
                else HeldParameters.from_dict(data["parameters"]),
            }
        )


@dataclass(frozen=True, kw_only=True)
class CapturedRank:
    """One rank that ran for real, and where its files are."""

    rank: int
    """Global rank in the target layout."""
    role: Role
    """Role the rank stands for."""
    stage: int
    """Pipeline stage of the rank."""
    kineto: str
    """Kineto trace, relative to the capture directory."""
    et: str
    """Execution Trace, relative to the capture directory."""
    comm: str
    """Comm log, relative to the capture directory."""
    result: RankResult
    """What the rank process measured."""


PACED_MODE = "paced"
"""``CaptureManifest.mode`` of a paced capture (``prism.replay.paced_capture``): its compute ran
after the waits a graph gave it, so its graph's compute already holds what a wait costs it."""


@dataclass(frozen=True, kw_only=True)
class CaptureManifest:
    """Everything later stages need to know about a capture (``manifest.json``)."""

    layout: ParallelLayout
    """Target layout, rank order included."""
    mode: str
    """'roles' (one real rank per role, peers virtual), 'all' (every rank real) or ``PACED_MODE``."""
    job: RankJob
    """The job every captured rank ran."""
    ranks: tuple[CapturedRank, ...]
    """Captured ranks, in capture order."""
    rerun_command: tuple[str, ...]
    """argv that re-runs one rank; '{capture_dir}', '{rank}' and '{out_dir}' are placeholders."""
    torch_version: str
    """torch.__version__ of the capture."""
    device: str
    """'cpu' or the CUDA device name."""
    host: str
    """Host name."""
    started_at: str
    """ISO-8601 time the capture started."""
    wall_s: float
    """Wall time of the whole capture."""
    prism_version: str
    """prism version that wrote the capture."""
    notes: dict = field(default_factory=dict)
    """Free-form extra facts (CPU model, thread settings, ...)."""

    def rank_of_role(self, role: Role) -> CapturedRank | None:
        return next((r for r in self.ranks if r.role == role), None)

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "layout": self.layout.to_dict(),
            "mode": self.mode,
            "job": self.job.to_dict(),
            "ranks": [{**asdict(r), "role": r.role.value, "result": asdict(r.result)} for r in self.ranks],
            "rerun_command": list(self.rerun_command),
            "torch_version": self.torch_version,
            "device": self.device,
            "host": self.host,
            "started_at": self.started_at,
            "wall_s": self.wall_s,
            "prism_version": self.prism_version,
            "notes": self.notes,
        }

    @classmethod
    def from_dict(cls, data: dict) -> CaptureManifest:
        if data.get("schema") != SCHEMA:
            raise ManifestError(f"not a prism capture manifest (schema={data.get('schema')!r})")
        if data.get("version") not in READABLE_VERSIONS:
            raise ManifestError(
                f"capture manifest version {data.get('version')!r} is not supported by this prism "
                f"(reads {', '.join(map(str, READABLE_VERSIONS))})"
            )
        try:
            ranks = tuple(
                CapturedRank(**{**r, "role": Role(r["role"]), "result": RankResult.from_dict(r["result"])})
                for r in data["ranks"]
            )
            return cls(
                layout=ParallelLayout.from_dict(data["layout"]),
                mode=data["mode"],
                job=RankJob.from_dict(data["job"]),
                ranks=ranks,
                rerun_command=tuple(data["rerun_command"]),
                torch_version=data["torch_version"],
                device=data["device"],
                host=data["host"],
                started_at=data["started_at"],
                wall_s=float(data["wall_s"]),
                prism_version=data["prism_version"],
                notes=dict(data.get("notes", {})),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"malformed capture manifest: {e}") from e


def write_manifest(manifest: CaptureManifest, capture_dir: str | os.PathLike) -> None:
    write_json_atomic(CaptureFiles(Path(capture_dir)).manifest, manifest.to_dict())


def read_manifest(capture_dir: str | os.PathLike) -> CaptureManifest:
    path = CaptureFiles(Path(capture_dir)).manifest
    if not path.is_file():
        raise ManifestError(f"{capture_dir} is not a complete capture: {MANIFEST_FILE} is missing")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ManifestError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ManifestError(
            f"{path} is not a prism capture manifest (a JSON {type(data).__name__}, not an object)"
        )
    try:
        manifest = CaptureManifest.from_dict(data)
        check_fields(manifest)
        if manifest.job.layout != manifest.layout:
            raise ManifestError(
                f"{path}: the manifest's layout {manifest.layout} contradicts its job's {manifest.job.layout}"
            )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, ManifestError):
            raise
        raise ManifestError(f"{path}: malformed capture manifest ({type(e).__name__}: {e})") from None
    return manifest
