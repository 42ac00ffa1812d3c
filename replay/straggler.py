"""Make a real rank a straggler: an added delay at the start of named blocks (``prism-replay --delay``).

The delay is the offline what-if's ``BlockDelay`` (``prism-simulate --delay``) played for real:
before each instance of the block, the rank waits ``delay_ns``, inside the block's mark, so the
trace shows it as part of the block. A delay without a layer applies to the block's outermost
marks only (one per microbatch for fwd / bwd, one per iteration for grad_sync / optim), as the
what-if adds it before the first node of each instance.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prism.capture import annotate
from prism.graph.sim.whatif import BlockDelay
from prism.schemas.annotations import Mark


def _matches(delay: BlockDelay, mark: Mark) -> bool:
    if mark.phase.value != delay.phase:
        return False
    if delay.layer is not None:
        return mark.layer == delay.layer
    return mark.layer is None and mark.part is None and mark.bucket is None


def install_delays(delays: Iterable[BlockDelay], rank: int) -> None:
    """Delay this process's blocks as ``delays`` say (those for ``rank`` or for every rank)."""
    mine = [d for d in delays if d.rank in (None, rank)]
    if not mine:
        return

    def hook(mark: Mark) -> None:
        wait_ns = sum(d.delay_ns for d in mine if _matches(d, mark))
        if wait_ns:
            time.sleep(wait_ns / 1e9)

    annotate.set_block_hook(hook)
