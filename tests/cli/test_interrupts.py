"""roll_ma.interrupts in one process, no Ray: which signal stopped the run (Ctrl-C, SIGTERM, SIGHUP), once,
and not inside ray.init."""

from __future__ import annotations

import os
import re
import signal

import pytest

from roll_ma.interrupts import HungUp, Terminated, deferred_stops, exit_code, stop_signals, stopped_message

HUP_LINE = "stopped by SIGHUP (a closed terminal or ssh session)"


@pytest.fixture(autouse=True)
def _signals_as_in_a_terminal():
    """SIGINT and SIGHUP as a run started in a terminal gets them: a test run under nohup or as a shell's
    background job inherits them ignored, which stop_signals rightly leaves alone."""
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _signal_self(signum: int) -> None:
    os.kill(os.getpid(), signum)  # the handler runs in this (the main) thread before the call returns


def test_sigterm_is_reported_as_sigterm_even_when_ray_turned_it_into_a_plain_keyboard_interrupt():
    with stop_signals(), pytest.raises(Terminated):
        _signal_self(signal.SIGTERM)
    # what a ray.wait interrupted by our handler raises instead of Terminated
    assert exit_code(KeyboardInterrupt()) == 143
    assert stopped_message(KeyboardInterrupt(), None, "auto").startswith("stopped by SIGTERM before the run")


def test_ctrl_c_is_130_and_a_second_signal_during_the_cleanup_is_ignored():
    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or Ray's where an earlier test started Ray
    with stop_signals():
        with pytest.raises(KeyboardInterrupt) as stop:
            _signal_self(signal.SIGINT)
        _signal_self(signal.SIGTERM)  # ignored: the cleanup runs to its end
        _signal_self(signal.SIGINT)
    assert not isinstance(stop.value, Terminated) and exit_code(stop.value) == 130
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the caller's handlers are back
    assert signal.getsignal(signal.SIGTERM) is before


def test_sighup_stops_like_sigterm_and_is_reported_as_sighup_exit_129():
    # a closed terminal or ssh session: once the driver died of it at once (exit 129, no line, Ray left)
    before = signal.getsignal(signal.SIGHUP)
    with stop_signals():
        with pytest.raises(HungUp) as stop:
            _signal_self(signal.SIGHUP)
        _signal_self(signal.SIGHUP)  # ignored, as a second SIGTERM is: the cleanup runs to its end
        _signal_self(signal.SIGTERM)
    assert isinstance(stop.value, Terminated) and exit_code(stop.value) == 129
    assert signal.getsignal(signal.SIGHUP) is before  # the caller's handler is back
    # what a ray.wait interrupted by our handler raises instead of HungUp
    assert exit_code(KeyboardInterrupt()) == 129
    assert stopped_message(KeyboardInterrupt(), None, "auto") == (
        f"{HUP_LINE} before the run started; run the same command to start it"
    )


def test_a_sighup_inside_deferred_stops_is_raised_as_sighup_when_it_ends():
    done = []
    with stop_signals(), pytest.raises(HungUp):
        with deferred_stops():  # ray.init: a SIGHUP there would leave a half-built Ray
            _signal_self(signal.SIGHUP)
            done.append("ray.init ran to its end")
    assert done == ["ray.init ran to its end"]


def test_an_ignored_sighup_stays_ignored():
    # nohup: the run is meant to outlive its terminal
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_signals():
            _signal_self(signal.SIGHUP)
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_stop_inside_deferred_stops_is_raised_when_it_ends():
    done = []
    with stop_signals(), pytest.raises(Terminated):
        with deferred_stops():
            _signal_self(signal.SIGTERM)
            done.append("ray.init ran to its end")
    assert done == ["ray.init ran to its end"]


