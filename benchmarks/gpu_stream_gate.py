"""How precisely can the host hold a CUDA stream for a time it names? Three ways, measured.

    python benchmarks/gpu_stream_gate.py [--samples 100] [--json FILE]

A virtual peer's collective on CUDA tensors should end on the GPU's timeline, as NCCL's does: the
program's host runs on while its stream waits until the simulated end. Three ways to hold a
stream at a gate until the host lets it go, none a kernel of prism's own:

- ``python_host_fn``: ``cudaLaunchHostFunc`` with a Python callback, which notes when the stream
  reached it and returns after the hold (it needs the GIL to run at all);
- ``compiled_host_fn``: the same with a numba ``cfunc`` that never takes the GIL;
- ``wait_value``: ``cuStreamWaitValue32_v2`` on a pinned host word, which the host writes after
  the hold, having polled an event to learn when the stream reached the gate.

Each is measured with the program's thread idle and busy (running Python, as a program that runs
ahead of its GPU does). The figure is the **overshoot**: how much longer the stream stood still
(CUDA events on either side of the gate) than the hold the host timed, i.e. how late the host
learns of the arrival plus how late the stream resumes. Also the rate of ``torch.cuda._sleep``,
with which a gate could be followed by a transfer's duration. Exits with 2 where no GPU is there.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from numba import carray, cfunc, types

HOLD_NS = 300_000  # the hold the host times once the stream reaches the gate
_AHEAD_CYCLES = 100_000_000  # a kernel before each gate (about 50 ms on an H200): the host stays ahead

_libc = ctypes.CDLL(None)
_clock_gettime = _libc.clock_gettime
_clock_gettime.argtypes = [ctypes.c_int, ctypes.c_size_t]  # (CLOCK_REALTIME, struct timespec *)
_clock_gettime.restype = ctypes.c_int


@cfunc(types.void(types.voidptr))
def _compiled_gate(user):  # slots: entered, left, hold, -, timespec (2 words)
    slots = carray(user, 6, np.int64)
    stamp = slots.ctypes.data + 32
    _clock_gettime(0, stamp)
    now = slots[4] * 1_000_000_000 + slots[5]
    slots[0] = now
    end = now + slots[2]
    while now < end:
        _clock_gettime(0, stamp)
        now = slots[4] * 1_000_000_000 + slots[5]
    slots[1] = now


def _loaded_library(stem: str, fallbacks: tuple[str, ...]) -> ctypes.PyDLL:
    """The copy of a CUDA library torch loaded, else the first of ``fallbacks`` that loads. Its
    calls keep the GIL: the caller needs no wait to get it back after each."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if f"/{stem}" in path and ".so" in path:
            return ctypes.PyDLL(path)
    for name in fallbacks:
        try:
            return ctypes.PyDLL(name)
        except OSError:
            continue
    raise OSError(f"no {stem} found")


def _host_fn_gated(samples: int, fn: int, user: int | None, held_ns: Callable[[], int]) -> dict:
    """``_gated`` with ``cudaLaunchHostFunc(fn, user)`` as the gate; ``held_ns()``: the hold it timed."""
    cudart = _loaded_library("libcudart", ("libcudart.so.13", "libcudart.so.12", "libcudart.so"))
    launch = cudart.cudaLaunchHostFunc
    launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    launch.restype = ctypes.c_int
    stream = torch.cuda.current_stream()

    def gate(after: torch.cuda.Event) -> int:
        code = launch(stream.cuda_stream, fn, user)
        if code:
            raise RuntimeError(f"cudaLaunchHostFunc returned {code}")
        after.record()
        _sleep_until_done(after)  # without the GIL, which a Python callback needs
        return held_ns()

    return _gated(samples, gate)


def _seen_done(event: torch.cuda.Event, deadline_s: float = 2.0) -> int | None:
    """Host time at which ``event`` is first seen complete (polled); None past the deadline."""
    end = time.monotonic() + deadline_s
    while not event.query():
        if time.monotonic() > end:
            return None
    return time.time_ns()


def _sleep_until_done(event: torch.cuda.Event, deadline_s: float = 2.0) -> None:
    """Wait for ``event`` in short sleeps, which let go of the GIL (the stream's timing is the
    figure here, not how soon this thread sees it)."""
    end = time.monotonic() + deadline_s
    while not event.query() and time.monotonic() < end:
        time.sleep(20e-6)


class _Busy:
    """Another thread running Python throughout, holding the GIL in turns as a busy program does."""

    def __init__(self, busy: bool) -> None:
        self.busy, self._stop = busy, threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        x = 0
        while not self._stop.is_set():
            for i in range(1000):
                x += i * i

    def __enter__(self) -> _Busy:
        if self.busy:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.busy:
            self._thread.join()


def _summary(values_ns: list[float]) -> dict:
    us = sorted(v / 1e3 for v in values_ns)
    return {"n": len(us), "median_us": round(statistics.median(us), 1),
            "p90_us": round(us[int(0.9 * (len(us) - 1))], 1), "max_us": round(us[-1], 1)}  # fmt: skip


