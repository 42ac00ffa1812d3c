"""The torch.distributed entry points of the prism group: what each call means, virtual or real.

Every method names the payload that is logged, what a virtual group does with the buffers, and
which call of the real backend serves a delegated group; ``ProcessGroupPrism._issue`` does the
rest (logging, the ``prism:comm`` mark, completion).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)

from prism.peers import virtual_data as vd
from prism.peers.delegate import run_coalesced
from prism.peers.recorder import CommOp, split_bytes

_REDUCE_NAMES = {op: name.lower() for name, op in dist.ReduceOp.RedOpType.__members__.items()}


_SUM = dist.ReduceOp.SUM


def _reduce_name(opts) -> str:
    op = opts.reduceOp
    # Most reductions are sums: one comparison, where the table's key (the op's enum, hashed by
    # pybind) costs a µs or more on every call.
    return "sum" if op == _SUM else _REDUCE_NAMES[op.op]


class CollectivesMixin:
    """The collective ProcessGroup methods torch 2.13 calls, from Python (dist.*) or C++ (DDP)."""

    _rank: int
    _size: int
    _issue: Callable[..., dist.Work]
    _global: Callable[[int], int]
    _all_real: bool

    # -- reductions ----------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: AllreduceOptions | None = None) -> dist.Work:
        opts = opts or AllreduceOptions()
        # Virtual: the local tensor stands for every member's contribution and stays as it is.
        return self._issue(
            CommOp.ALL_REDUCE,
            tensors,
            lambda: tensors,
            lambda b: b.allreduce(tensors, opts),
            async_op=opts.asyncOp,
            reduce_op=_reduce_name(opts),
        )

    def allreduce_coalesced(
        self, tensors: list[torch.Tensor], opts: AllreduceCoalescedOptions | None = None
    ) -> dist.Work:
        opts = opts or AllreduceCoalescedOptions()
        return self._issue(
            CommOp.ALL_REDUCE,
            tensors,
            lambda: tensors,
            lambda b: b.allreduce_coalesced(tensors, opts),
            async_op=opts.asyncOp,
            reduce_op=_reduce_name(opts),
        )

    def reduce(self, tensors: list[torch.Tensor], opts: ReduceOptions | None = None) -> dist.Work:
        opts = opts or ReduceOptions()
        return self._issue(
            CommOp.REDUCE,
            tensors,
            lambda: tensors,
            lambda b: b.reduce(tensors, opts),
            async_op=opts.asyncOp,
            reduce_op=_reduce_name(opts),
            peer=self._global(opts.rootRank),
        )

    def reduce_scatter(
        self,
        outputs: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: ReduceScatterOptions | None = None,
    ) -> dist.Work:
        opts = opts or ReduceScatterOptions()

        def virtual() -> object:
            for out, chunks in zip(outputs, input_lists, strict=True):
                out.copy_(chunks[self._rank])
            return outputs

        return self._issue(
            CommOp.REDUCE_SCATTER,
            input_lists[0],
            virtual,
            lambda b: b.reduce_scatter(outputs, input_lists, opts),
            async_op=opts.asyncOp,
            reduce_op=_reduce_name(opts),
        )

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: ReduceScatterOptions | None = None
    ) -> dist.Work:
        opts = opts or ReduceScatterOptions()

        def virtual() -> object:
            vd.own_chunk_into(output, input, self._rank, self._size)
            return [output]

        return self._issue(
            CommOp.REDUCE_SCATTER,
            [input],
            virtual,
            lambda b: b._reduce_scatter_base(output, input, opts),
            async_op=opts.asyncOp,
            reduce_op=_reduce_name(opts),
        )

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: ReduceScatterOptions | None = None,
    ) -> dist.Work:
        opts = opts or ReduceScatterOptions()

        def virtual() -> object:
            for out, inp in zip(outputs, inputs, strict=True):
                vd.own_chunk_into(out, inp, self._rank, self._size)
            return outputs

        def real(b: dist.Backend) -> dist.Work:
            pairs = zip(outputs, inputs, strict=True)
            return run_coalesced(
                b, outputs[0].device, [partial(b._reduce_scatter_base, o, i, opts) for o, i in pairs]
            )

        return self._issue(
            CommOp.REDUCE_SCATTER, inputs, virtual, real, async_op=opts.asyncOp, reduce_op=_reduce_name(opts)
        )

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- gathers -------------------------------------------------------------------------------
    def allgather(
        self,
        output_lists: list[list[torch.Tensor]],
        inputs: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> dist.Work:
        opts = opts or AllgatherOptions()

        def virtual() -> object:
            for outs, inp in zip(output_lists, inputs, strict=True):
                for out in outs:  # every member "sent" what this rank holds
                    out.copy_(inp)
            return output_lists

        return self._issue(
            CommOp.ALL_GATHER,
            inputs,
            virtual,
            lambda b: b.allgather(output_lists, inputs, opts),
            async_op=opts.asyncOp,
        )

    def allgather_coalesced(
        self,
        output_lists: list[list[torch.Tensor]],
        inputs: list[torch.Tensor],
        opts: AllgatherOptions | None = None,
    ) -> dist.Work:
        opts = opts or AllgatherOptions()

        def virtual() -> object:
            for outs, inp in zip(output_lists, inputs, strict=True):
                for out in outs:
                    out.copy_(inp)
            return output_lists

        return self._issue(
            CommOp.ALL_GATHER,
            inputs,
            virtual,
            lambda b: b.allgather_coalesced(output_lists, inputs, opts),
            async_op=opts.asyncOp,
        )

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: AllgatherOptions | None = None
    ) -> dist.Work:
        opts = opts or AllgatherOptions()

        def virtual() -> object:
            vd.replicate_into(output, input, self._size)
            return [output]

        return self._issue(
            CommOp.ALL_GATHER,
            [input],
            virtual,
            lambda b: b._allgather_base(output, input, opts),
            async_op=opts.asyncOp,
        )

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: AllgatherOptions | None = None
    ) -> dist.Work:
        opts = opts or AllgatherOptions()

        def virtual() -> object:
            for out, inp in zip(outputs, inputs, strict=True):
                vd.replicate_into(out, inp, self._size)
            return outputs

        def real(b: dist.Backend) -> dist.Work:
            pairs = zip(outputs, inputs, strict=True)
            return run_coalesced(
                b, outputs[0].device, [partial(b._allgather_base, o, i, opts) for o, i in pairs]
            )

        return self._issue(CommOp.ALL_GATHER, inputs, virtual, real, async_op=opts.asyncOp)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(
        self,
        output_lists: list[list[torch.Tensor]],
        inputs: list[torch.Tensor],
        opts: GatherOptions | None = None,
    ) -> dist.Work:
        opts = opts or GatherOptions()

        def virtual() -> object:
            if self._rank == opts.rootRank:
                vd.own_slot_else_standin(output_lists[0], inputs[0], self._rank)
            return output_lists

        return self._issue(
            CommOp.GATHER,
            inputs,
            virtual,
            lambda b: b.gather(output_lists, inputs, opts),
            async_op=opts.asyncOp,
            peer=self._global(opts.rootRank),
        )

    # -- one to many, many to many ---------------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: BroadcastOptions | None = None) -> dist.Work:
        opts = opts or BroadcastOptions()

        def virtual() -> object:
            if self._rank != opts.rootRank:
                for t in tensors:  # the data would come from a virtual root
                    vd.keep_own_else_standin(t)
            return tensors

        return self._issue(
            CommOp.BROADCAST,
            tensors,
            virtual,
            lambda b: b.broadcast(tensors, opts),
            async_op=opts.asyncOp,
            peer=self._global(opts.rootRank),
        )

    def scatter(
        self,
        outputs: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: ScatterOptions | None = None,
    ) -> dist.Work:
        opts = opts or ScatterOptions()

        def virtual() -> object:
            if self._rank == opts.rootRank:
                outputs[0].copy_(input_lists[0][self._rank])
            else:
                vd.fill_standin(outputs[0])
            return outputs

        return self._issue(
            CommOp.SCATTER,
            outputs,
            virtual,
            lambda b: b.scatter(outputs, input_lists, opts),
            async_op=opts.asyncOp,
            peer=self._global(opts.rootRank),
        )

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: AllToAllOptions | None = None,
    ) -> dist.Work:
        opts = opts or AllToAllOptions()

        def virtual() -> object:
            vd.all_to_all_into(output, input, output_split_sizes, input_split_sizes, self._rank, self._size)
            return [output]

        return self._issue(
            CommOp.ALL_TO_ALL,
            [input],
            virtual,
            lambda b: b.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts),
            async_op=opts.asyncOp,
            split_bytes=split_bytes(input, input_split_sizes, self._size),
        )

    alltoall_base = all_to_all_single

    def alltoall(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: AllToAllOptions | None = None
    ) -> dist.Work:
        opts = opts or AllToAllOptions()

        def virtual() -> object:
            vd.mirror_slots(outputs, inputs)
            return outputs

        return self._issue(
            CommOp.ALL_TO_ALL,
            inputs,
            virtual,
            lambda b: b.alltoall(outputs, inputs, opts),
            async_op=opts.asyncOp,
            split_bytes=tuple(t.numel() * t.element_size() for t in inputs),
        )

    def barrier(self, opts: BarrierOptions | None = None) -> dist.Work:
        opts = opts or BarrierOptions()
        device = (
            opts.device if opts.device is not None and opts.device.type != "meta" else torch.device("cpu")
        )
        return self._issue(
            CommOp.BARRIER, [], lambda: [], lambda b: b.barrier(opts), async_op=opts.asyncOp, device=device
        )
