"""The prism backend across real processes: all-real groups run on gloo; mixed groups stay virtual
but for transfers between their real members.

Each scenario starts one subprocess per real rank (this file, run as a script) on localhost and
reads back what each rank saw from a JSON file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prism.capture.launch import free_port

pytestmark = pytest.mark.slow

TIMEOUT_S = 45


def run_ranks(scenario: str, ranks: list[int], world_size: int, tmp_path: Path) -> dict[int, dict]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    procs = {
        rank: subprocess.Popen(
            [
                sys.executable,
                __file__,
                scenario,
                str(rank),
                str(world_size),
                str(tmp_path / f"rank{rank}.json"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in ranks
    }
    try:
        outputs = {rank: p.communicate(timeout=TIMEOUT_S)[0] for rank, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, p in procs.items():
        assert p.returncode == 0, f"rank {rank} failed:\n{outputs[rank]}"
    return {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in ranks}


def test_all_real_world_of_two_gives_real_results(tmp_path: Path) -> None:
    seen = run_ranks("all_real", [0, 1], 2, tmp_path)
    for rank, got in seen.items():
        assert got["all_reduce"] == [3.0, 3.0]  # 1 + 2
        assert got["all_gather"] == [[0.0, 0.0], [1.0, 1.0]]
        assert got["all_gather_single"] == [10.0, 11.0]
        assert got["reduce_scatter"] == [[1.0, 3.0], [5.0, 7.0]][rank]  # sum of arange(4)+r, own half
        assert got["broadcast"] == [1.0, 1.0, 1.0]  # from rank 1
        assert got["all_to_all"] == [[0.0, 10.0], [1.0, 11.0]][rank]
        assert got["subgroup_all_reduce"] == 30.0
        assert got["coalesced_all_reduce"] == [[3.0, 3.0], [30.0, 30.0, 30.0]]
        assert got["coalesced_all_gather"] == [[0.0, 1.0], [5.0, 5.0, 6.0, 6.0]]
        assert got["batch_p2p"] == [1.0 - rank] * 2
        assert got["modes"] == ["delegated", "delegated"]
        assert got["calls_delegated"] and got["calls_done"]
        assert got["subgroup_label"] != "world" and got["subgroup_calls"] == 1
    assert seen[1]["recv"] == [42.0]
    assert [op for op in seen[0]["ops"] if op in ("send", "recv")] == ["send", "send", "recv"]


def test_mixed_groups_move_real_data_between_real_members_only(tmp_path: Path) -> None:
    seen = run_ranks("mixed", [0, 1], 4, tmp_path)
    for rank, got in seen.items():
        # World and {0,1,2,3} mix real and virtual members: a collective is served virtually ...
        assert got["world_all_reduce"] == [rank + 1.0] and got["group_0123_all_reduce"] == [rank + 1.0]
        assert got["pair_all_reduce"] == 3.0  # group {0, 1}: both real, so a real sum over gloo
    # ... but a transfer between the two real members carries real data (a gloo pair).
    assert seen[1]["world_recv_from_0"] == [42.0, 43.0]
    assert seen[0]["world_recv_from_1"] == [7.0]
    assert seen[0]["world_delegated"] == [False, True, True]  # all_reduce, send, recv
    zero, one = seen[0], seen[1]
    assert zero["virtual_all_reduce"] == [1.0, 2.0]  # group {0, 2}: rank 2 is virtual
    assert zero["virtual_recv_finite"] and zero["virtual_mode"] == "virtual"
    assert zero["delegated_by_label"]["pair"] == [True]
    assert zero["delegated_by_label"]["virtual"] == [False, False]
    assert one["virtual_mode"] == "non-member"


# -- the rank processes ------------------------------------------------------------------------------------
def _all_real(rank: int, world_size: int) -> dict:
    import torch
    import torch.distributed as dist

    from prism.peers.backend import BACKEND_NAME, VirtualWorld, activate, current_comm_log

    activate(VirtualWorld())
    dist.init_process_group(BACKEND_NAME, init_method="env://", rank=rank, world_size=world_size)
    got: dict = {}
    t = torch.full((2,), rank + 1.0)
    dist.all_reduce(t)
    got["all_reduce"] = t.tolist()
    slots = [torch.empty(2) for _ in range(2)]
    dist.all_gather(slots, torch.full((2,), float(rank)))
    got["all_gather"] = [s.tolist() for s in slots]
    flat = torch.empty(2)
    dist.all_gather_single(flat, torch.tensor([10.0 + rank]))
    got["all_gather_single"] = flat.tolist()
    out = torch.empty(2)
    dist.reduce_scatter_single(out, torch.arange(4.0) + rank)
    got["reduce_scatter"] = out.tolist()
    b = torch.full((3,), float(rank))
    dist.broadcast(b, src=1)
    got["broadcast"] = b.tolist()
    if rank == 0:
        dist.send(torch.tensor([42.0]), dst=1)
    else:
        r = torch.empty(1)
        dist.recv(r, src=0)
        got["recv"] = r.tolist()
    a = torch.empty(2)
    dist.all_to_all_single(a, torch.tensor([0.0, 1.0]) + 10 * rank)
    got["all_to_all"] = a.tolist()
    sub = dist.new_group([0, 1], use_local_synchronization=True)
    s = torch.tensor([10.0 * (rank + 1)])
    dist.all_reduce(s, group=sub)
    got["subgroup_all_reduce"] = s.item()
    inbox = torch.empty(2)
    peer = 1 - rank
    ops = [dist.P2POp(dist.isend, torch.full((2,), float(rank)), peer), dist.P2POp(dist.irecv, inbox, peer)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    got["batch_p2p"] = inbox.tolist()
    pair = [torch.full((2,), rank + 1.0), torch.full((3,), 10.0 * (rank + 1))]
    with dist._coalescing_manager(async_ops=True) as cm:  # gloo's own allreduce_coalesced
        for t in pair:
            dist.all_reduce(t)
    cm.wait()
    got["coalesced_all_reduce"] = [t.tolist() for t in pair]
    outs = [torch.empty(2), torch.empty(4)]
    with dist._coalescing_manager():  # gloo cannot coalesce: one Work over both futures
        dist.all_gather_single(outs[0], torch.tensor([float(rank)]))
        dist.all_gather_single(outs[1], torch.full((2,), 5.0 + rank))
    got["coalesced_all_gather"] = [o.tolist() for o in outs]
    dist.barrier()
    log = current_comm_log()
    got["modes"] = [str(dist.group.WORLD.mode), str(sub.mode)]
    got["ops"] = [c.op for c in log.calls]
    got["calls_delegated"] = all(c.delegated for c in log.calls)
    got["calls_done"] = all(c.enter_ns <= c.done_ns for c in log.calls)
    got["subgroup_label"] = sub.label
    got["subgroup_calls"] = sum(c.group == sub.group_name for c in log.calls)
    dist.destroy_process_group()
    return got


def _mixed(rank: int, world_size: int) -> dict:
    import torch
    import torch.distributed as dist

    from prism.peers.backend import BACKEND_NAME, VirtualWorld, activate, current_comm_log, rendezvous_store

    labels = {(0, 1): "pair", (0, 2): "virtual"}
    world = VirtualWorld(real_ranks=frozenset({0, 1}), labeler=labels.get)
    activate(world)
    store = rendezvous_store(rank, world_size, world)  # env:// would wait for all 4 ranks
    dist.init_process_group(BACKEND_NAME, rank=rank, world_size=world_size, store=store)
    got: dict = {}

    def all_reduce(group: dist.ProcessGroup | None) -> list[float]:
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t, group=group)
        return t.tolist()

    got["world_all_reduce"] = all_reduce(None)
    got["group_0123_all_reduce"] = all_reduce(dist.new_group([0, 1, 2, 3]))
    if rank == 0:  # over the world group, which has virtual members too
        dist.send(torch.tensor([42.0, 43.0]), dst=1)
        buf = torch.zeros(1)
        dist.recv(buf, src=1)
        got["world_recv_from_1"] = buf.tolist()
    else:
        buf = torch.zeros(2)
        dist.recv(buf, src=0)
        got["world_recv_from_0"] = buf.tolist()
        dist.send(torch.tensor([7.0]), dst=0)
    virtual = dist.new_group([0, 2])
    pair = dist.new_group([0, 1])
    if virtual == dist.GroupMember.NON_GROUP_MEMBER:
        got["virtual_mode"] = "non-member"
    else:
        got["virtual_mode"] = str(virtual.mode)
        t = torch.tensor([1.0, 2.0])
        dist.all_reduce(t, group=virtual)
        got["virtual_all_reduce"] = t.tolist()
        buf = torch.full((4,), float("nan"))
        dist.recv(buf, src=2, group=virtual)
        got["virtual_recv_finite"] = bool(torch.isfinite(buf).all())
    s = torch.tensor([rank + 1.0])
    dist.all_reduce(s, group=pair)
    got["pair_all_reduce"] = s.item()
    by_label: dict[str, list[bool]] = {}
    for call in current_comm_log().calls:
        by_label.setdefault(call.label, []).append(call.delegated)
    got["delegated_by_label"] = by_label
    world_name = dist.group.WORLD.group_name
    got["world_delegated"] = [c.delegated for c in current_comm_log().calls if c.group == world_name]
    dist.destroy_process_group()
    return got


if __name__ == "__main__":
    scenario, rank_arg, size_arg, out_path = sys.argv[1:]
    result = {"all_real": _all_real, "mixed": _mixed}[scenario](int(rank_arg), int(size_arg))
    Path(out_path).write_text(json.dumps(result))
