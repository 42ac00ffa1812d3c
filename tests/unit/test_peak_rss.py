"""A rank's peak resident memory is its own, not that of the launcher that started it."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import json, resource
from prism.capture.rank_main import peak_rss_bytes
print(json.dumps({"own": peak_rss_bytes(), "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def test_a_child_of_a_large_parent_reports_its_own_peak() -> None:
    # The parent's resident memory, every page written: well above the child's own (which imports
    # torch, about 1 GiB with a CUDA build's libraries).
    held = bytes([1]) * (3 * 2**30)
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    del held
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert child["ru_maxrss"] >= 3 * 2**30  # what the old measure reported: the parent's
    assert child["own"] < 2 * 2**30
