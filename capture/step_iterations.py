"""Iterations of a program: each outermost ``Optimizer.step`` ends one, unless the program says otherwise.

A hook on the program's outermost optimizer steps (``prism.capture.optimizer_steps``: a container
optimizer's inner steps are part of its own) sees every training step. Iteration k runs from the end of step k-1 (iteration 0:
from the start of the program) to the end of step k; the hook closes its ``prism:iter`` mark,
tells the completion clock, steps the profiler's schedule, and opens the next. After the last
iteration of the capture it raises ``ProgramStop`` out of ``optimizer.step()``, which unwinds
the program like an exception that no ``except Exception`` catches, unless the program is to
run to its end.

A program that steps a ``torch.profiler`` of its own (``prism.capture.program_profiler``) has its
iterations end at those steps instead, and one that marks its iterations with
``prism.capture.annotate.iteration`` has them be its marks.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.parallel import DistributedDataParallel

from prism.capture import annotate
from prism.capture.phase_timer import BlockSpan, PhaseTimer
from prism.capture.profiling import Profiler
from prism.capture.progress import report
from prism.peers.backend import active_world
from prism.peers.clock import CommClock
from prism.peers.standin import cached_pointers
from prism.schemas.annotations import Mark, Phase
from prism.schemas.held_parameters import HeldParameters


class ProgramStop(BaseException):
    """Raised from the optimizer step that ends the capture's last iteration."""


@dataclass(kw_only=True)
class StepTimings:
    """What the hook measured, one entry per finished iteration."""

    iteration_ns: list[int] = field(default_factory=list)
    """Wall time of each iteration (``perf_counter_ns``)."""
    windows: list[tuple[int, int]] = field(default_factory=list)
    """Each iteration's span on the comm log's clock (``time.time_ns``)."""
    blocks: list[list[BlockSpan]] = field(default_factory=list)
    """Each iteration's top-level phase marks (``prism.capture.program_phases``), when timed."""
    parameters: int = 0
    """Parameters the program's optimizers step (counted once, at the first step)."""
    static_bytes: int | None = None
    """Live tensor bytes when the first profiled iteration began (``live_tensor_bytes``)."""
    held: HeldParameters | None = None
    """What the program's parameters held then, each in its layer block (the ``holding`` given)."""


class Driver(enum.StrEnum):
    """What ends a program's iterations."""

    OPTIMIZER = "optimizer"  # each Optimizer.step (the default)
    PROFILER = "profiler"  # each step() of the program's own torch.profiler, once it started one
    MARKS = "marks"  # the program's own prism.capture.annotate.iteration marks, once it opened one


