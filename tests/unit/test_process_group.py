"""The prism backend in one process: one real rank, every peer virtual (HashStore, no sockets)."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from prism.peers.backend import BACKEND_NAME, VirtualWorld, activate, current_comm_log
from prism.peers.clock import CommClock, Completion, FreeRunningClock, ImmediateClock, PendingCall
from prism.peers.host_work import HostWork
from prism.peers.process_group import GroupMode, ProcessGroupPrism, _pending
from prism.peers.recorder import CommRecorder
from prism.peers.standin import standin_values
from prism.schemas.annotations import Phase, group_label, try_parse_mark
from prism.schemas.comm_log import CallSite, CommCall, HeldTime, read_comm_log, write_comm_log
from prism.schemas.layout import ParallelLayout

LAYOUT = ParallelLayout(tp=2, pp=2, dp=2)  # rank 5: tp 1, dp 0, pp 1
RANK = 5
DELAY_NS = 50_000_000


def layout_labeler(layout: ParallelLayout) -> Callable[[tuple[int, ...]], str | None]:
    def label(ranks: tuple[int, ...]) -> str | None:
        found = layout.group_of_ranks(ranks)
        return None if found is None else group_label(*found)

    return label


LABELER = layout_labeler(LAYOUT)


class FixedDelayClock(ImmediateClock):
    """Every virtual call completes DELAY_NS after it was made."""

    def __init__(self) -> None:
        self.seen: list[PendingCall] = []

    def completion_ns(self, call: PendingCall) -> int | None:
        self.seen.append(call)
        return call.enter_ns + DELAY_NS


@pytest.fixture
def start() -> Iterator[Callable[..., None]]:
    """start(rank, world_size, ...) joins a prism world in this process; left again after the test."""

    def _start(
        rank: int = RANK,
        world_size: int = LAYOUT.world_size,
        *,
        real=None,
        clock: CommClock | None = None,
        labeler=LABELER,
        host_work=None,
    ) -> None:
        real = frozenset({rank}) if real is None else real
        world = VirtualWorld(
            real_ranks=real, clock=clock or FreeRunningClock(), labeler=labeler, host_work=host_work
        )
        activate(world)
        dist.init_process_group(BACKEND_NAME, rank=rank, world_size=world_size, store=dist.HashStore())

    yield _start
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def world(start: Callable[..., None]) -> None:
    start()


def calls() -> list[CommCall]:
    return list(current_comm_log().calls)


def last_call() -> CommCall:
    return calls()[-1]


def group_of(axis: str) -> dist.ProcessGroup:
    return dist.new_group(list(LAYOUT.group(RANK, axis)), use_local_synchronization=True)


# -- identity and groups ---------------------------------------------------------------------------
def test_default_group_identity(world: None) -> None:
    assert dist.get_backend() == BACKEND_NAME
    assert (dist.get_rank(), dist.get_world_size()) == (RANK, 8)
    pg = dist.distributed_c10d._get_default_group()
    assert isinstance(pg, ProcessGroupPrism) and pg.mode is GroupMode.VIRTUAL
    assert pg.group_desc == "default_pg" and pg.group_name == dist.distributed_c10d._get_process_group_name(
        pg
    )
    group = current_comm_log().groups[0]
    assert (group.label, group.ranks, group.real_ranks) == ("world", tuple(range(8)), (RANK,))


def test_subgroups_are_labelled_and_non_members_stay_out(world: None) -> None:
    tp, dp, pp = group_of("tp"), group_of("dp"), group_of("pp")
    odd = dist.new_group([3, 5, 6], use_local_synchronization=True)
    assert dist.new_group([0, 1]) == dist.GroupMember.NON_GROUP_MEMBER  # no call into the backend
    # torch 2.13 answers a non-member's locally synchronised group with None, 2.14 as above.
    assert dist.new_group([2, 3], use_local_synchronization=True) in (None, dist.GroupMember.NON_GROUP_MEMBER)
    for pg, axis in ((tp, "tp"), (dp, "dp"), (pp, "pp")):
        assert pg.label == group_label(axis, LAYOUT.group_index(RANK, axis))
        assert dist.get_process_group_ranks(pg) == list(LAYOUT.group(RANK, axis))
        assert dist.get_backend(pg) == BACKEND_NAME
    assert odd.label == f"g{odd.group_name}"
    logged = {g.name: g for g in current_comm_log().groups}
    assert set(logged) == {
        dist.distributed_c10d._get_process_group_name(g) for g in (dist.group.WORLD, tp, dp, pp, odd)
    }
    assert logged[odd.group_name].ranks == (3, 5, 6) and logged[odd.group_name].real_ranks == (5,)


def test_thousands_of_virtual_subgroups_at_8192(start: Callable[..., None]) -> None:
    layout = ParallelLayout(tp=8, pp=16, dp=64)
    rank = 4321
    start(rank, layout.world_size, labeler=layout_labeler(layout))
    dp_groups = [dist.new_group(list(g), use_local_synchronization=True) for g in layout.groups("dp")]
    mine = [g for g in dp_groups if g not in (None, dist.GroupMember.NON_GROUP_MEMBER)]
    assert len(mine) == 1 and mine[0].label == f"dp.{layout.group_index(rank, 'dp')}"
    out = torch.empty(64 * 3)
    dist.all_gather_single(out, torch.tensor([1.0, 2.0, 3.0]), group=mine[0])
    assert torch.equal(out.view(64, 3), torch.tensor([[1.0, 2.0, 3.0]]).expand(64, 3))
    call = last_call()
    assert (call.label, call.group_size, call.bytes) == (mine[0].label, 64, 12)


# -- virtual semantics -------------------------------------------------------------------------------
@pytest.mark.parametrize("op", [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG])
def test_all_reduce_leaves_the_local_tensor(world: None, op: dist.ReduceOp) -> None:
    t = torch.arange(6, dtype=torch.float32).view(2, 3)
    dist.all_reduce(t, op=op)
    assert torch.equal(t, torch.arange(6, dtype=torch.float32).view(2, 3))
    call = last_call()
    assert (call.op, call.label, call.group_size, call.gseq) == ("all_reduce", "world", 8, 0)
    assert (call.bytes, call.dtype, call.shape, call.reduce_op) == (24, "float32", (2, 3), op.name.lower())
    assert not call.async_op and not call.delegated and call.peer is None
    assert 0 < call.enter_ns <= call.done_ns <= call.exit_ns


# torch 2.13 still offers the older names; each must reach the group.
DEPRECATED = pytest.mark.filterwarnings("ignore::FutureWarning")


@DEPRECATED
@pytest.mark.parametrize(
    "entry", [dist.all_gather_single, dist.all_gather_into_tensor, dist._all_gather_base]
)
def test_all_gather_fills_every_slot_with_the_local_input(world: None, entry: Callable) -> None:
    tp = group_of("tp")
    src = torch.tensor([[1, 2], [3, 4]], dtype=torch.bfloat16)
    slots = [torch.full((2, 2), float("nan"), dtype=torch.bfloat16) for _ in range(2)]
    dist.all_gather(slots, src, group=tp)
    assert all(torch.equal(s, src) for s in slots)
    flat = torch.full((4, 2), float("nan"), dtype=torch.bfloat16)
    entry(flat, src, group=tp)
    assert torch.equal(flat, torch.cat([src, src]))
    list_call, tensor_call = calls()[-2:]
    for call in (list_call, tensor_call):
        assert (call.op, call.bytes, call.dtype, call.shape, call.label) == (
            "all_gather",
            8,
            "bfloat16",
            (2, 2),
            tp.label,
        )
    assert (list_call.gseq, tensor_call.gseq) == (0, 1)


@DEPRECATED
@pytest.mark.parametrize(
    "entry", [dist.reduce_scatter_single, dist.reduce_scatter_tensor, dist._reduce_scatter_base]
)
def test_reduce_scatter_writes_this_ranks_own_chunk(world: None, entry: Callable) -> None:
    dp = group_of("dp")  # (5, 7): rank 5 is group rank 0
    out = torch.empty(3)
    entry(out, torch.arange(6.0), group=dp)
    assert torch.equal(out, torch.tensor([0.0, 1.0, 2.0]))
    pp = group_of("pp")  # (1, 5): group rank 1
    dist.reduce_scatter(out, [torch.zeros(3), torch.ones(3) * 7], group=pp)
    assert torch.equal(out, torch.full((3,), 7.0))
    first, second = calls()[-2:]
    assert (first.op, first.bytes, first.shape, first.reduce_op) == ("reduce_scatter", 24, (6,), "sum")
    assert (second.bytes, second.shape, second.label) == (24, (2, 3), pp.label)


def test_broadcast_from_a_virtual_root_keeps_the_ranks_own_finite_values(world: None) -> None:
    # The root holds what this rank holds (DDP's shape check and parameter sync, a seed) ...
    shapes = torch.tensor([1024, 256], dtype=torch.int64)
    dist.broadcast(shapes, src=2)
    assert shapes.tolist() == [1024, 256]
    weights = torch.arange(5.0)
    dist.broadcast(weights, src=2)
    assert torch.equal(weights, torch.arange(5.0))
    # ... but an uninitialised receive buffer must not hand the program NaNs.
    t = torch.full((5,), float("nan"))
    dist.broadcast(t, src=2)
    assert torch.equal(t, standin_values(5, torch.float32)) and torch.isfinite(t).all()
    own = torch.arange(5.0)
    dist.broadcast(own, src=RANK)
    assert torch.equal(own, torch.arange(5.0))
    assert [c.peer for c in calls()] == [2, 2, 2, RANK]


def test_stand_ins_are_finite_deterministic_copies_and_zero_for_integers(world: None) -> None:
    a, b = torch.empty(3000), torch.empty(3000)
    dist.recv(a, src=1)
    dist.recv(b, src=2)
    assert torch.equal(a, b) and torch.isfinite(a).all() and 0.5 < a.std() < 1.5
    a.add_(1)  # the receive was a copy: the cached source is unchanged
    dist.recv(b, src=3)
    assert torch.equal(b, standin_values(3000, torch.float32))
    ints, flags = torch.full((4,), 7, dtype=torch.int64), torch.ones(4, dtype=torch.bool)
    dist.recv(ints, src=1)
    dist.recv(flags, src=1)
    assert not ints.any() and not flags.any()


@pytest.mark.parametrize("splits", [None, [1, 0, 2, 1, 3, 2, 1, 2]])
def test_all_to_all_peers_mirror_this_rank(world: None, splits: list[int] | None) -> None:
    """Every virtual peer sends back what this rank sends it: a mixture of experts' token counts
    received equal those sent, and the splits they give match (what it receives equals what it sends)."""
    rows = 8 if splits is None else sum(splits)
    inp = torch.arange(rows * 2, dtype=torch.float32).view(rows, 2) + 100
    out = torch.full((rows, 2), float("nan"))
    dist.all_to_all_single(out, inp, output_split_sizes=splits, input_split_sizes=splits)
    assert torch.equal(out, inp)
    assert (last_call().op, last_call().bytes) == ("all_to_all", rows * 2 * 4)
    # What it sends each member: its split's rows, or an even share without splits.
    assert last_call().split_bytes == tuple(c * 2 * 4 for c in (splits or [1] * 8))
    counts = torch.tensor([3, 0, 1, 2, 5, 1, 0, 4])  # tokens this rank routes to each peer's experts
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts)
    assert torch.equal(received, counts)


def test_all_to_all_chunks_of_another_length_are_stand_ins(world: None) -> None:
    sent, expected = [1] * 8, [1, 1, 1, 1, 1, 1, 1, 2]  # the last peer is to send 2 rows, this rank sent it 1
    out = torch.full((9, 2), float("nan"))
    dist.all_to_all_single(
        out, torch.arange(16.0).view(8, 2) + 100, output_split_sizes=expected, input_split_sizes=sent
    )
    assert torch.equal(out[:7], torch.arange(14.0).view(7, 2) + 100)
    assert torch.isfinite(out).all() and (out[7:] < 100).all()
    outs = [torch.full((1,), float("nan")) for _ in range(7)] + [torch.full((2,), float("nan"))]
    dist.all_to_all(outs, [torch.tensor([float(j)]) for j in range(8)])
    assert [float(o) for o in outs[:7]] == list(range(7)) and torch.isfinite(outs[7]).all()
    assert last_call().split_bytes == (4,) * 8


def test_a_call_that_raises_is_not_logged(world: None) -> None:
    with pytest.raises(ValueError, match="expected 16"):
        dist.all_gather_single(torch.empty(3), torch.ones(2))  # 8 members x 2 elements
    dist.all_reduce(torch.ones(1))
    assert [c.op for c in calls()] == ["all_reduce"]


def test_barrier_is_logged(world: None) -> None:
    dist.barrier()
    call = last_call()
    assert (call.op, call.bytes, call.label) == ("barrier", 0, "world")


# -- point to point -------------------------------------------------------------------------------------
def test_p2p_logs_global_peers_tags_and_sync_mode(world: None) -> None:
    dp = group_of("dp")  # (5, 7)
    dist.send(torch.ones(4), group=dp, group_dst=1, tag=3)
    work = dist.irecv(buf := torch.empty(2, 2), group=dp, group_src=1)
    work.wait()
    assert torch.isfinite(buf).all()
    dist.isend(torch.ones(2), dst=1).wait()
    send, recv, isend = calls()
    assert (send.op, send.peer, send.tag, send.async_op, send.bytes, send.gseq) == (
        "send",
        7,
        3,
        False,
        16,
        0,
    )
    assert (recv.op, recv.peer, recv.async_op, recv.shape, recv.gseq) == ("recv", 7, True, (2, 2), 1)
    assert (isend.peer, isend.label, isend.async_op, isend.gseq) == (1, "world", True, 0)


def test_batch_isend_irecv_runs_each_op_as_an_async_p2p(world: None) -> None:
    pp = group_of("pp")  # (1, 5)
    inbox = torch.full((3,), float("nan"))
    ops = [dist.P2POp(dist.isend, torch.ones(3), 1, group=pp), dist.P2POp(dist.irecv, inbox, 1, group=pp)]
    works = dist.batch_isend_irecv(ops)
    assert len(works) == 2
    for work in works:
        work.wait()
    assert torch.isfinite(inbox).all()
    assert [(c.op, c.peer, c.async_op, c.gseq) for c in calls()] == [
        ("send", 1, True, 0),
        ("recv", 1, True, 1),
    ]


def test_recv_from_any_source_is_refused_with_virtual_peers(world: None) -> None:
    with pytest.raises(NotImplementedError, match="any source"):
        dist.recv(torch.empty(1))


# -- sequence numbers, async, coalescing -------------------------------------------------------------------
def test_gseq_counts_per_group_and_seq_across_groups(world: None) -> None:
    tp, dp = group_of("tp"), group_of("dp")
    t = torch.ones(2)
    for group in (None, tp, tp, dp, None, tp):
        dist.all_reduce(t, group=group)
    log = calls()
    assert [c.seq for c in log] == list(range(6))
    assert [(c.label, c.gseq) for c in log] == [
        ("world", 0),
        (tp.label, 0),
        (tp.label, 1),
        (dp.label, 0),
        ("world", 1),
        (tp.label, 2),
    ]
    assert {c.group for c in log} == {dist.group.WORLD.group_name, tp.group_name, dp.group_name}


def test_async_works_complete_and_carry_results(world: None) -> None:
    t = torch.ones(3)
    work = dist.all_reduce(t, async_op=True)
    assert work.wait() and work.is_completed()
    assert work.get_future().value()[0] is t
    out = torch.empty(8)
    work = dist.all_gather_single(out, torch.ones(1), async_op=True)
    work.wait()
    assert torch.equal(out, torch.ones(8))
    assert [c.async_op for c in calls()] == [True, True]


def test_coalesced_calls_are_one_logged_call_each(world: None) -> None:
    a, b = torch.ones(3), torch.ones(5)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    outs, ins = [torch.empty(8), torch.empty(16)], [torch.ones(1), torch.full((2,), 2.0)]
    with dist._coalescing_manager():
        for out, inp in zip(outs, ins, strict=True):
            dist.all_gather_single(out, inp)
    assert torch.equal(outs[1], torch.full((16,), 2.0))
    assert [(c.op, c.bytes, c.shape, c.gseq) for c in calls()] == [
        ("all_reduce", 32, (8,), 0),
        ("all_gather", 12, (3,), 1),
    ]


def test_coalescing_with_a_device_returns_one_work_for_the_group(world: None) -> None:
    # The older protocol: torch brackets the calls with _start/_end_coalescing on the group.
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        dist.all_reduce(torch.ones(2))
        dist.all_reduce(torch.ones(3))
    cm.wait()
    assert len(cm.works) == 1 and cm.works[0].is_completed()
    assert [c.bytes for c in calls()] == [20]


def test_ddp_trains_against_virtual_peers(world: None) -> None:
    # Rank 5 is group rank 0 of its dp group (5, 7), the root of DDP's start-up broadcasts, as a
    # capture's representative ranks are (tp and dp index 0).
    dp = group_of("dp")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2), process_group=dp)
    model(torch.randn(3, 4)).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    ops = [c.op for c in calls() if c.label == dp.label]
    assert "broadcast" in ops and ops[-1] == "all_reduce"  # parameter sync, then the gradient bucket


def test_comm_log_round_trips_through_json(world: None, tmp_path: Path) -> None:
    dist.all_reduce(torch.ones(2))
    dist.send(torch.ones(1), dst=0)
    path = tmp_path / "rank5.comm.json"
    write_comm_log(current_comm_log(), path)
    assert read_comm_log(path) == current_comm_log()


# -- clock -------------------------------------------------------------------------------------------------
def test_clock_delays_virtual_completion(start: Callable[..., None]) -> None:
    clock = FixedDelayClock()
    start(clock=clock)
    began = time.time_ns()
    dist.all_reduce(torch.ones(2))  # sync: waits for the clock
    assert time.time_ns() - began >= DELAY_NS
    threads_before = threading.active_count()
    works = [dist.all_reduce(torch.ones(2), async_op=True) for _ in range(20)]
    assert not works[0].is_completed()
    assert threading.active_count() <= threads_before + 1  # one scheduler thread, not one per call
    for work in works:
        work.wait()
    assert time.time_ns() - calls()[1].enter_ns >= DELAY_NS
    for call in calls():
        assert call.done_ns - call.enter_ns >= DELAY_NS
        assert call.done_ns - call.enter_ns < DELAY_NS + 2_000_000_000  # completes at its time, not at exit
    first = clock.seen[0]
    assert (first.op, first.label, first.group_size, first.gseq, first.bytes) == (
        "all_reduce",
        "world",
        8,
        0,
        8,
    )


def test_async_call_returns_before_its_completion_time(start: Callable[..., None]) -> None:
    start(clock=FixedDelayClock())
    work = dist.isend(torch.ones(1), dst=0)
    returned = time.time_ns()
    work.wait()
    call = last_call()
    assert call.exit_ns <= returned < call.enter_ns + DELAY_NS <= call.done_ns


class SlowClock(FixedDelayClock):
    """A FixedDelayClock that takes CLOCK_NS of the caller's time to answer (an engine's work)."""

    holds = True

    def completion_ns(self, call: PendingCall) -> int | None:
        time.sleep(CLOCK_NS / 1e9)
        return super().completion_ns(call)


CLOCK_NS = 5_000_000


def test_the_log_says_when_the_program_was_held_waiting_and_in_the_clock(start: Callable[..., None]) -> None:
    start(clock=SlowClock())
    dist.all_reduce(torch.ones(2))  # sync: held until its completion
    waited = last_call()
    assert waited.enter_ns <= waited.wait_ns <= waited.enter_ns + CLOCK_NS + 10_000_000
    assert waited.done_ns - waited.wait_ns >= DELAY_NS - CLOCK_NS - 10_000_000
    assert CLOCK_NS <= waited.clock_ns <= waited.exit_ns - waited.enter_ns
    work = dist.all_reduce(torch.ones(2), async_op=True)
    time.sleep((DELAY_NS + 10_000_000) / 1e9)  # computes past its completion time: never held
    work.wait()
    assert last_call().wait_ns == 0
    held = HeldTime(current_comm_log())
    # All of the sync call but the backend's own few µs before the clock and before the wait.
    assert held.within(waited.enter_ns, waited.done_ns) >= waited.done_ns - waited.enter_ns - 2_000_000


class DeferringClock(ImmediateClock):
    """Names no time when a call is made; the test resolves the calls later."""

    def __init__(self) -> None:
        self.held: list[tuple[PendingCall, Completion]] = []

    def submit(self, call: PendingCall, complete: Completion) -> None:
        self.held.append((call, complete))


def test_a_deferred_call_completes_when_its_clock_names_the_time(start: Callable[..., None]) -> None:
    clock = DeferringClock()
    start(clock=clock)
    recv = dist.irecv(torch.empty(2), src=0)
    send = dist.isend(torch.ones(2), dst=0)
    assert not recv.is_completed() and not send.is_completed()
    (_, complete_recv), (_, complete_send) = clock.held
    complete_send(None)  # the later call is resolved first
    send.wait()
    assert not recv.is_completed()
    complete_recv(time.time_ns() + DELAY_NS)
    recv.wait()
    assert calls()[0].done_ns >= clock.held[0][0].enter_ns + DELAY_NS  # the recv


def test_a_call_whose_time_is_never_named_fails_at_the_timeout() -> None:
    activate(VirtualWorld(real_ranks=frozenset({RANK}), clock=DeferringClock(), labeler=LABELER))
    dist.init_process_group(
        BACKEND_NAME,
        rank=RANK,
        world_size=LAYOUT.world_size,
        store=dist.HashStore(),
        timeout=timedelta(seconds=1),
    )
    try:
        work = dist.irecv(torch.empty(2), src=0)
        began = time.monotonic()
        with pytest.raises(Exception, match="did not complete within 1 s"):
            work.wait()
        assert time.monotonic() - began < 30
    finally:
        dist.destroy_process_group()


# -- membership ----------------------------------------------------------------------------------------------
def test_rank_outside_real_ranks_is_refused(start: Callable[..., None]) -> None:
    with pytest.raises(ValueError, match="real_ranks"):
        start(real=frozenset({0}))


# -- profiler ----------------------------------------------------------------------------------------------
def test_profiler_trace_has_comm_marks_and_distributed_info(world: None, tmp_path: Path) -> None:
    tp = group_of("tp")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dist.all_reduce(torch.ones(4), group=tp)
        dist.broadcast(torch.empty(2), src=0)
        dist.send(torch.ones(8), dst=4)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    info = trace["distributedInfo"]
    assert (info["backend"], info["rank"], info["world_size"]) == (BACKEND_NAME, RANK, 8)
    assert re.search(r'"rank":\s+(\d+)', path.read_text()).group(1) == str(RANK)  # how HTA finds the rank
    marks = [m for e in trace["traceEvents"] if (m := try_parse_mark(e.get("name", ""))) is not None]
    assert [(m.phase, m.op, m.group, m.gseq, m.bytes) for m in marks] == [
        (Phase.COMM, "all_reduce", tp.label, 0, 16),
        (Phase.COMM, "broadcast", "world", 0, 8),
        (Phase.COMM, "send", "world", 1, 32),
    ]


def test_a_pending_call_carries_every_field_of_its_call_site() -> None:
    record = CommRecorder(rank=0, world_size=8).begin(
        op="send", group="3", label="pp.0", group_size=8, gseq=5, bytes=64, dtype="float32", shape=(16,),
        peer=4, tag=7, reduce_op=None, async_op=True, delegated=False,
    )  # fmt: skip
    pending = _pending(record)
    assert {f.name: getattr(pending, f.name) for f in dataclasses.fields(CallSite)} == {
        f.name: getattr(record, f.name) for f in dataclasses.fields(CallSite)
    }


def test_a_virtual_collective_hands_its_host_work_over_with_its_modelled_end(
    start: Callable[..., None],
) -> None:
    asked = []

    class Work:  # HostWork.start
        def start(self, op: str, nbytes: int, until_ns: int | None) -> int:
            asked.append((op, nbytes, until_ns))
            return 0

    clock = FixedDelayClock()
    start(clock=clock, host_work=Work())
    dist.all_reduce(torch.ones(1024))
    (call,) = clock.seen
    assert asked == [("all_reduce", 4096, call.enter_ns + DELAY_NS)]  # this rank's bytes, until its end


def test_a_call_the_clock_completes_at_once_waits_for_its_host_work(start: Callable[..., None]) -> None:
    """In a capture (peers never hold a call up) the call still lasts its own host work: else
    that work would run on into what the program does after its wait."""
    work = HostWork({"all_reduce": 0.5})
    start(host_work=work)
    tensor = torch.ones(40 * 2**20 // 4)  # 40 MB: 20 ms of work
    pending = dist.all_reduce(tensor, async_op=True)
    assert not pending.is_completed()
    pending.wait()
    assert work.done_ns >= 0.9 * work.asked_ns > 0
    # Too little work to be done: at once, as without it.
    assert dist.all_reduce(torch.ones(16), async_op=True).is_completed()
