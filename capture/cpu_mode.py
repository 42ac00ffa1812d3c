"""CPU mode: a program written for GPUs runs on a CPU dev box, its set-up calls answered for the CPU.

Frameworks written for GPUs (torchtitan among them) ask torch which accelerator there is, fall back
to ``"cuda"`` when none is, and then ask that device's module for its name, its memory and its
statistics, or pass it to ``barrier(device_ids=...)``. With ``--device cpu`` prism answers these
few set-up calls for the CPU in every rank process it starts (capture, replay, and the real runs
it measures against), and changes nothing the program computes:

- ``torch._utils._get_available_device_type()`` says ``"cpu"`` where no accelerator is found
  (it says None, which such programs read as CUDA);
- ``torch.cpu`` gains the device-module calls it lacks: ``get_device_name`` (the processor),
  ``get_device_properties`` (name, ``total_memory`` = the machine's memory),
  ``memory_stats`` (empty: the CPU allocator keeps no statistics; prism measures a rank's memory
  itself), ``reset_peak_memory_stats`` and ``empty_cache`` (nothing to do);
- ``torch.distributed.barrier(device_ids=...)`` with CPU device ids (``["cpu"]``, what
  ``torch.cpu.current_device()`` returns) drops them: device ids name GPUs for NCCL;
- ``ReduceOp.PREMUL_SUM(s)`` (FSDP2's gradient reduction under a divide factor, as torchtitan
  sets it), which gloo refuses: the input is multiplied by ``s`` and reduced with ``SUM``, what
  NCCL computes inside its kernel (``all_reduce``, ``reduce_scatter_tensor`` / ``_single``);
- ``all_to_all`` of lists whose tensors differ in size (a mixture of experts' token dispatch, as
  torchtitan makes it), which gloo refuses: the inputs, flattened and concatenated, go through
  ``all_to_all_single`` with the tensors' sizes as splits, and the outputs are copied back, what
  NCCL's grouped sends and receives deliver;
- FlexAttention on CPU with gradients: torch refuses its backward on CPU, compiled or not
  (``flex_attention._validate_device``), and inductor cannot lower it. ``torch.compile`` of
  ``flex_attention`` gives a function that, on CPU, runs FlexAttention's own dense implementation
  (the one torch runs uncompiled) with that check lifted for the call: the same attention, its
  forward and gradients within float rounding of ``scaled_dot_product_attention``'s; on any other
  device the compiled kernel as asked.

A CUDA call made anyway (``torch.cuda.set_device``, ``synchronize``, memory statistics, ...) has
no CPU answer: it raises ``UnsupportedCall`` naming the call and the program's line, instead of
torch's "no NVIDIA driver" from deep inside the framework.
"""

from __future__ import annotations

import functools
import inspect
import platform
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import torch
import torch._utils
import torch.distributed as dist
import torch.nn.attention.flex_attention as flex

from prism.capture.interpose import UnsupportedCall, program_line, replace_everywhere

CUDA_CALLS = (
    "set_device", "current_device", "synchronize", "get_device_name", "get_device_properties",
    "get_device_capability", "memory_stats", "memory_allocated", "max_memory_allocated",
    "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats", "mem_get_info",
)  # fmt: skip
"""``torch.cuda`` calls that raise ``UnsupportedCall`` in CPU mode."""


@dataclass(frozen=True)
class CpuProperties:
    """What ``torch.cpu.get_device_properties`` answers: the fields programs read of a device."""

    name: str
    total_memory: int
    """The machine's memory, bytes."""


def _processor() -> str:
    return platform.processor() or platform.machine() or "cpu"


def _cpu_module_calls() -> dict[str, Callable]:
    return {
        "get_device_name": lambda device=None: _processor(),
        "get_device_properties": lambda device=None: CpuProperties(
            _processor(), psutil.virtual_memory().total
        ),
        "memory_stats": lambda device=None: {},
        "reset_peak_memory_stats": lambda device=None: None,
        "empty_cache": lambda: None,
    }


def _unsupported(name: str) -> Callable:
    def call(*args: object, **kwargs: object) -> None:
        raise UnsupportedCall(
            f"torch.cuda.{name} at {program_line()}: prism runs this program on the CPU (--device cpu), "
            "where a CUDA call has no answer; prism's CPU mode answers the device module torch reports "
            "(torch.cpu) and barrier device ids, see docs/capture.md (CPU mode)"
        )

    return call


def _barrier_without_cpu_ids(barrier: Callable) -> Callable:
    @functools.wraps(barrier)
    def call(group=None, async_op=False, device_ids=None):  # noqa: ANN001, ANN202
        if device_ids is not None and all(not isinstance(d, int) for d in device_ids):
            device_ids = None  # CPU ids ("cpu"): device ids name GPUs, for NCCL
        return barrier(group=group, async_op=async_op, device_ids=device_ids)

    return call


