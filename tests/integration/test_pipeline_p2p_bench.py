"""benchmarks/pipeline_p2p.py on a tiny pipeline program: every rank's schedule posts and waits
are timed, iteration by iteration, and the warm-up is left out; no speed claim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pipeline_p2p(benchmark_script):
    return benchmark_script("pipeline_p2p")


def test_a_pipeline_programs_transfers_are_timed_on_every_rank(tmp_path: Path) -> None:
    program = ["examples/pp.py", "--pp", "2", "--schedule", "1F1B", "--hidden", "32", "--seq", "8"]
    capture, graph = tmp_path / "cap", tmp_path / "graph.parquet"
    layout = ["--tp", "1", "--pp", "2", "--dp", "1"]
    for command in (
        ["prism-capture", *layout, "--warmup", "4", "--iterations", "2", "-o", str(capture), "--", *program, "--steps", "8"],
        ["prism-build-graph", str(capture), *layout, "-o", str(graph)],
    ):  # fmt: skip
        done = subprocess.run([str(Path(sys.executable).parent / command[0]), *command[1:]],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    out, scratch = tmp_path / "p2p.json", tmp_path / "tmp"
    scratch.mkdir()
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "pipeline_p2p.py"), "--warmup", "3", "--json", str(out),
         "--graph", str(graph), "--", *program, "--steps", "8"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "TMPDIR": str(scratch)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert not list(scratch.iterdir())  # torchrun's logs went with the run: no torchelastic_* left
    ranks = json.loads(out.read_text())["ranks"]
    assert set(ranks) == {"0", "1"}
    for summary in ranks.values():
        assert summary["iterations"] == 5  # 8 optimizer steps, 3 of warm-up
        assert 0 < summary["post_ms"] < summary["iter_ms"]  # 1F1B posts a transfer every microbatch
        assert 0 <= summary["wait_ms"] < summary["iter_ms"]
        # Where a post's time goes: the gloo calls inside it, and its thread's CPU time.
        assert 0 < summary["gloo_send_wall_us"] < summary["one_post_us"] * 10
        assert summary["gloo_recv_wall_us"] > 0 and summary["post_cpu_us"] > 0
        assert 0 <= summary["preempted_share"] <= 1
        # The same waits on both sides, the places adding up to an iteration on each.
        places = summary["segments"]
        assert sum(p["place"].startswith("wait") for p in places) >= 2
        real, simulated = (sum(p[side] for p in places) for side in ("real_ms", "sim_ms"))
        assert 0.5 * summary["iter_ms"] < real < 1.5 * summary["iter_ms"]
        assert simulated > 0


def test_an_iteration_is_cut_at_its_waits_and_a_batchs_waits_are_one(pipeline_p2p) -> None:
    spans = [("post", 10, 12), ("wait", 20, 50), ("wait", 51, 60), ("post", 70, 71), ("wait", 80, 85)]
    before, waits = pipeline_p2p.cut_at_waits(spans, 0, 100)
    assert before == [20, 20, 15]  # from the start, from the batch's last return, after the last wait
    assert waits == [40, 5]  # the batch's two waits and the moment between them are one wait
    assert sum(before) + sum(waits) == 100


def test_a_graph_that_waits_otherwise_is_one_error(pipeline_p2p) -> None:
    real = [([10, 20, 5], [3, 4])] * 3
    rows = pipeline_p2p.segment_rows(real, ([11, 19, 5], [3, 5]))
    assert [r["place"] for r in rows] == [
        "own time before wait 0", "wait 0", "own time before wait 1", "wait 1", "own time after the last wait"
    ]  # fmt: skip
    with pytest.raises(SystemExit, match="waits 2 times an iteration, the simulation 1"):
        pipeline_p2p.segment_rows(real, ([11, 19], [3]))


def test_too_few_iterations_for_the_warm_up_is_one_error(pipeline_p2p, tmp_path: Path) -> None:
    rank_file = tmp_path / "rank0.json"
    rank_file.write_text(json.dumps({"bounds": [0, 1_000_000, 2_000_000, 3_000_000], "spans": []}))
    with pytest.raises(SystemExit, match="3 iteration"):
        pipeline_p2p.summarize(rank_file, warmup=3, slow_post_ms=5.0)
