"""What the graph says one rank does, node by node, and how a program's call is matched to it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from prism.graph.io.parquet import GraphReader
from prism.graph.sim.engine import COLLECTIVE, COMPUTE, RECV, SEND
from prism.graph.sim.load import kind_codes
from prism.peers.clock import PendingCall
from prism.schemas import graph_format as gf
from prism.schemas.annotations import group_label

_OPS = {COLLECTIVE: None, SEND: "send", RECV: "recv"}


class DivergenceError(RuntimeError):
    """The program made a call the graph does not expect at that point (one line)."""


@dataclass(frozen=True, kw_only=True)
class RankProgram:
    """One rank's rows of the graph, in program order."""

    rank: int
    first_row: int
    """Global row of the rank's first node (rows of a graph are sorted by rank)."""
    kind: np.ndarray
    """Engine node kinds (``prism.graph.sim.engine.COMPUTE`` ...)."""
    name: np.ndarray
    """Op name (collectives: 'all_reduce', ...; transfers: 'send' / 'recv')."""
    label: np.ndarray
    """Group label of collectives ('tp.3'), '' otherwise."""
    bytes: np.ndarray
    peer: np.ndarray
    group_size: np.ndarray
    """Members of each collective's group (2 for a transfer, 0 for compute)."""
    phase: np.ndarray
    """Annotation phase of the node's block (fwd, bwd, p2p_wait, grad_sync, optim, ...)."""
    phases: tuple[str, ...]
    """The distinct phases; ``phase_code`` indexes them."""
    phase_code: np.ndarray

    @classmethod
    def read(cls, path: str | Path, rank: int) -> RankProgram:
        """The rank's rows of the graph file at ``path`` (other row groups are skipped)."""
        with GraphReader(path) as reader:  # opens the rank's part of the graph alone
            columns = [
                gf.KIND,
                gf.NAME,
                gf.GROUP_KIND,
                gf.GROUP_INDEX,
                gf.GROUP_SIZE,
                gf.BYTES,
                gf.PEER,
                gf.PHASE,
            ]
            table = reader.read_rank(rank, columns)
            if not 0 <= rank < reader.world_size:
                raise ValueError(f"rank {rank} is not in the graph (0..{reader.world_size - 1})")
            first_row = reader.first_row(rank)
        group_kind = table[gf.GROUP_KIND].cast("string").to_numpy(zero_copy_only=False)
        group_index = table[gf.GROUP_INDEX].to_numpy()
        label = np.array(
            [
                group_label(k, i) if k and i >= 0 else (k or "")
                for k, i in zip(group_kind, group_index, strict=True)
            ],
            dtype=object,
        )
        phase = pc.cast(table[gf.PHASE], "string").to_numpy(zero_copy_only=False)
        phases, codes = np.unique(phase, return_inverse=True)
        return cls(
            rank=rank,
            first_row=first_row,
            kind=kind_codes(table[gf.KIND]),
            name=pc.cast(table[gf.NAME], "string").to_numpy(zero_copy_only=False),
            label=label,
            bytes=table[gf.BYTES].to_numpy(),
            peer=table[gf.PEER].to_numpy(),
            group_size=table[gf.GROUP_SIZE].to_numpy(),
            phase=phase,
            phases=tuple(phases),
            phase_code=codes,
        )

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def end_row(self) -> int:
        """Global row just past the rank's last node."""
        return self.first_row + len(self.kind)

    @cached_property
    def comm_rows(self) -> np.ndarray:
        """Global rows of the rank's collectives and transfers, in program order."""
        return self.first_row + np.flatnonzero(self.kind != COMPUTE)

    def next_comm(self, row: int) -> int:
        """The rank's first communication row at or after global ``row`` (``end_row``: none left)."""
        k = int(np.searchsorted(self.comm_rows, row))
        return int(self.comm_rows[k]) if k < len(self.comm_rows) else self.end_row

    def describe(self, i: int) -> str:
        """Node ``i`` of the rank as the program would name the call."""
        if self.kind[i] == COLLECTIVE:
            return f"{self.name[i]} on {self.label[i]} ({self.bytes[i]} bytes)"
        if self.kind[i] in (SEND, RECV):
            return f"{self.name[i]} with peer {self.peer[i]} ({self.bytes[i]} bytes)"
        return f"compute {self.name[i]}"

    @cached_property
    def comm_keys(self) -> list[tuple]:
        """``call_key`` of the call each comm node expects, in program order."""
        keys = []
        for i in self.comm_rows - self.first_row:
            kind = self.kind[i]
            if kind == COLLECTIVE:
                keys.append((str(self.name[i]), str(self.label[i]), int(self.bytes[i])))
            else:
                keys.append((_OPS[kind], int(self.peer[i]), int(self.bytes[i])))
        return keys

    @staticmethod
    def call_key(call: PendingCall) -> tuple:
        """What a call is matched on: op, group label (a transfer: its peer), bytes. The call is
        the one comm node ``k`` expects iff its key is ``comm_keys[k]``."""
        if call.op in ("send", "recv"):
            return call.op, call.peer, call.bytes
        return call.op, call.label, call.bytes
