"""Load-matched slice captures: the rest of the small world keeps the machine as busy as it was.

On the test machine every rank of a case's real run shares the CPU with the others, while a
slice capture runs one role's rank alone. The real ranks therefore compute more slowly
than the slice (docs/fidelity.md): a difference of the test bed, not of prism, since on the
target every rank has its own device. To compare like with like, ``MatchedLoad`` is a capture
hook that, while a batch of the slice runs, starts every *other* rank of the world as a lone
unrecorded process (all its peers virtual), so the captured rank shares the machine with the
same programs it shares it with in the real run. Those processes run the capture's iterations
(the same warm-up, then profiled ones, as in the real run) and are killed when the batch is
done, so they load the captured rank to its last iteration.

With ``paced_by`` (a graph), the load ranks are replays of that graph instead, each alone
against it: they wait where the job waits, as the real run's ranks do. A paced capture or a
replay computes after the job's waits; beside free-running load ranks, which never wait, it
would share the CPU for more of its time than any rank of the real run does (a pipeline's ranks
wait for each other for a tenth to a third of an iteration in the default cases).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

from prism.capture.launch import rank_command
from prism.capture.runner import CaptureHooks
from prism.capture.workloads.gpt.config import GPTConfig
from prism.schemas.cluster import ClusterSpec
from prism.schemas.layout import Role
from prism.schemas.manifest import GPT, PROGRAM, CaptureFiles, RankJob
from prism.schemas.program import ProgramSpec
from prism.schemas.replay import ReplayJob

_OUTLAST = 20
"""Load ranks run this many times the slice's profiled iterations (killed when the batch ends)."""


class MatchedLoad(CaptureHooks):
    """Capture hook: run the world's other ranks beside each batch of a slice capture."""

    def __init__(
        self,
        config: GPTConfig | None = None,
        *,
        program: ProgramSpec | None = None,
        warmup: int,
        iterations: int,
        threads: int = 1,
        paced_by: Path | None = None,
        host_ns_per_byte: Mapping[str, float] | None = None,
        hold_calls: ClusterSpec | None = None,
    ) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="prism-load-")
        root = Path(self._dir.name)
        self._job = root / "job.json"
        self._program = program
        if program is not None:
            # A program's load ranks run it to its end after the same warm-up and profiled
            # iterations (its own step count, which must outlast the captured rank's).
            job = RankJob(
                workload=PROGRAM, program=dataclasses.replace(program, run_to_end=True), real_ranks=(),
                warmup=warmup, iterations=iterations, threads=threads, host_ns_per_byte=dict(host_ns_per_byte or {}),
                hold_calls=hold_calls,
            )  # fmt: skip
            self._job.write_text(json.dumps(job.to_dict()))
            self._command = partial(rank_command, self._job, main="prism.capture.program_main")
        else:
            job = RankJob(
                workload=GPT,
                config=config.to_dict(),
                real_ranks=(),
                warmup=warmup,
                # Outlast the batch (it is killed when the batch ends): a load rank that is faster
                # than the captured one would otherwise finish first and leave the captured rank
                # alone on the machine for its last iterations, which the real run never is.
                iterations=iterations * _OUTLAST,
                threads=threads,
                host_ns_per_byte=dict(host_ns_per_byte or {}),
                hold_calls=hold_calls,
            )
            if paced_by is None:
                self._job.write_text(json.dumps(job.to_dict()))
                self._command = partial(rank_command, self._job)
            else:
                replay = ReplayJob(program=job, graph=str(paced_by.resolve()))
                self._job.write_text(json.dumps(replay.to_dict()))
                self._command = partial(_replay_command, self._job)
        self._world = job.layout.world_size
        self._threads = threads
        self._procs: list[tuple[int, subprocess.Popen]] = []
        self.started: list[tuple[int, ...]] = []
        """The load ranks started for each batch, in order (for the report and the tests)."""

    def batch_starting(
        self,
        ranks: tuple[int, ...],
        roles: dict[int, Role],
        *,
        value_pass: bool = False,
        capture_dir: Path | None = None,
    ) -> Callable[[dict], None] | None:
        if value_pass:  # the value pass is not timed: nothing to load
            self.started.append(())
            return None
        others = tuple(r for r in range(self._world) if r not in ranks)
        root = Path(self._dir.name)
        # Load ranks are killed when the batch ends: whatever temporary files they leave (torch's,
        # a library's) land in this folder, removed with it, not in the machine's /tmp.
        scratch = root / "tmp"
        scratch.mkdir(exist_ok=True)
        # LOCAL_RANK as the capture's launcher sets it (a device that exists here): programs read it.
        env = os.environ | {"OMP_NUM_THREADS": str(self._threads), "TMPDIR": str(scratch), "LOCAL_RANK": "0"}
        for rank in others:
            out = root / f"rank{rank}"
            out.mkdir(exist_ok=True)
            if self._program is not None and capture_dir is not None:
                _copy_values(CaptureFiles(capture_dir), CaptureFiles(out))
            self._procs.append(
                (
                    rank,
                    subprocess.Popen(
                        self._command(rank, out),
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        env=env,
                        start_new_session=True,  # its own process group: killed with everything it started
                    ),
                )
            )
        self.started.append(others)
        return None

    def batch_done(self, ranks: tuple[int, ...]) -> None:
        self.stop()

    def stop(self) -> None:
        """Kill the load processes still running; one that failed did not load the batch: an error."""
        procs, self._procs = self._procs, []
        ended = [(rank, proc.poll()) for rank, proc in procs if proc.poll() not in (None, 0)]
        for _, proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if ended:
            rank, code = ended[0]
            raise RuntimeError(f"load process of rank {rank} failed during the batch (exit code {code})")

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    def __enter__(self) -> MatchedLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _copy_values(source: CaptureFiles, target: CaptureFiles) -> None:
    """A pipelined program's values from the capture's value pass, for a load rank alone."""
    for path in sorted(source.values(0).parent.glob("rank*.pt")):
        target.values(0).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target.values(0).parent / path.name)


def _replay_command(job: Path, rank: int, out: Path) -> tuple[str, ...]:
    return (
        sys.executable,
        "-m",
        "prism.replay.rank_main",
        "--job",
        str(job),
        "--rank",
        str(rank),
        "--out",
        str(out),
    )
