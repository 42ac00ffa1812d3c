"""Real calls' latency after the last member arrived, from the comm logs of all their members.

A call's duration in one rank's log (``done_ns - enter_ns``) includes the wait for the members
that arrived later: the job's arrival skew, which the graph models apart (``prism.graph.sim.noise``).
The network's part is the time from the *last* member's arrival to the completion, which needs
every member's log of the same instance. A collective instance is keyed by (group label, gseq,
op, bytes, size); a transfer by (source, destination, n-th transfer between them, 'send', bytes,
2), so that a send and its recv share a key. gloo's send/recv Works have no future: their
``done_ns`` is when the program's ``wait()`` returned, which a pipeline calls right after posting.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prism.schemas.comm_log import CommCall, CommLog, read_comm_log
from prism.schemas.iterations import call_signature, clean_unprofiled
from prism.schemas.manifest import COMM_DIR, MANIFEST_FILE, read_manifest

LoggedCalls = tuple[CommLog, np.ndarray | None]
"""A rank's comm log and the mask of its calls to read (None: all)."""


@dataclass(frozen=True, kw_only=True)
class CallLatency:
    """One complete delegated collective or transfer, every member's log read."""

    op: str
    """Comm-log op ('send' for a send/recv pair)."""
    bytes: int
    """Bytes each member contributes, as in the comm log."""
    group_size: int
    """Members of the instance (2 for a transfer)."""
    skew_ns: int
    """Last member's arrival minus the first's."""
    latency_ns: int
    """Last member's completion minus the last member's arrival."""


def clean_call_mask(
    calls: int, iterations: int, warmup: int, signatures: Sequence[Hashable] | None = None
) -> np.ndarray:
    """Which of a rank's ``calls`` (in order) were made in its clean unprofiled iterations.

    Set-up calls come first, then the same number of calls in each of ``iterations``. With each
    call's ``signatures`` (what it did: op, group, bytes, peer), that number is the one under
    which the most iterations repeat the same calls, so that set-up calls as many as the
    iterations (weights scattered in a call an iteration's worth) are not read as one more in each.
    Without them, or where no number repeats, the calls are split evenly, and a log that does
    not split so (set-up calls as many as an iteration's, or none per iteration) keeps every
    call rather than guess."""
    per = _repeating_calls(signatures, iterations) if signatures is not None else None
    if per is None:
        per = calls // iterations if iterations > 0 else 0
        if per == 0 or calls - per * iterations >= per:
            return np.ones(calls, np.bool_)
    setup = calls - per * iterations
    iteration = np.r_[np.full(setup, -1), np.repeat(np.arange(iterations), per)]
    return np.isin(iteration, clean_unprofiled(list(range(iterations)), warmup))


