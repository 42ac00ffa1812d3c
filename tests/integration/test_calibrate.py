"""prism-calibrate: real gloo timings fitted into a 'local' spec; the fit itself on synthetic logs."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from prism.graph.comm.bench import (
    RECEIVER,
    _mean_latency_s,
    _Plan,
    _time_points,
    run_benchmark,
    run_busy_benchmark,
    summarise_busy,
)
from prism.graph.comm.calibrate import (
    CalibrationConfig,
    CalibrationError,
    Sample,
    calibrate,
    fit_from_comm_logs,
    fit_samples,
    measured_table,
    read_comm_logs,
    samples_from_comm_logs,
)
from prism.graph.comm.calibrate_cli import app
from prism.peers.comm_model import CommModel, single_node_terms
from prism.schemas.cluster import ClusterSpec, preset
from prism.schemas.comm_log import CommCall, CommGroup, CommLog, write_comm_log

KiB = 1024
MiB = 1024 * KiB


@pytest.mark.slow
def test_quick_calibration_predicts_what_it_measured(tmp_path) -> None:
    # timeout_s bounds the whole benchmark: a run over 30 s fails instead of passing slowly.
    config = CalibrationConfig(
        sizes=(4 * KiB, 64 * KiB, 1024 * KiB),
        max_procs=2,
        reps=5,
        timeout_s=30,
        out=tmp_path / "local.toml",
        measured_table=True,
    )
    result = calibrate(config)
    ops = {c.sample.op for c in result.checks}
    assert {"all_reduce", "all_gather", "send", "barrier"} <= ops
    assert all(c.sample.group_size == 2 and c.sample.seconds > 0 for c in result.checks)
    # CPU timing on a shared machine is noisy; the bound is loose on purpose.
    assert result.median_rel_error < 0.5
    assert ClusterSpec.load(result.path) == result.spec
    assert result.spec.name == "local" and result.spec.gpus_per_node >= 2
    # The measured table comes on top of the host work the 1 MiB calls measured, not instead.
    assert result.spec.measured and result.spec.host_ns_per_byte["all_reduce"] > 0
    # The spec prices the timed points as timed, whatever the line's error.
    model = CommModel(result.spec)
    for c in result.checks:
        s = c.sample
        assert model.duration_ns(s.op, s.bytes, s.group_size, 1) == round(s.seconds * 1e9), s


@pytest.mark.slow
def test_cold_calls_time_the_call_and_not_the_compute_before_it() -> None:
    compute_s = 0.02
    samples = run_benchmark(
        max_procs=2, sizes=(4 * KiB, 64 * KiB), ops=("all_reduce", "send"), reps=3, calls_per_rep=2, warmup=1,
        timeout_s=60, compute_between_s=compute_s,
    )  # fmt: skip
    assert {(s.op, s.bytes) for s in samples} == {
        (op, n) for op in ("all_reduce", "send") for n in (4 * KiB, 64 * KiB)
    }
    # The 20 ms of compute before each call is not in its time (a 4 KiB call takes well under it);
    # a transfer's receiver, its recv posted, waits from its entry and is timed from the send.
    assert all(0 < s.seconds < compute_s / 2 for s in samples), samples


def test_a_cold_collective_is_timed_from_its_last_arrival_not_each_members_entry() -> None:
    # Member 0 enters 300 µs before member 1; both leave 100 µs after member 1 entered. The
    # 300 µs member 0 spent waiting is the busy loop's skew, not the collective's cost.
    early = torch.tensor([[0, 400_000], [1_000_000, 1_100_000]])
    late = torch.tensor([[300_000, 400_000], [1_000_000, 1_100_000]])
    assert _mean_latency_s([early, late]) == pytest.approx(100e-6)
    # A transfer is its receiver's wait, from the send's post: the first call. In the second the
    # receiver came late, the data already in: its wait is its own, and the sender's exit, before
    # the receiver arrived, is no latency at all (it counted -40 µs).
    receiver = torch.tensor([[0, 350_000], [1_050_000, 1_060_000]])
    sender = torch.tensor([[300_000, 310_000], [1_000_000, 1_010_000]])
    assert _mean_latency_s([sender, receiver], waiters=RECEIVER) == pytest.approx((50 + 10) / 2 * 1e-6)


def test_repetitions_go_round_the_points_so_a_slow_spell_falls_on_all_of_them(monkeypatch) -> None:
    # Timed point after point, a spell of the VM lasting seconds landed on one size: one
    # calibration priced a 64 KiB all-reduce at 1.19 ms, the next at 1.92 ms.
    import torch.distributed as dist

    order: list[str] = []
    monkeypatch.setattr(dist, "barrier", lambda group=None: order.append(f"barrier {group}"))
    calls = {0: (lambda: order.append("a"), "g2"), 1: (lambda: order.append("b"), "g2")}
    plan = _Plan(
        world=2, port=0, group_sizes=(2,), sizes=(4,), ops=("all_reduce",), reps=2, calls_per_rep=2,
        warmup=1, timeout_s=1, result_path="",
    )  # fmt: skip
    stamps, cpu_ns = _time_points(calls, plan)
    assert order == ["barrier g2", "a", "a", "barrier g2", "b", "b"] * 3  # warm-up, then 2 timed rounds
    assert [len(stamps[i]) for i in (0, 1)] == [4, 4]  # the warm-up round is not kept
    assert all(entry <= exit for entry, exit in stamps[0])
    assert set(cpu_ns) == {0, 1} and all(ns >= 0 for ns in cpu_ns.values())


@pytest.mark.slow
def test_wake_gaps_give_the_spec_a_wake_compute_table(tmp_path) -> None:
    config = CalibrationConfig(
        # Sizes far apart: on a noisy 2-vCPU machine a 4 KiB gloo all-reduce sometimes took
        # longer than a 1 MiB one over 3 reps, leaving no bandwidth to fit.
        sizes=(4 * KiB, 8 * MiB), max_procs=2, ops=("all_reduce", "send"), reps=3, timeout_s=60,
        out=tmp_path / "local.toml", wake_gaps_ms=(1.0,), wake_rounds=3,
    )  # fmt: skip
    spec = calibrate(config).spec
    assert not spec.measured  # the α-β line alone unless asked
    loaded = ClusterSpec.load(tmp_path / "local.toml")
    # The wake table: one point, at the wait the benchmark measured (1 ms and the answer's transfer).
    ((wait_us, extra_s),) = spec.wake_compute.items()
    assert 1000 <= int(wait_us) < 50_000 and math.isfinite(extra_s)
    assert loaded.wake_compute == spec.wake_compute and "compute after waits of 1 ms" in spec.notes


def test_busy_latencies_count_from_the_later_issue_and_rates_against_compute_alone() -> None:
    ms = 1_000_000
    # (bytes, way, issue_ns, done_ns, matmuls in flight, ns in flight), the same rows in each member.
    member0 = [
        (512, "idle", 0, 2 * ms, 0, 0),
        (512, "busy", 0, 7 * ms, 35, 7 * ms),
        (512, "no call", 0, 0, 100, 20 * ms),
    ]
    member1 = [
        (512, "idle", 1 * ms, 2 * ms, 0, 0),
        (512, "busy", 1 * ms, 5 * ms, 16, 4 * ms),
        (512, "no call", 0, 0, 100, 20 * ms),
    ]
    (sample,) = summarise_busy([member0, member1], rounds=1)
    assert sample.idle_s == pytest.approx(1e-3)  # both exits at 2 ms, the later issue at 1 ms
    assert sample.busy_s == pytest.approx(5e-3)  # exits at 7 and 5 ms: 6 and 4 after it
    assert sample.factor == pytest.approx(5.0)
    assert sample.compute_rate == pytest.approx(((35 / 7 + 16 / 4) / 2) / 5)  # against 5 matmuls a ms alone


@pytest.mark.slow
def test_busy_rounds_give_the_spec_a_busy_call_table(tmp_path) -> None:
    samples = run_busy_benchmark(sizes=(64 * KiB, 1 * MiB), rounds=2, warmup=1, span_s=0.005, timeout_s=60)
    assert [s.bytes for s in samples] == [64 * KiB, 1 * MiB]
    assert all(s.idle_s > 0 and s.busy_s > 0 and 0 < s.compute_rate < 2 and s.rounds == 2 for s in samples)
    config = CalibrationConfig(
        sizes=(4 * KiB, 8 * MiB), max_procs=2, ops=("all_reduce",), reps=2, timeout_s=60,
        out=tmp_path / "local.toml", busy_rounds=2,
    )  # fmt: skip
    spec = calibrate(config).spec
    assert set(spec.busy_call) == {str(4 * KiB), str(8 * MiB)} and all(v > 0 for v in spec.busy_call.values())
    assert ClusterSpec.load(tmp_path / "local.toml").busy_call == spec.busy_call
    assert "all-reduces beside compute over 2 rounds" in spec.notes
    with pytest.raises(ValueError, match="busy_rounds"):
        CalibrationConfig(busy_rounds=-1)
    with pytest.raises(ValueError, match="--busy-rounds"):
        CalibrationConfig(bench=False, comm_logs=(tmp_path,), busy_rounds=3)


@pytest.mark.slow
def test_cli_writes_a_spec_that_loads(tmp_path) -> None:
    out = tmp_path / "spec.toml"
    args = ["-o", str(out), "--max-procs", "2", "--sizes", "4KiB,1MiB", "--ops", "all_reduce,broadcast,send"]
    result = CliRunner().invoke(app, [*args, "--reps", "3", "--timeout", "30", "--table"])
    assert result.exit_code == 0, result.output
    assert "median relative error" in result.output and "measured table" in result.output
    spec = ClusterSpec.load(out)
    assert spec.name == "local"
    assert spec.intra_bandwidth_bytes_per_s == spec.inter_bandwidth_bytes_per_s  # one node
    assert set(spec.measured) == {"all_reduce", "broadcast", "p2p"}
    assert [n for n, _ in spec.measured["all_reduce"][2]] == [4 * KiB, 1024 * KiB]


def test_check_finds_a_spec_current_and_one_priced_off_stale(tmp_path) -> None:
    """--check writes nothing and prices the points timed now with the spec's measured table:
    against points timed a moment before, a spec is current within a generous tolerance; one
    whose points are a third of them is stale (exit 1) and says to recalibrate."""
    sizes = (4 * KiB, 64 * KiB, 1024 * KiB)
    points = run_benchmark(
        max_procs=2, sizes=sizes, ops=("all_reduce",), reps=5, calls_per_rep=3, warmup=2, timeout_s=30
    )
    made = replace(preset("h100-ib"), name="local", measured=measured_table(points))
    cheap = {
        c: {p: tuple((n, t / 3) for n, t in pts) for p, pts in g.items()} for c, g in made.measured.items()
    }
    spec, off = made.save(tmp_path / "spec.toml"), replace(made, measured=cheap).save(tmp_path / "off.toml")
    args = [
        "--max-procs",
        "2",
        "--sizes",
        "4KiB,64KiB,1MiB",
        "--ops",
        "all_reduce",
        "--reps",
        "5",
        "--timeout",
        "30",
    ]
    current = CliRunner().invoke(app, [*args, "--check", str(spec), "--tolerance", "2"])
    assert current.exit_code == 0, current.output
    said = " ".join(current.output.split())  # the console wraps
    assert "still prices this machine's calls" in said and "all_reduce" in said
    stale = CliRunner().invoke(app, [*args, "--check", str(off)])
    assert stale.exit_code == 1, stale.output
    said = " ".join(stale.output.split())
    assert "stale: all_reduce moved beyond ±25%" in said and "recalibrate" in said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["off.toml", "spec.toml"]
    # Points the table does not hold would be priced by interpolation: not compared.
    other = CliRunner().invoke(app, [*args[:2], "--sizes", "16KiB", *args[4:], "--check", str(spec)])
    assert other.exit_code == 2 and "holds none of the points timed" in " ".join(other.output.split())


def test_check_refuses_what_would_write_a_spec_and_a_spec_without_its_points(tmp_path) -> None:
    for extra in (["--table"], ["--no-bench"], ["-o", str(tmp_path / "x.toml")], ["--tolerance", "0"]):
        result = CliRunner().invoke(app, ["--check", "h100-ib", "--sizes", "4KiB", *extra])
        assert result.exit_code == 2, result.output
        assert "error:" in result.output
    assert not (tmp_path / "x.toml").exists()
    line_only = CliRunner().invoke(app, ["--check", "h100-ib", "--sizes", "4KiB"])
    assert line_only.exit_code == 2 and "no measured table" in " ".join(line_only.output.split())


def test_cli_errors_exit_2(tmp_path) -> None:
    for args in (
        ["--sizes", "4 parsecs"],
        ["--max-procs", "1"],
        ["--ops", "all_reduce,teleport"],
        ["--reps", "0"],
    ):
        result = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "x.toml")])
        assert result.exit_code == 2, result.output
        assert "error:" in result.output
    assert not (tmp_path / "x.toml").exists()


# -- the fit, on synthetic comm logs -------------------------------------------------------------

ALPHA, BETA = 20e-6, 0.5e-9  # 20 µs per hop, 2 GB/s
TRUE = {"all_reduce": (3 * ALPHA, 2 * BETA), "all_gather": (ALPHA, 4 * BETA), "send": (ALPHA / 2, BETA)}


SKEW_NS = 50_000  # members reach each call 50 µs apart: the fit must not price it


def _logs() -> list[CommLog]:
    """Four ranks' logs: every instance has all its members, each arriving ``SKEW_NS`` after
    the previous one, and completes the α-β time after the last arrival."""
    calls: dict[int, list[CommCall]] = {r: [] for r in range(4)}
    t = 10**18
    for op, (alpha, beta) in TRUE.items():
        for p in (2,) if op == "send" else (2, 4):
            for n in (4 * KiB, 64 * KiB, 1024 * KiB):
                hops, volume = single_node_terms(op, np.array([n]), np.array([p]))
                dur_ns = round((hops[0] * alpha + volume[0] * beta) * 1e9)
                if op == "send":  # the receiver posted first; done when its wait returned
                    calls[0].append(_call(calls[0], "send", n, 2, t, t + dur_ns, peer=1))
                    calls[1].append(_call(calls[1], "recv", n, 2, t - SKEW_NS, t + dur_ns, peer=0))
                else:
                    last = t + (p - 1) * SKEW_NS
                    for r in range(p):
                        calls[r].append(_call(calls[r], op, n, p, t + r * SKEW_NS, last + dur_ns))
                t += 10**6
    # A virtual call's time is the clock's, not the network's: the fit must ignore it.
    calls[0].append(_call(calls[0], "all_reduce", 4 * KiB, 2, t, t + 10**9, delegated=False))
    calls[1].append(_call(calls[1], "all_reduce", 4 * KiB, 2, t, t + 10**9, delegated=False))
    group = CommGroup(name="0", label="world", ranks=(0, 1, 2, 3), real_ranks=(0, 1, 2, 3))
    return [CommLog(rank=r, world_size=4, groups=(group,), calls=tuple(c)) for r, c in calls.items()]


def _call(
    earlier: list[CommCall], op: str, n: int, p: int, enter: int, done: int, *, peer: int | None = None,
    delegated: bool = True,
) -> CommCall:  # fmt: skip
    label = "world" if p == 4 else "pair"
    gseq = sum(c.label == label for c in earlier)
    return CommCall(
        seq=len(earlier), op=op, group=label, label=label, group_size=p, gseq=gseq, bytes=n,
        dtype="float32", shape=(n // 4,), peer=peer, enter_ns=enter, exit_ns=done, done_ns=done,
        delegated=delegated,
    )  # fmt: skip


def test_fit_from_comm_logs_prices_calls_from_their_last_arrival(tmp_path) -> None:
    for log in _logs():
        write_comm_log(log, tmp_path / "capture" / "comm" / f"rank{log.rank}.comm.json")
    (run,) = read_comm_logs([tmp_path / "capture"])  # no manifest: every call is read
    assert len(run) == 4 and all(keep is None for _, keep in run)
    fit = fit_from_comm_logs([run])
    for op, (alpha, beta) in TRUE.items():
        got = fit.classes["p2p" if op == "send" else op]
        assert got.alpha_s == pytest.approx(alpha, rel=1e-6)
        assert got.beta_s_per_byte == pytest.approx(beta, rel=1e-6)
    # The spec made from the fit reproduces every call's time after its last member arrived;
    # the first member's own call lasted the skew longer.
    model = CommModel(fit.to_spec(gpus_per_node=4))
    for call in (c for c in run[3][0].calls if c.delegated):
        predicted = model.duration_ns(call.op, call.bytes, call.group_size, 1)
        assert abs(predicted - (call.done_ns - call.enter_ns)) <= 1
    first = next(c for c in run[0][0].calls if c.op == "all_reduce" and c.group_size == 4)
    assert first.done_ns - first.enter_ns - model.duration_ns("all_reduce", first.bytes, 4, 1) == 3 * SKEW_NS
    # One member's log alone prices nothing: its durations would include the others' lateness.
    assert fit_from_comm_logs([run[:1]]).classes == {}


def test_cli_fits_a_real_jobs_calls_alone(tmp_path) -> None:
    for log in _logs():
        write_comm_log(log, tmp_path / "capture" / "comm" / f"rank{log.rank}.comm.json")
    out = tmp_path / "spec.toml"
    result = CliRunner().invoke(app, ["--no-bench", "--capture", str(tmp_path / "capture"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    spec = ClusterSpec.load(out)
    assert spec.intra_latency_s == pytest.approx(TRUE["send"][0], rel=1e-6)  # p2p is the reference link
    assert "the delegated calls of 1 captured run(s)" in spec.notes
    for args in (["--no-bench"], ["--no-bench", "--capture", str(tmp_path / "capture"), "--table"]):
        result = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "bad.toml")])
        assert result.exit_code == 2 and "error:" in result.output, result.output
    assert not (tmp_path / "bad.toml").exists()


def test_comm_logs_are_matched_within_a_run(tmp_path) -> None:
    files = []
    for log in _logs():
        files.append(tmp_path / "a" / "comm" / f"rank{log.rank}.comm.json")
        write_comm_log(log, files[-1])
    # Two captures are two runs: their calls are counted apart, never as one over-full instance.
    runs = read_comm_logs([tmp_path / "a", tmp_path / "a"])
    once, twice = samples_from_comm_logs(runs[:1]), samples_from_comm_logs(runs)
    assert [2 * s.count for s in once] == [s.count for s in twice] and once
    # Loose files are one run together, so each rank's log may come once only.
    (loose,) = read_comm_logs(files)
    assert samples_from_comm_logs([loose]) == once
    with pytest.raises(ValueError, match="rank 0's comm log given twice"):
        samples_from_comm_logs(read_comm_logs([*files, files[0]]))


def test_fit_samples_edge_cases() -> None:
    one_size = [Sample(op="all_reduce", bytes=4096, group_size=2, seconds=1e-4)] * 3
    fit = fit_samples(one_size)
    assert "all_reduce" in fit.skipped and not fit.classes  # α and β cannot be told apart
    with pytest.raises(CalibrationError):
        fit.to_spec(gpus_per_node=2)
    shrinking = [
        Sample(op="send", bytes=n, group_size=2, seconds=t) for n, t in ((4096, 2e-3), (10**6, 1e-3))
    ]
    assert "p2p" in fit_samples(shrinking).skipped
    with pytest.raises(CalibrationError, match="no capture directory"):
        read_comm_logs(["/nonexistent/capture"])


def test_measured_table_keeps_benchmark_points_by_class_and_group_size() -> None:
    samples = [
        Sample(op="all_reduce", bytes=65536, group_size=2, seconds=1.2e-3),
        Sample(op="all_reduce", bytes=512, group_size=2, seconds=1.7e-3),
        Sample(op="all_reduce", bytes=512, group_size=4, seconds=2.5e-3),
        Sample(op="send", bytes=4096, group_size=2, seconds=1e-4),
        Sample(op="barrier", bytes=0, group_size=2, seconds=5e-5),
        # A capture's calls are the job's, not the benchmark's points: not a table point.
        Sample(op="all_reduce", bytes=4096, group_size=2, seconds=9e-3, source="comm_log"),
    ]
    assert measured_table(samples) == {
        "all_reduce": {2: ((512, 1.7e-3), (65536, 1.2e-3)), 4: ((512, 2.5e-3),)},
        "p2p": {2: ((4096, 1e-4),)},
        "barrier": {2: ((0, 5e-5),)},
    }
