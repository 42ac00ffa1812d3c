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
    held = bytes([1]) * (1200 * 2**20)  # the parent's resident memory, 1.2 GiB, every page written
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    del held
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert child["ru_maxrss"] >= 1200 * 2**20  # what the old measure reported: the parent's
    assert child["own"] < 1000 * 2**20