class StepIterations:
    """Cuts a program into iterations: the global optimizer post-hook, unless the program steps a
    profiler of its own (``profiler_started`` / ``profiler_step``) or marks its iterations
    (``program_mark``), which then win."""

    def __init__(
        self,
        *,
        rank: int,
        total: int,
        profiled_from: int,
        stop_after_last: bool,
        profiler: Profiler,
        clock: CommClock,
        cuda: bool,
        clock_from: int = 0,
        timer: PhaseTimer | None = None,
        holding: Callable[[], HeldParameters | None] | None = None,
    ) -> None:
        self.timings = StepTimings()
        self._holding = holding  # read with the static bytes
        self._timer = timer  # its spans are taken at each iteration's end
        self._clock_from = clock_from  # iterations before it are not told to the clock
        self.driver = Driver.OPTIMIZER
        self._rank, self._total, self._stop, self._profiled_from = rank, total, stop_after_last, profiled_from
        self._profiler, self._clock, self._cuda = profiler, clock, cuda
        self._mark: contextlib.AbstractContextManager[None] | None = None
        self._running = False
        self._began_ns = self._t0 = 0

    @property
    def done(self) -> int:
        """Iterations finished so far."""
        return len(self.timings.iteration_ns)

    def start(self) -> None:
        """Open iteration 0; call right before the program runs."""
        report(rank=self._rank, event="start", total=self._total)
        self._begin(own_mark=True)

    def __call__(self, optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        if not self.timings.parameters:
            self.timings.parameters = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
        if self.driver is Driver.OPTIMIZER:
            self._boundary()

    def profiler_started(self) -> None:
        """The program started a torch.profiler of its own: its steps end iterations from now on."""
        if self.driver is Driver.OPTIMIZER:
            self.driver = Driver.PROFILER

    def profiler_step(self) -> None:
        if self.driver is Driver.PROFILER:
            self._boundary()

    def program_mark(self, opening: bool) -> None:
        """The program's own iteration mark opens or closes: its marks are the iterations."""
        if self.driver is not Driver.MARKS:
            # What ran before the program's first mark (its set-up) is no iteration.
            self.driver = Driver.MARKS
            if self._mark is not None:
                self._mark.__exit__(None, None, None)
                self._mark = None
            self._running = False
        if opening:
            if self.done < self._total:
                self._begin(own_mark=False)
        elif self._running:
            self._end()
            if self.done >= self._total and self._stop:
                raise ProgramStop

    def finish(self) -> None:
        """The program ended: an iteration it left unfinished is not one (its mark is closed)."""
        if self._mark is not None:
            self._mark.__exit__(None, None, None)
            self._mark = None
        self._running = False

    def _boundary(self) -> None:
        if not self._running:  # past the captured iterations (run to the end): nothing to record
            return
        self._end()
        if self.done < self._total:
            self._begin(own_mark=True)
        elif self._stop:
            raise ProgramStop

    def _begin(self, *, own_mark: bool) -> None:
        if self.done == self._profiled_from:
            self.timings.static_bytes = live_tensor_bytes(self._cuda)
            self.timings.held = self._holding() if self._holding is not None else None
        # The iteration's wall time starts where the clock's does: a hold at its start (the
        # co-simulation catching up in a replay) is time the program took.
        self._began_ns, self._t0 = time.time_ns(), time.perf_counter_ns()
        if self.done >= self._clock_from:
            self._clock.iteration_started(self._began_ns)
        if own_mark:
            self._mark = annotate.mark(Mark(phase=Phase.ITERATION, iter=self.done))
            self._mark.__enter__()
        if self._timer is not None:
            self._timer.take()  # what ran before the iteration (set-up, between marked iterations) is none of it
        self._running = True

    def _end(self) -> None:
        if self._cuda:
            torch.cuda.synchronize()
        elapsed, ended = time.perf_counter_ns() - self._t0, time.time_ns()  # where the clock's ends
        if self._mark is not None:
            self._mark.__exit__(None, None, None)
            self._mark = None
        self._running = False
        self.timings.iteration_ns.append(elapsed)
        self.timings.windows.append((self._began_ns, ended))
        if self._timer is not None:
            self.timings.blocks.append(self._timer.take())
        if self.done > self._clock_from:  # the iteration just ended was told to the clock
            self._clock.iteration_done(ended)
        self._profiler.step()
        report(rank=self._rank, event="iteration", done=self.done, total=self._total, ms=elapsed / 1e6)


def live_tensor_bytes(cuda: bool, *, buckets_in_python: bool = True) -> int:
    """Bytes the program's tensors hold now: on CUDA the allocator's count; on CPU, which keeps
    none, the distinct storages of every tensor the garbage collector tracks, less what prism
    holds (stand-in sources, values recorded for receives from virtual peers).

    DDP's gradient buckets are held by its C++ reducer, where the garbage collector does not look,
    unless its all-reduces went through a Python process group (prism's), which gives each bucket
    a Python tensor that lives as long as the bucket. Without that (``buckets_in_python=False``:
    a program on its own C++ backend) the buckets of every DistributedDataParallel module are
    added from DDP's own logging data."""
    if cuda:
        return torch.cuda.memory_allocated()
    storages: dict[int, int] = {}
    buckets = 0
    for obj in gc.get_objects():
        kind = type(obj)  # not isinstance: a dead weakref.proxy raises on it (torch.compile keeps some)
        if issubclass(kind, DistributedDataParallel):
            buckets += 0 if buckets_in_python else ddp_bucket_bytes(obj)
            continue
        if not issubclass(kind, torch.Tensor) or issubclass(kind, FakeTensor):  # fakes hold no memory
            continue
        if obj.is_sparse or obj.device.type != "cpu":
            continue
        try:
            storage = obj.untyped_storage()
            pointer, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # no storage (meta, wrappers) or one freed (FSDP2)
            continue
        storages[pointer] = max(storages.get(pointer, 0), nbytes)
    world = active_world()
    held = world.received.pointers() if world is not None and world.received is not None else set()
    for pointer in (0, *cached_pointers(), *held):
        storages.pop(pointer, None)
    return sum(storages.values()) + buckets


def ddp_bucket_bytes(module: DistributedDataParallel) -> int:
    """Bytes of a DDP module's gradient buckets that no Python tensor shares: all of them, unless
    gradients are views into the buckets (then the gradients' storages are the buckets)."""
    data = module._get_ddp_logging_data()
    if data.get("gradient_as_bucket_view"):
        return 0
    sizes = str(data.get("bucket_sizes", ""))
    return sum(int(size) for size in sizes.split(",") if size.strip())