def test_an_ignored_sigint_stays_ignored():
    # a shell's background job starts with SIGINT ignored: it is not the job's to get
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with stop_signals():
            _signal_self(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def _library_error_out_of_a_stop(stop: KeyboardInterrupt) -> Exception:
    """What a stop raised inside a library can come out as: its ``finally`` touching a name never set."""
    try:
        try:
            raise stop
        finally:
            raise UnboundLocalError("cannot access local variable 'f' where it is not set")
    except UnboundLocalError as err:
        return err


def test_an_error_that_grew_out_of_a_stop_is_the_stop():
    from roll_ma.interrupts import stop_behind

    stop = Terminated()
    assert stop_behind(_library_error_out_of_a_stop(stop)) is stop
    assert stop_behind(ValueError("a plain failure")) is None


@pytest.mark.parametrize("wrapped_as", ["config problem", "crash", "swallowed"])
def test_a_sigterm_that_a_library_turned_into_its_own_error_while_the_config_is_read_exits_143(
    monkeypatch, capsys, wrapped_as
):
    # once: SIGTERM landed in Hydra's compose and the CLI said "invalid config: cannot access local variable"
    import roll_ma.preflight.config_loader as config_loader
    from roll_ma.cli import main
    from roll_ma.config import ConfigError, ConfigProblem

    def load_config(*args, **kwargs):
        if wrapped_as == "swallowed":  # a check that catches everything and reports a problem after it
            try:
                _signal_self(signal.SIGTERM)
            except KeyboardInterrupt:
                pass
            raise ConfigError([ConfigProblem("model.path", "cannot be loaded")])
        err = _library_error_out_of_a_stop(Terminated())
        if wrapped_as == "crash":
            raise err
        try:
            raise err
        except UnboundLocalError:
            raise ConfigError([ConfigProblem("toy.yaml", str(err))]) from None

    monkeypatch.setattr(config_loader, "load_config", load_config)
    assert main(["--config_name", "toy"]) == 143
    err = capsys.readouterr().err
    assert err.strip() == ("[roll_ma] stopped by SIGTERM before the run started; "
                           "run the same command to start it")


@pytest.mark.parametrize("finished", [True, False])
def test_a_stop_as_the_run_finishes_says_nothing_is_left_rather_than_resume(
    tmp_path, monkeypatch, capsys, finished
):
    # once: a SIGTERM after the last checkpoint said "run the same command to resume from step_000002"
    from checkpoint_helpers import finished_checkpoint

    import roll_ma.run as run_module
    from roll_ma.cli import run
    from roll_ma.preflight.config_loader import load_config

    overrides = [f"trainer.output_dir={tmp_path}", "trainer.max_steps=2"]
    cfg = load_config("math_selfplay_tiny", overrides=overrides)

    def stopped_after_its_checkpoint(_cfg):
        finished_checkpoint(cfg, 2 if finished else 1, {"planner": {}})
        raise Terminated()

    monkeypatch.setattr(run_module, "run_config", stopped_after_its_checkpoint)
    assert run(cfg) == 143
    line = capsys.readouterr().err.strip().splitlines()[-1]
    if finished:
        assert line == (f"[roll_ma] stopped by SIGTERM as the run was finishing, its work saved: step 2 of 2 "
                        f"already done in {tmp_path}; raise trainer.max_steps to continue")
    else:
        assert line.startswith("[roll_ma] stopped by SIGTERM; run the same command to resume from ")


def test_a_sighup_during_the_run_is_one_line_on_the_console_and_in_run_log(tmp_path, monkeypatch, capsys):
    # after a SIGHUP the terminal is usually gone: the run's log file is where the line can still be read
    from checkpoint_helpers import finished_checkpoint

    import roll_ma.run as run_module
    from roll_ma.cli import run
    from roll_ma.preflight.config_loader import load_config

    overrides = [f"trainer.output_dir={tmp_path}", "trainer.max_steps=4"]
    cfg = load_config("math_selfplay_tiny", overrides=overrides)

    def stopped_after_step_1(_cfg):
        finished_checkpoint(cfg, 1, {"planner": {}})
        raise HungUp()

    monkeypatch.setattr(run_module, "run_config", stopped_after_step_1)
    assert run(cfg) == 129
    line = capsys.readouterr().err.strip().splitlines()[-1]
    last = tmp_path / "checkpoints" / "step_000001"
    resume = f"run the same command to resume from {last} (trainer.resume=auto)"
    assert line == f"[roll_ma] {HUP_LINE}; {resume}"
    logged = (tmp_path / "logs" / "run.log").read_text().splitlines()[-1]
    assert re.fullmatch(r"\(driver \d\d:\d\d:\d\d\) " + re.escape(line), logged), logged
