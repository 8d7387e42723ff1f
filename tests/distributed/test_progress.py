"""Progress bars: off unless the run turns them on, drawn by tqdm when on."""

from __future__ import annotations

from roll_ma.distributed.progress import ENV_FLAG, NoBar, progress_bar


def test_bars_are_off_unless_the_run_turns_them_on(monkeypatch, capsys):
    monkeypatch.delenv(ENV_FLAG, raising=False)
    bar = progress_bar("update solver, step 1", 3, "batch")
    assert isinstance(bar.bar, NoBar)  # counted and reported as activity, not drawn
    bar.update()
    bar.close()
    monkeypatch.setenv(ENV_FLAG, "0")
    assert isinstance(progress_bar("x", 1, "batch").bar, NoBar)
    monkeypatch.setenv(ENV_FLAG, "1")
    assert isinstance(progress_bar("x", 1, "batch", draw=False).bar, NoBar)  # ranks > 0 of a role
    assert capsys.readouterr().err == ""


def test_a_bar_counts_and_is_drawn_when_on(monkeypatch, capsys):
    monkeypatch.setenv(ENV_FLAG, "1")
    bar = progress_bar("update solver, step 1", 3, "batch")
    for _ in range(3):
        bar.update()
    assert bar.n == 3 and bar.total == 3
    bar.close()
    drawn = capsys.readouterr()
    assert "update solver, step 1" in drawn.err + drawn.out