def _repeating_calls(signatures: Sequence[Hashable], iterations: int) -> int | None:
    """The number of calls an iteration under which the most iterations, counted back from the
    last, made the same calls in the same order as the last (the larger number where two tie,
    at least two iterations alike); None where none did. Counting back stops at the first that
    differs: set-up calls, or a first iteration that differs (DDP rebuilds its buckets)."""
    n, best, best_alike = len(signatures), None, 1
    for per in range(n // iterations if iterations > 0 else 0, 0, -1):
        last = list(signatures[n - per :])
        alike = 1
        while alike < iterations and list(signatures[n - (alike + 1) * per : n - alike * per]) == last:
            alike += 1
        if alike > best_alike:
            best, best_alike = per, alike
    return best


def real_calls(logs: Iterable[LoggedCalls]) -> Iterator[tuple[CommCall, tuple[int, int, int] | None]]:
    """The delegated (real), completed calls of ``(log, keep)`` pairs of one run, a log per rank,
    ``keep`` a mask over the log's calls (None: all), each with its transfer — (source, dest,
    n-th transfer between them), so that a send and its recv share it — or None for a collective.
    Virtual calls (timed by a clock, not a network) are left out, and so is a send or recv
    without a peer."""
    seen: set[int] = set()
    for log, keep in logs:
        if log.rank in seen:  # two runs' logs would make every instance look over-full
            raise ValueError(f"rank {log.rank}'s comm log given twice: pass one run's logs at a time")
        seen.add(log.rank)
        transfers: dict[tuple[int, int], int] = defaultdict(int)
        for i, c in enumerate(log.calls):
            transfer = None
            if c.op in ("send", "recv"):
                if c.peer is None:
                    continue
                pair = (log.rank, c.peer) if c.op == "send" else (c.peer, log.rank)
                transfer = (*pair, transfers[pair])
                transfers[pair] += 1  # counted whether kept or not: the two ends must agree
            if c.delegated and c.done_ns > 0 and (keep is None or keep[i]):
                yield c, transfer


def call_latencies(logs: Iterable[LoggedCalls]) -> list[CallLatency]:
    """Every instance whose members' logs are all given (``real_calls``: one run's logs, real
    completed calls); an instance missing a member is left out."""
    members: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for c, transfer in real_calls(logs):
        key = (
            (c.label, c.gseq, c.op, c.bytes, c.group_size)
            if transfer is None
            else (*transfer, "send", c.bytes, 2)
        )
        members[key].append((c.enter_ns, c.done_ns))
    out = []
    for (*_, op, nbytes, size), calls in members.items():
        if len(calls) != size:
            continue
        last_arrival = max(enter for enter, _ in calls)
        out.append(
            CallLatency(
                op=op, bytes=nbytes, group_size=size, skew_ns=last_arrival - min(e for e, _ in calls),
                latency_ns=max(done for _, done in calls) - last_arrival,
            )
        )  # fmt: skip
    return out


def capture_logs(capture_dir: Path, clean_only: bool = True) -> list[LoggedCalls]:
    """Every rank's comm log of a capture (``comm/rank*.comm.json``), each with the mask of its
    calls in the clean unprofiled iterations when ``clean_only`` and the capture's manifest says
    which (else None: every call). The first iteration is cold, and under the profiler a call
    takes longer."""
    capture_dir = Path(capture_dir)
    manifest = capture_dir / MANIFEST_FILE
    job = read_manifest(capture_dir).job if clean_only and manifest.exists() else None
    logs = []
    for file in sorted((capture_dir / COMM_DIR).glob("rank*.comm.json")):
        log = read_comm_log(file)
        signatures = [call_signature(c) for c in log.calls]
        keep = (
            clean_call_mask(len(log.calls), job.warmup + job.iterations, job.warmup, signatures)
            if job
            else None
        )
        logs.append((log, keep))
    return logs


def capture_latencies(capture_dir: Path, clean_only: bool = True) -> list[CallLatency]:
    """``call_latencies`` of every rank of a capture (``capture_logs``)."""
    return call_latencies(capture_logs(capture_dir, clean_only))


@dataclass(frozen=True, kw_only=True)
class TransferTime:
    """Where the time of one real transfer went, from both ends' logs (``transfer_times``)."""

    source: int
    """Sending rank."""
    dest: int
    """Receiving rank."""
    bytes: int
    """Bytes sent."""
    send_post_ns: int
    """The sender's post: ``isend`` entry to return (host work, not the transfer)."""
    recv_post_ns: int
    """The receiver's post likewise."""
    receiver_last: bool
    """The receiver posted after the sender (gloo then sends once told the receive is ready)."""
    latency_ns: int
    """The receiver's completion after the later post began (``CallLatency.latency_ns``)."""
    blocked_ns: int
    """What of that the receiver spent blocked in its wait: from the later of its wait and the
    later post to its completion. The rest is the receiver's own work before it waited."""


def transfer_times(logs: Iterable[LoggedCalls]) -> list[TransferTime]:
    """Every transfer whose two ends' real calls are in ``logs`` (``real_calls``), matched as the
    n-th send from one rank to another with the n-th receive of the other from it."""
    ends: dict[tuple[int, int, int], dict[str, CommCall]] = defaultdict(dict)
    for c, transfer in real_calls(logs):
        if transfer is not None:
            ends[transfer][c.op] = c
    out = []
    for (source, dest, _), both in sorted(ends.items()):
        send, recv = both.get("send"), both.get("recv")
        if send is None or recv is None:
            continue
        last = max(send.enter_ns, recv.enter_ns)
        waited = recv.first_wait_ns or recv.wait_ns or recv.exit_ns
        out.append(
            TransferTime(
                source=source, dest=dest, bytes=recv.bytes, send_post_ns=send.exit_ns - send.enter_ns,
                recv_post_ns=recv.exit_ns - recv.enter_ns, receiver_last=recv.enter_ns > send.enter_ns,
                latency_ns=recv.done_ns - last, blocked_ns=max(recv.done_ns - max(waited, last), 0),
            )
        )  # fmt: skip
    return out


@dataclass(frozen=True, kw_only=True)
class PostTime:
    """One asynchronous send or recv's post: its entry to its return, host work the graph keeps
    as a node after the call (``prism.graph.build.profiler_overhead``)."""

    rank: int
    """Rank that posted it."""
    op: str
    """'send' or 'recv'."""
    peer: int
    """The other end's global rank."""
    bytes: int
    delegated: bool
    """Posted on a real gloo group (True) or to a virtual peer (False)."""
    post_ns: int


def post_times(logs: Iterable[LoggedCalls]) -> list[PostTime]:
    """Every kept asynchronous send and recv with a peer of ``(log, keep)`` pairs, real or
    virtual: a real run's posts beside a slice's show what a virtual post does not cost."""
    out = []
    for log, keep in logs:
        for i, c in enumerate(log.calls):
            if c.op in ("send", "recv") and c.async_op and c.peer is not None and (keep is None or keep[i]):
                out.append(
                    PostTime(
                        rank=log.rank, op=c.op, peer=c.peer, bytes=c.bytes, delegated=c.delegated,
                        post_ns=c.exit_ns - c.enter_ns,
                    )
                )  # fmt: skip
    return out