def _gated(
    samples: int, gate: Callable[[torch.cuda.Event], int], unstick: Callable[[], None] = lambda: None
) -> dict:
    """Overshoot of ``samples`` gates: the stream's stop (events around the gate) minus the hold.

    ``gate(after)`` puts its gate on the stream, records ``after`` behind it, lets the gate go
    where the host does that, and returns the hold it timed. A long kernel before each gate keeps
    the host ahead of the GPU, so that the stream never waits for the host to enqueue the gate or
    ``after`` (a busy thread can keep this one from the GIL for several switch intervals)."""
    overshoot = []
    for _ in range(samples):
        torch.cuda._sleep(_AHEAD_CYCLES)
        before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        before.record()
        held = gate(after)
        if _seen_done(after) is None:
            unstick()
            raise RuntimeError("the stream did not pass the gate within 2 s")
        overshoot.append(before.elapsed_time(after) * 1e6 - held)
    return _summary(overshoot)


def python_host_fn(samples: int) -> dict:
    times = [0, 0]

    def hold(_user: int) -> None:  # on CUDA's callback thread, once the stream is there
        times[0] = now = time.time_ns()
        while now < times[0] + HOLD_NS:
            now = time.time_ns()
        times[1] = now

    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(hold)  # alive while the stream may call it
    pointer = ctypes.cast(callback, ctypes.c_void_p).value
    return _host_fn_gated(samples, pointer, None, lambda: times[1] - times[0])


def compiled_host_fn(samples: int) -> dict:
    slots = np.zeros(6, dtype=np.int64)
    slots[2] = HOLD_NS
    return _host_fn_gated(
        samples, _compiled_gate.address, slots.ctypes.data, lambda: int(slots[1] - slots[0])
    )


def wait_value(samples: int) -> dict:
    cuda = ctypes.PyDLL("libcuda.so.1")  # calls keep the GIL: no wait to get it back after each
    wait = cuda.cuStreamWaitValue32_v2
    wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
    wait.restype = ctypes.c_int
    word = torch.zeros(1, dtype=torch.int32, pin_memory=True)
    cell = ctypes.c_int32.from_address(word.data_ptr())
    device_ptr = ctypes.c_uint64()
    code = cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(device_ptr), ctypes.c_void_p(word.data_ptr()), 0)
    if code:
        raise RuntimeError(f"cuMemHostGetDevicePointer_v2 returned {code}")
    stream = torch.cuda.current_stream()
    value = [0]

    def gate(after: torch.cuda.Event) -> int:
        value[0] += 1
        reached = torch.cuda.Event()
        reached.record()
        code = wait(stream.cuda_stream, device_ptr.value, value[0], 0)  # CU_STREAM_WAIT_VALUE_GEQ
        if code:
            raise RuntimeError(f"cuStreamWaitValue32_v2 returned {code}")
        after.record()
        seen = _seen_done(reached)  # the host learns of the arrival by polling, in Python
        if seen is None:
            raise RuntimeError("the stream did not reach the gate within 2 s")
        while time.time_ns() < seen + HOLD_NS:
            pass
        cell.value = value[0]
        return time.time_ns() - seen

    return _gated(samples, gate, unstick=lambda: setattr(cell, "value", 1 << 30))


def sleep_kernel(samples: int) -> dict:
    """ns per cycle of torch.cuda._sleep, and how far one rate is off at 20 µs to 5 ms."""

    def timed_ns(cycles: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e6

    timed_ns(1_000_000)
    rate = statistics.median(timed_ns(10_000_000) / 10_000_000 for _ in range(5))
    off = {}
    for target_us in (20, 100, 1000, 5000):
        got = [timed_ns(int(target_us * 1e3 / rate)) - target_us * 1e3 for _ in range(max(5, samples // 10))]
        off[f"{target_us}_us"] = _summary([abs(g) for g in got])
    return {"ns_per_cycle": round(rate, 4), "abs_error": off}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: no CUDA device: this measures CUDA streams", file=sys.stderr)
        return 2
    torch.zeros(1, device="cuda")
    result: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                    "hold_us": HOLD_NS / 1e3, "switch_interval_ms": sys.getswitchinterval() * 1e3}  # fmt: skip
    ways = [("sleep_kernel", sleep_kernel, False)] + [
        (f"{way.__name__}_{'busy' if busy else 'idle'}", way, busy)
        for way in (compiled_host_fn, python_host_fn, wait_value)
        for busy in (False, True)
    ]
    for name, way, busy in ways:
        try:
            with _Busy(busy):
                result[name] = way(args.samples)
        except Exception as error:  # each on its own: one that fails leaves the others
            result[name] = {"error": f"{type(error).__name__}: {error}"}
        torch.cuda.synchronize()
        print(name, json.dumps(result[name]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