def _flex_attention_on_cpu(compiled: Callable) -> Callable:
    dense = flex.flex_attention

    def attention(query, key, value, *args, **kwargs):  # noqa: ANN001, ANN202
        if query.device.type != "cpu":
            return compiled(query, key, value, *args, **kwargs)
        check = flex._validate_device
        flex._validate_device = lambda *_: None  # the dense implementation has a CPU backward
        try:
            return dense(query, key, value, *args, **kwargs)
        finally:
            flex._validate_device = check

    return attention


def _compile_flex_attention_densely(compile_: Callable) -> Callable:
    @functools.wraps(compile_)
    def compile(model=None, **kwargs):  # noqa: ANN001, ANN202
        if model is None:  # torch.compile(options=...)(fn)
            return lambda fn: compile(fn, **kwargs)
        if model is flex.flex_attention:
            return _flex_attention_on_cpu(compile_(model, **kwargs))
        return compile_(model, **kwargs)

    return compile


def _premul_sum_as_sum(call: Callable, operand: str) -> Callable:
    """``call`` (a collective taking ``op``) with PREMUL_SUM(s) done as ``operand * s`` then SUM."""
    signature = inspect.signature(call)
    position = list(signature.parameters).index("op")

    @functools.wraps(call)
    def reduce(*args: object, **kwargs: object) -> object:
        op = args[position] if len(args) > position else kwargs.get("op")
        # A plain op is its RedOpType; only PREMUL_SUM pays for binding the arguments.
        if getattr(op, "op", None) == dist.ReduceOp.RedOpType.PREMUL_SUM:
            bound = signature.bind(*args, **kwargs)
            _, scale = op.__getstate__()
            tensor = bound.arguments[operand]
            if operand == "tensor":  # in place: all_reduce overwrites it anyway
                tensor.mul_(scale)
            else:
                bound.arguments[operand] = tensor * scale
            bound.arguments["op"] = dist.ReduceOp.SUM
            return call(*bound.args, **bound.kwargs)
        return call(*args, **kwargs)

    return reduce


class _CopiedBack:
    """The work of an asynchronous uneven ``all_to_all``: waiting copies the received chunks out."""

    def __init__(self, work: dist.Work, copy_back: Callable[[], None]) -> None:
        self._work, self._copy_back, self._done = work, copy_back, False

    def wait(self, timeout: object = None) -> bool:
        self._work.wait() if timeout is None else self._work.wait(timeout)
        if not self._done:
            self._copy_back()
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done


def _uneven_all_to_all_as_single(call: Callable) -> Callable:
    """``dist.all_to_all`` whose lists hold tensors of several sizes done by ``all_to_all_single``."""

    @functools.wraps(call)
    def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):  # noqa: ANN001, ANN202
        if len({t.shape for t in (*output_tensor_list, *input_tensor_list)}) <= 1:
            return call(output_tensor_list, input_tensor_list, group=group, async_op=async_op)
        sent = torch.cat([t.reshape(-1) for t in input_tensor_list])
        received = sent.new_empty(sum(t.numel() for t in output_tensor_list))
        out_splits = [t.numel() for t in output_tensor_list]
        in_splits = [t.numel() for t in input_tensor_list]

        def copy_back() -> None:
            for tensor, chunk in zip(output_tensor_list, received.split(out_splits), strict=True):
                tensor.copy_(chunk.view(tensor.shape))

        work = dist.all_to_all_single(received, sent, out_splits, in_splits, group=group, async_op=async_op)
        if async_op:
            return _CopiedBack(work, copy_back)
        copy_back()
        return None

    return all_to_all


_installed = False


def install_cpu_mode() -> None:
    """Answer a GPU program's set-up calls for the CPU in this process (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    detect = torch._utils._get_available_device_type
    torch._utils._get_available_device_type = lambda: detect() or "cpu"
    for name, call in _cpu_module_calls().items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, call)
    if not torch.cuda.is_available():
        for name in CUDA_CALLS:
            setattr(torch.cuda, name, _unsupported(name))
    replace_everywhere(dist.barrier, _barrier_without_cpu_ids(dist.barrier))
    torch.compile = _compile_flex_attention_densely(torch.compile)
    replace_everywhere(dist.all_reduce, _premul_sum_as_sum(dist.all_reduce, "tensor"))
    replace_everywhere(dist.all_to_all, _uneven_all_to_all_as_single(dist.all_to_all))
    for name in ("reduce_scatter_tensor", "reduce_scatter_single"):  # the latter: torch >= 2.14's name
        if hasattr(dist, name):
            call = getattr(dist, name)
            replace_everywhere(call, _premul_sum_as_sum(call, "input"))
