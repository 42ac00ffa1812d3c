"""benchmarks/pipeline_p2p.py on a tiny pipeline program: every rank's schedule posts and waits
are timed, iteration by iteration, and the warm-up is left out; no speed claim."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pipeline_p2p(benchmark_script):
    return benchmark_script("pipeline_p2p")


def test_a_pipeline_programs_transfers_are_timed_on_every_rank(tmp_path: Path) -> None:
    out = tmp_path / "p2p.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "pipeline_p2p.py"), "--warmup", "3", "--json", str(out), "--",
         "examples/pp.py", "--pp", "2", "--schedule", "1F1B", "--steps", "8", "--hidden", "32", "--seq", "8"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = json.loads(out.read_text())["ranks"]
    assert set(ranks) == {"0", "1"}
    for summary in ranks.values():
        assert summary["iterations"] == 5  # 8 optimizer steps, 3 of warm-up
        assert 0 < summary["post_ms"] < summary["iter_ms"]  # 1F1B posts a transfer every microbatch
        assert 0 <= summary["wait_ms"] < summary["iter_ms"]


def test_too_few_iterations_for_the_warm_up_is_one_error(pipeline_p2p, tmp_path: Path) -> None:
    rank_file = tmp_path / "rank0.json"
    rank_file.write_text(json.dumps({"iterations": [1_000_000] * 3, "posts": [], "waits": []}))
    with pytest.raises(SystemExit, match="3 iteration"):
        pipeline_p2p.summarize(rank_file, warmup=3, slow_post_ms=5.0)
