"""Iterations of a program that does not mark them: each ``Optimizer.step`` ends one.

A global optimizer post-hook (``torch.optim.optimizer.register_optimizer_step_post_hook``) sees
every optimizer step of the program. Iteration k runs from the end of step k-1 (iteration 0:
from the start of the program) to the end of step k; the hook closes its ``prism:iter`` mark,
tells the completion clock, steps the profiler's schedule, and opens the next. After the last
iteration of the capture it raises ``ProgramStop`` out of ``optimizer.step()``, which unwinds
the program like an exception that no ``except Exception`` catches, unless the program is to
run to its end.
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass, field

import torch
from torch.nn.parallel import DistributedDataParallel

from prism.capture import annotate
from prism.capture.profiling import Profiler
from prism.capture.progress import report
from prism.peers.backend import active_world
from prism.peers.clock import CommClock
from prism.peers.standin import cached_pointers


class ProgramStop(BaseException):
    """Raised from the optimizer step that ends the capture's last iteration."""


@dataclass(kw_only=True)
class StepTimings:
    """What the hook measured, one entry per finished iteration."""

    iteration_ns: list[int] = field(default_factory=list)
    """Wall time of each iteration (``perf_counter_ns``)."""
    windows: list[tuple[int, int]] = field(default_factory=list)
    """Each iteration's span on the comm log's clock (``time.time_ns``)."""
    parameters: int = 0
    """Parameters the program's optimizers step (counted once, at the first step)."""
    static_bytes: int | None = None
    """Live tensor bytes when the first profiled iteration began (``live_tensor_bytes``)."""


class StepIterations:
    """The global optimizer post-hook that cuts a program into iterations."""

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
    ) -> None:
        self.timings = StepTimings()
        self._rank, self._total, self._stop, self._profiled_from = rank, total, stop_after_last, profiled_from
        self._profiler, self._clock, self._cuda = profiler, clock, cuda
        self._mark: contextlib.AbstractContextManager[None] | None = None
        self._began_ns = self._t0 = 0

    @property
    def done(self) -> int:
        """Iterations finished so far."""
        return len(self.timings.iteration_ns)

    def start(self) -> None:
        """Open iteration 0; call right before the program runs."""
        report(rank=self._rank, event="start", total=self._total)
        self._open()

    def __call__(self, optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        if self._mark is None:  # past the captured iterations (run to the end): nothing to record
            return
        if not self.timings.parameters:
            self.timings.parameters = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
        self._close()
        if self.done < self._total:
            self._open()
        elif self._stop:
            raise ProgramStop

    def finish(self) -> None:
        """The program ended: an iteration it left unfinished is not one (its mark is closed)."""
        if self._mark is not None:
            self._mark.__exit__(None, None, None)
            self._mark = None

    def _open(self) -> None:
        if self.done == self._profiled_from:
            self.timings.static_bytes = live_tensor_bytes(self._cuda)
        self._began_ns = time.time_ns()
        self._clock.iteration_started(self._began_ns)
        self._mark = annotate.iteration(self.done)
        self._mark.__enter__()
        self._t0 = time.perf_counter_ns()

    def _close(self) -> None:
        if self._cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter_ns() - self._t0
        self._mark.__exit__(None, None, None)
        self._mark = None
        ended = time.time_ns()
        self.timings.iteration_ns.append(elapsed)
        self.timings.windows.append((self._began_ns, ended))
        self._clock.iteration_done(ended)
        self._profiler.step()
        report(rank=self._rank, event="iteration", done=self.done, total=self._total, ms=elapsed / 1e6)


def live_tensor_bytes(cuda: bool) -> int:
    """Bytes the program's tensors hold now: on CUDA the allocator's count; on CPU, which keeps
    none, the distinct storages of every tensor the garbage collector tracks, plus the gradient
    buckets of every DistributedDataParallel module (held by its C++ reducer, where the garbage
    collector does not look), less what prism holds (stand-in sources, values recorded for
    receives from virtual peers)."""
    if cuda:
        return torch.cuda.memory_allocated()
    storages: dict[int, int] = {}
    buckets = 0
    for obj in gc.get_objects():
        if isinstance(obj, DistributedDataParallel):
            buckets += ddp_bucket_bytes(obj)
            continue
        if not torch.is_tensor(obj) or obj.is_sparse or obj.device.type != "cpu":
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
