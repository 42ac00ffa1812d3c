"""A user's own training program, as a capture records it: what to run and at which layout.

The program is launched as ``torchrun`` would launch it: ``train.py ARGS`` runs as ``__main__``,
``-m package.module ARGS`` as ``python -m`` runs it, each real rank with the torchrun
environment of its place in the *target* world.
"""

from __future__ import annotations

from dataclasses import dataclass

from prism.schemas.layout import ParallelLayout
from prism.schemas.workload import DEVICES

MODULE_FLAG = "-m"


class ProgramError(ValueError):
    """A program command line or setting that cannot run."""


@dataclass(frozen=True, kw_only=True)
class ProgramSpec:
    """What every real rank of a program capture runs."""

    argv: tuple[str, ...]
    """``("train.py", *args)`` or ``("-m", "package.module", *args)``, as after ``torchrun ... --``."""
    cwd: str
    """Directory the program is started from (relative paths in ``argv`` are relative to it)."""
    layout: ParallelLayout
    """Target layout: the world the program believes it runs in."""
    device: str = "cpu"
    """'cpu' or 'cuda': where the real ranks run."""
    nproc_per_node: int = 8
    """Processes per node of the target (``LOCAL_WORLD_SIZE``, and ``GROUP_RANK = RANK // it``)."""
    run_to_end: bool = False
    """Let the program finish by itself; by default prism ends it once the profiled iterations are done."""

    def __post_init__(self) -> None:
        if not self.argv or (self.argv[0] == MODULE_FLAG and len(self.argv) < 2):
            raise ProgramError("no program given: pass `-- train.py ARGS` or `-- -m package.module ARGS`")
        if self.device not in DEVICES:
            raise ProgramError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.nproc_per_node < 1:
            raise ProgramError(f"nproc_per_node must be at least 1, got {self.nproc_per_node}")

    @property
    def module(self) -> str | None:
        """The module run with ``-m``, else None."""
        return self.argv[1] if self.argv[0] == MODULE_FLAG else None

    @property
    def script(self) -> str | None:
        """The script file run, else None."""
        return None if self.module else self.argv[0]

    @property
    def args(self) -> tuple[str, ...]:
        """The program's own arguments (``sys.argv[1:]``)."""
        return self.argv[2:] if self.module else self.argv[1:]

    def describe(self) -> str:
        return " ".join(self.argv)

    def torchrun_env(self, rank: int) -> dict[str, str]:
        """The environment ``torchrun`` gives ``rank`` of the target world (the device index the
        process may use, ``LOCAL_RANK``, is the launcher's: it must exist on this machine)."""
        world = self.layout.world_size
        per_node = min(self.nproc_per_node, world)
        return {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(per_node),
            "GROUP_RANK": str(rank // per_node),
            "GROUP_WORLD_SIZE": str(-(-world // per_node)),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world),
            "ROLE_NAME": "default",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": "prism",
        }

    def to_dict(self) -> dict:
        return {
            "argv": list(self.argv),
            "cwd": self.cwd,
            "layout": self.layout.to_dict(),
            "device": self.device,
            "nproc_per_node": self.nproc_per_node,
            "run_to_end": self.run_to_end,
        }

    @classmethod
    def from_dict(cls, data: dict) -> ProgramSpec:
        return cls(
            argv=tuple(data["argv"]),
            cwd=str(data["cwd"]),
            layout=ParallelLayout.from_dict(data["layout"]),
            device=str(data.get("device", "cpu")),
            nproc_per_node=int(data.get("nproc_per_node", 8)),
            run_to_end=bool(data.get("run_to_end", False)),
        )
