"""A program's call is matched to its rank's next comm node on op, group (or peer) and bytes."""

from __future__ import annotations

from pathlib import Path

from test_simulate import collective, compute, config, write

from prism.peers.clock import PendingCall
from prism.replay.rank_program import RankProgram
from prism.schemas import graph_format as gf


def program(tmp_path: Path) -> RankProgram:
    nodes = [
        compute(5),
        {**collective(1, 5, 2, **{gf.GROUP_INDEX: 0}), gf.NAME: "all_reduce", gf.BYTES: 32},
        {gf.KIND: "send", gf.PEER: 1, gf.P2P_SEQ: 0, gf.NAME: "send", gf.BYTES: 64, gf.DUR_NS: 3},
    ]
    peer = [
        compute(5),
        {**collective(1, 5, 2, **{gf.GROUP_INDEX: 0}), gf.NAME: "all_reduce", gf.BYTES: 32},
        {gf.KIND: "recv", gf.PEER: 0, gf.P2P_SEQ: 0, gf.NAME: "recv", gf.BYTES: 64, gf.DUR_NS: 3},
    ]
    return RankProgram.read(write(tmp_path / "g.parquet", config(tp=2), [nodes, peer]), 0)


def call(op: str, label: str = "world", peer: int | None = None, nbytes: int = 32) -> PendingCall:
    return PendingCall(op=op, group="0", label=label, group_size=2, gseq=0, bytes=nbytes, peer=peer)


def test_the_calls_the_graph_expects_match_and_others_do_not(tmp_path: Path) -> None:
    keys = program(tmp_path).comm_keys
    label = keys[0][1]
    assert RankProgram.call_key(call("all_reduce", label)) == keys[0]
    assert RankProgram.call_key(call("send", peer=1, nbytes=64)) == keys[1]
    for other in (
        call("all_reduce", label, nbytes=16),  # bytes
        call("all_gather", label),  # op
        call("all_reduce", "dp.0"),  # group
    ):
        assert RankProgram.call_key(other) != keys[0]
    assert RankProgram.call_key(call("send", peer=2, nbytes=64)) != keys[1]  # peer
    assert RankProgram.call_key(call("recv", peer=1, nbytes=64)) != keys[1]  # direction
