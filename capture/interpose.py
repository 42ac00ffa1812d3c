"""Give an unmodified torch.distributed program prism's backend, whatever backend it asks for.

A program launched by ``prism-capture -- train.py`` calls ``init_process_group("nccl")`` (or
"gloo", "cpu:gloo,cuda:nccl", or nothing, through ``init_device_mesh``) and ``new_group`` with
any backend. ``install`` replaces those functions, in every ``torch`` module that bound them,
with ones that make the group on the ``prism`` backend of this process's virtual world: rank and
world size from the torchrun environment, a store that only the real ranks join. Everything
else the program calls (DeviceMesh, DTensor, FSDP2, DDP, pipelining, functional collectives)
runs on top of those groups unchanged.

Calls prism cannot serve stop the program with ``UnsupportedCall``, which names the call and
the program's line that made it, rather than hanging on peers that do not exist.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from prism.peers.backend import BACKEND_NAME, VirtualWorld, activate, rendezvous_store


class UnsupportedCall(RuntimeError):
    """The program made a torch.distributed call prism does not emulate."""


_NOT_THE_PROGRAM = ("torch", "prism", "functools", "contextlib")


def program_line() -> str:
    """``file:line`` of the innermost frame outside torch and prism: the program's own call."""
    frame = sys._getframe(1)
    while frame is not None:
        if not frame.f_globals.get("__name__", "").startswith(_NOT_THE_PROGRAM):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def replace_everywhere(original: Callable, replacement: Callable) -> None:
    """Rebind ``original`` to ``replacement`` in every loaded torch module that holds it (modules
    imported later copy the rebound name from ``distributed_c10d``)."""
    for module in list(sys.modules.values()):
        if module is None or not getattr(module, "__name__", "").startswith("torch"):
            continue
        for name, value in list(vars(module).items()):
            if value is original:
                setattr(module, name, replacement)


def taken_by(function: Callable, **arguments: object) -> dict[str, object]:
    """Those of ``arguments`` that ``function`` takes: older torch releases take fewer (2.11's
    ``new_group`` has no ``sort_ranks``), and a program may run on any of them."""
    parameters = inspect.signature(function).parameters
    return {name: value for name, value in arguments.items() if name in parameters}


def _unsupported(name: str, why: str) -> Callable:
    def call(*args: object, **kwargs: object) -> None:
        raise UnsupportedCall(f"torch.distributed.{name} at {program_line()}: {why}")

    return call


def _object_from_virtual_peer(name: str, original: Callable, world: VirtualWorld) -> Callable:
    """``original`` (an object collective), refused when the objects come from a virtual rank:
    their pickled bytes would be stand-in data, and unpickling them fails or, worse, succeeds. A
    receive whose values the capture's value pass recorded (``world.received``) is served with them."""

    def _known(src: int | None) -> bool:
        received = world.received
        return (
            name == "recv_object_list"
            and src is not None
            and received is not None
            and received.knows_next(src)
        )

    @functools.wraps(original)
    def call(*args: object, **kwargs: object) -> object:
        src = kwargs.get("src", args[1] if len(args) > 1 else None)  # a global rank (None: any)
        if world.real_ranks is not None and (src is None or src not in world.real_ranks) and not _known(src):
            raise UnsupportedCall(
                f"torch.distributed.{name} at {program_line()}: the objects come from rank {src}, a virtual "
                "rank, whose values prism does not know"
            )
        return original(*args, **kwargs)

    return call


def install(world: VirtualWorld, *, rank: int, world_size: int) -> None:
    """Route this process's torch.distributed groups through ``world`` as global ``rank``."""
    activate(world)
    original_init = c10d.init_process_group
    original_new_group = c10d.new_group

    @functools.wraps(original_init)
    def init_process_group(
        backend: str | None = None,
        init_method: str | None = None,
        timeout: timedelta | None = None,
        world_size: int = -1,
        rank: int = -1,
        store: dist.Store | None = None,
        group_name: str = "",
        pg_options: object | None = None,
        device_id: object | None = None,
        **_: object,
    ) -> None:
        _check_place("rank", rank, expected_rank)
        _check_place("world_size", world_size, expected_world)
        kwargs = {} if timeout is None else {"timeout": timeout}
        original_init(
            BACKEND_NAME,
            rank=expected_rank,
            world_size=expected_world,
            store=rendezvous_store(expected_rank, expected_world, world),
            group_name=group_name,
            **kwargs,
        )

    @functools.wraps(original_new_group)
    def new_group(
        ranks: list[int] | None = None,
        timeout: timedelta | None = None,
        backend: str | None = None,
        pg_options: object | None = None,
        use_local_synchronization: bool = False,
        group_desc: str | None = None,
        device_id: object | None = None,
        sort_ranks: bool = True,
    ) -> dist.ProcessGroup:
        # The default group's backend is prism's: asking for none gives it.
        return original_new_group(
            **taken_by(
                original_new_group,
                ranks=ranks,
                timeout=timeout,
                use_local_synchronization=use_local_synchronization,
                group_desc=group_desc,
                sort_ranks=sort_ranks,
            )
        )

    expected_rank, expected_world = rank, world_size
    replace_everywhere(original_init, init_process_group)
    replace_everywhere(original_new_group, new_group)
    for name in ("recv_object_list", "broadcast_object_list"):
        original = getattr(c10d, name)
        replace_everywhere(original, _object_from_virtual_peer(name, original, world))
    replace_everywhere(
        c10d.monitored_barrier,
        _unsupported(
            "monitored_barrier", "it reports which ranks failed to arrive, and virtual ranks never do"
        ),
    )


def _check_place(what: str, given: int, expected: int) -> None:
    if given not in (-1, expected):
        raise UnsupportedCall(
            f"torch.distributed.init_process_group at {program_line()}: {what}={given} given, but this "
            f"process is {what}={expected} of the target world (prism sets RANK and WORLD_SIZE as torchrun does)"
        )
