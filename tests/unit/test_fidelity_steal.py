"""prism.fidelity.steal: a run measured while the hypervisor took the machine's CPU time is run again."""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path

import pytest

from prism.fidelity import steal
from prism.fidelity.compare import paired_records, steal_line
from prism.fidelity.measure import RankRun, RunSettings, unstolen, windowed
from prism.fidelity.noise_floor import _floor

Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")


def _times(busy: float, stolen: float, guest: float = 0.0) -> Times:
    return Times(busy, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, stolen, guest, 0.0)


def test_the_share_stolen_is_of_all_cpu_time_and_guest_time_is_not_counted_twice() -> None:
    before, after = _times(100.0, 1.0), _times(196.0, 5.0, guest=50.0)
    assert steal.stolen_pct(before, after) == pytest.approx(4.0)  # 4 of 96 + 4
    assert steal.stolen_pct(before, before) == 0.0


class Clock:
    """``psutil.cpu_times`` of a machine whose runs see the given steal shares in turn."""

    def __init__(self, shares_pct: list[float]) -> None:
        self.shares = iter(shares_pct)
        self.now = _times(0.0, 0.0)
        self.reading_after = False

    def __call__(self) -> Times:
        if self.reading_after:  # each run: 100 s of CPU time, the share stolen
            share = next(self.shares)
            self.now = _times(self.now.user + 100.0 - share, self.now.steal + share)
        self.reading_after = not self.reading_after
        return self.now


def test_a_run_over_the_limit_is_made_again_in_a_fresh_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(steal.psutil, "cpu_times", Clock([7.5, 0.5]))
    out, made, said = tmp_path / "real", [], []

    def run() -> int:
        assert not out.exists()  # the folder of a run not kept is gone before the next
        out.mkdir()
        made.append(len(made))
        return len(made)

    result, stolen = steal.run_unstolen(run, out=out, limit_pct=2.0, tries=3, say=said.append)
    assert result == 2 and stolen == steal.Stolen(pct=pytest.approx(0.5), tries=2)
    assert len(said) == 1 and "7.5 %" in said[0]


def test_the_last_try_is_kept_whatever_its_steal_and_no_limit_keeps_the_first(monkeypatch) -> None:
    monkeypatch.setattr(steal.psutil, "cpu_times", Clock([9.0, 8.0, 6.0]))
    result, stolen = steal.run_unstolen(lambda: "run", out=None, limit_pct=2.0, tries=3)
    assert result == "run" and stolen.tries == 3 and stolen.pct == pytest.approx(6.0)
    monkeypatch.setattr(steal.psutil, "cpu_times", Clock([9.0]))
    assert steal.run_unstolen(lambda: "run", out=None, limit_pct=None)[1] == steal.Stolen(
        pytest.approx(9.0), 1
    )
    with pytest.raises(ValueError, match="at least 1"):
        steal.run_unstolen(lambda: "run", out=None, tries=0)


def _run(ms: float) -> RankRun:
    return RankRun(iter_ns=ms * 1e6, peak_bytes=1000, parts_ms={}, dynamic_bytes=0, window_ns=ms * 1e6 * 6)


def test_records_say_how_much_was_stolen_and_how_often_a_side_ran_again(tmp_path: Path, monkeypatch) -> None:
    # real runs of the two repeats: clean, then stolen once; twins: clean both times.
    monkeypatch.setattr(steal.psutil, "cpu_times", Clock([0.1, 0.2, 4.0, 0.3, 0.4]))
    times = iter([100.0, 101.0, 500.0, 99.0, 102.0])  # the stolen run (500 ms) is not kept

    def runs(root: Path, name: str) -> dict[int, RankRun]:
        ms = next(times)
        return {0: _run(ms), 1: _run(ms)}

    records = _floor("case", 2, RunSettings(work_dir=tmp_path), None, runs, bracket=False)
    assert records[0]["real_repeats_ms"] == [100.0, 99.0]
    assert records[0]["real_steal_pct"] == pytest.approx(0.3) and records[0][
        "pred_steal_pct"
    ] == pytest.approx(0.4)
    assert records[0]["real_reruns"] == 1 and records[0]["pred_reruns"] == 0
    assert records[0]["real_window_s"] == pytest.approx(0.597)  # six iterations of 99.5 ms
    line = steal_line(records)
    assert "at most 0.40 %" in line and "made again for it: 1" in line  # one rerun, not one per rank


def test_unstolen_marks_every_rank_of_the_run_kept(monkeypatch) -> None:
    monkeypatch.setattr(steal.psutil, "cpu_times", Clock([3.0, 1.0]))
    runs = unstolen(lambda: {0: _run(10.0), 3: _run(11.0)}, RunSettings(), Path("/nonexistent/prism-run"))
    assert [r.steal_pct for r in runs.values()] == pytest.approx([1.0, 1.0])
    assert [r.tries for r in runs.values()] == [2, 2]
    assert steal_line(paired_records("c", [runs], [runs])).startswith("CPU time stolen")


def test_the_warm_up_grows_to_span_the_window_on_the_fastest_rank() -> None:
    seen = []

    def probe(settings: RunSettings, out: Path) -> dict[int, RankRun]:
        seen.append((settings.warmup, out.name))
        return {0: _run(30.0), 1: _run(40.0)}

    fitted = windowed(RunSettings(warmup=8, window_s=3.0), probe)
    assert fitted.warmup == 102 and seen == [
        (8, "probe")
    ]  # 100 clean iterations of 30 ms, cold and last aside
    assert windowed(RunSettings(warmup=200, window_s=3.0), probe).warmup == 200  # never shorter
    assert windowed(RunSettings(warmup=8), probe).warmup == 8 and len(seen) == 2  # no window: no probe
