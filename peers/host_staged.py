"""A real backend for CUDA tensors of members that share one GPU: through host memory over gloo.

NCCL refuses two members of a communicator on one device ("Duplicate GPU detected"), and a
one-GPU host runs a pipeline's stages together in the capture's value pass. There the delegated
groups copy each call's CUDA tensors to host memory, run the call on gloo, and copy what it
received back when the program waits. The value pass records values, not times, so the copies'
cost does not matter; a timed run has one real process per GPU and uses NCCL.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.distributed as dist

from prism.peers.delegate import ForwardingWork

SHARED_GPU_ENV = "PRISM_SHARED_GPU"
"""Set to 1 in processes that run together on fewer GPUs than there are of them."""


def gpu_shared() -> bool:
    return os.environ.get(SHARED_GPU_ENV) == "1"


class HostStagedBackend:
    """send, recv, all-reduce, broadcast and barrier of CUDA tensors on a gloo backend."""

    supports_coalescing = False

    def __init__(self, gloo: dist.Backend) -> None:
        self._gloo = gloo

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> dist.Work:
        staged = _on_host(tensors)
        return ForwardingWork([self._gloo.send(staged, dst, tag)])

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> dist.Work:
        staged = _host_buffers(tensors)
        return ForwardingWork([self._gloo.recv(staged, src, tag)], on_done=_copy_back(staged, tensors))

    def allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions) -> dist.Work:
        staged = _on_host(tensors)
        return ForwardingWork([self._gloo.allreduce(staged, opts)], on_done=_copy_back(staged, tensors))

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions) -> dist.Work:
        staged = _on_host(tensors)
        return ForwardingWork([self._gloo.broadcast(staged, opts)], on_done=_copy_back(staged, tensors))

    def barrier(self, opts: dist.BarrierOptions) -> dist.Work:
        return self._gloo.barrier(opts)

    def __getattr__(self, name: str) -> object:
        raise NotImplementedError(
            f"prism: members sharing one GPU exchange CUDA tensors through host memory by send, recv, "
            f"all_reduce, broadcast and barrier only, not {name}; give each rank of the batch a GPU of its own"
        )


def _on_host(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().to("cpu", copy=True).contiguous() for t in tensors]


def _host_buffers(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty(t.shape, dtype=t.dtype) for t in tensors]


def _copy_back(staged: list[torch.Tensor], tensors: list[torch.Tensor]) -> Callable[[], None]:
    def copy() -> None:
        with torch.no_grad():
            for out, host in zip(tensors, staged, strict=True):
                out.copy_(host)

    return copy
