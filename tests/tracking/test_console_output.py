"""What a run puts on the console: the step line, the last line, progress off a terminal, and the workers'
output split between the console (progress, roll_ma's lines) and the run's log file (everything else)."""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import types
from pathlib import Path

from ray.experimental.tqdm_ray import RAY_TQDM_MAGIC

from roll_ma.distributed import worker_output
from roll_ma.distributed.worker_output import PlainProgress, WorkerOutput, route_worker_output
from roll_ma.pipelines.session import done_line
from roll_ma.pipelines.step_timer import startup_line
from roll_ma.tracking import console_summary, eval_change_line

METRICS = {
    "timing/step": 13.94,
    "system/rollout_tokens_per_s": 812.4,
    "system/train_tokens_per_s": 1234.0,
    "rollout/episodes": 128.0,
    "rollout/turns": 338.0,
    "agent/solver/reward": 0.4123,
    "agent/solver/policy_loss": -0.01,
    "agent/critic/reward": 0.125,
    "agent/critic/grad_norm": 0.5,
}


def test_the_step_line_has_the_time_with_its_unit_tokens_per_s_and_each_agents_reward():
    lines = console_summary(1, 3, METRICS, ["solver", "critic"]).splitlines()
    assert lines[0] == ("step 1/3  13.9 s  rollout 812 tok/s  train 1.23k tok/s  "
                        "reward solver=0.412 critic=0.125  (128 episodes, 338 turns)")
    assert lines[1] == "      solver: policy_loss=-0.01"  # the details below; the reward is above
    assert lines[2] == "      critic: grad_norm=0.5"


def test_the_step_line_leaves_out_what_the_step_did_not_measure():
    line = console_summary(2, 2, {"timing/step": 1.0}, ["solver"]).splitlines()[0]
    assert line == "step 2/2  1.0 s"


def test_the_last_line_names_the_checkpoint_the_metrics_and_the_plot():
    out = Path("out")
    line = done_line(out / "checkpoints/step_000003", out / "metrics.jsonl", out / "rewards.png")
    assert line == ("[roll_ma] done: checkpoint out/checkpoints/step_000003, metrics out/metrics.jsonl, "
                    "plot out/rewards.png")
    bare = done_line(None, out / "metrics.jsonl", None)
    assert bare == "[roll_ma] done: no checkpoint, metrics out/metrics.jsonl"


def test_the_start_up_line_lists_each_stage_that_ran_in_its_order():
    times = {"startup/ray": 2.04, "startup/workers": 1.1, "startup/train_model": 40.0,
             "startup/rollout_engine": 95.25, "startup/first_sync": 0.31, "startup/total": 139.9}
    assert startup_line(times) == ("[roll_ma] start-up 139.9 s: ray 2.0, workers 1.1, train model 40.0, "
                                   "rollout engine 95.2, first sync 0.3")


def _bar(x: int, closed: bool = False, uuid: str = "u1", desc: str = "rollout step 1, env worker 0") -> str:
    state = {"__magic_token__": RAY_TQDM_MAGIC, "x": x, "pos": 0, "desc": desc, "total": 4, "unit": "episode",
             "ip": "10.0.0.1", "pid": 7, "uuid": uuid, "closed": closed}
    return json.dumps(state)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def test_progress_off_a_terminal_is_plain_lines_without_redraws(tmp_path, capsys):
    """Bars drawn inside Ray workers reach the driver as state lines; off a terminal each bar becomes a line
    when it closes (and one every PLAIN_EVERY_S while it runs): no \\r, no escape codes."""
    ray_printed = []
    out = WorkerOutput(tmp_path / "run.log", terminal=False, ray_print=lambda d, **k: ray_printed.append(d))
    clock = FakeClock()
    out.progress = PlainProgress(clock=clock)
    batch = {"pid": 7, "actor_name": "EnvWorker", "is_err": False}
    out({**batch, "lines": [_bar(0), _bar(1)]})
    clock.now = worker_output.PLAIN_EVERY_S + 1  # a long rollout: one line while it runs
    out({**batch, "lines": [_bar(2)]})
    out({**batch, "lines": [_bar(3)]})  # soon after: no line
    out({**batch, "lines": [_bar(4, closed=True), _bar(1, closed=True, uuid="u2", desc="update solver")]})
    printed = capsys.readouterr()
    assert printed.err.splitlines() == [
        "rollout step 1, env worker 0: 2/4 episodes after 31 s",
        "rollout step 1, env worker 0: 4/4 episodes",
        "update solver: 1/4 episodes",
    ]
    assert "\r" not in printed.err + printed.out and "\x1b" not in printed.err + printed.out
    assert ray_printed == []  # Ray's bars are not drawn off a terminal
    out.close()


def test_engine_and_library_lines_go_to_the_run_log_and_roll_mas_own_stay_on_the_console(tmp_path, capsys):
    out = WorkerOutput(tmp_path / "run.log", terminal=False, ray_print=lambda d, **k: None)
    out({"pid": 9, "actor_name": "RolloutWorker", "is_err": True, "lines": [
        "(EngineCore pid=12) INFO 11-27 01:45:51 [core.py:133] Initializing the engine",
        "\x1b[36mLoading checkpoint shards:   0% | 0/1\rLoading checkpoint shards: 100% | 1/1",
        "[roll_ma] warning: vllm top_p < 1: log-probs are the truncated distribution's",
    ]})
    out.close()
    printed = capsys.readouterr()
    assert printed.err == "[roll_ma] warning: vllm top_p < 1: log-probs are the truncated distribution's\n"
    assert printed.out == ""
    log = (tmp_path / "run.log").read_text().splitlines()
    assert log[0].startswith("---- run started ")
    assert log[1:] == [
        "(RolloutWorker pid=9) (EngineCore pid=12) INFO 11-27 01:45:51 [core.py:133] Initializing the engine",
        "(RolloutWorker pid=9) Loading checkpoint shards: 100% | 1/1",  # the last redraw, plain
    ]


class FakeTerminal(io.StringIO):
    """stdout and stderr of a terminal 80 columns wide: one stream, so that the order of writes is kept."""

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        raise OSError("no descriptor")  # the size is asked of the descriptor: 80 x 24 without one


def screen(output: str) -> list[str]:
    """The lines a terminal shows after ``output`` (text, \\r, \\n, cursor up, clear to the end of the
    screen or line; other escapes, colours, change nothing on the lines)."""
    lines, row, col, i = [""], 0, 0, 0
    while i < len(output):
        esc = re.match(r"\x1b\[(\d*)([A-Za-z])", output[i:])
        if esc:
            n, code = int(esc.group(1) or 1), esc.group(2)
            if code == "A":
                row = max(row - n, 0)
            elif code in "JK":
                lines[row] = lines[row][:col]
                if code == "J":
                    del lines[row + 1:]
            i += esc.end()
            continue
        ch, i = output[i], i + 1
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row, col = row + 1, 0
            lines += [""] * (row + 1 - len(lines))
        else:
            line = lines[row].ljust(col)
            lines[row], col = line[:col] + ch + line[col + 1:], col + 1
    while lines and not lines[-1].strip():
        lines.pop()
    return [line.rstrip() for line in lines]


def test_on_a_terminal_bars_redraw_in_place_and_prints_go_above_them(tmp_path, monkeypatch):
    term = FakeTerminal()
    monkeypatch.setattr(sys, "stdout", term)
    monkeypatch.setattr(sys, "stderr", term)
    calls = []
    out = WorkerOutput(tmp_path / "run.log", terminal=True, ray_print=lambda d, **k: calls.append((d, k)))
    out.bars.clock = FakeClock()
    batch = {"pid": 9, "actor_name": "EnvWorker", "is_err": True}
    for x in range(4):
        out({**batch, "lines": [_bar(x)]})
    shown = screen(term.getvalue())
    assert len(shown) == 1 and shown[0].startswith("rollout step 1, env worker 0:  75%|"), shown  # in place
    assert "3/4" in shown[0]
    out({**batch, "lines": [_bar(0, uuid="u2", desc="update solver"), "noise", "[roll_ma] note"]})
    print("step 1/3  13.9 s")  # the driver's own line, while two bars are up
    shown = screen(term.getvalue())
    assert shown[:2] == ["[roll_ma] note", "step 1/3  13.9 s"], shown  # above the bars
    assert [line.split(":")[0] for line in shown[2:]] == ["rollout step 1, env worker 0", "update solver"]
    out({**batch, "lines": [_bar(4, closed=True), _bar(1, closed=True, uuid="u2", desc="update solver"),
                            _bar(5, closed=True, uuid="u3", desc="never drawn")]})
    assert screen(term.getvalue()) == ["[roll_ma] note", "step 1/3  13.9 s"]  # finished bars leave no line
    out({"pid": "autoscaler", "lines": ["Warning: The following resource request cannot be scheduled"]})
    out.close()
    assert sys.stdout is term and sys.stderr is term  # given back
    assert [(c[0]["lines"], c[1]) for c in calls] == [
        (["Warning: The following resource request cannot be scheduled"], {"ignore_prefix": False})]
    assert "noise" in (tmp_path / "run.log").read_text()


def test_routing_replaces_rays_printer_and_an_earlier_runs_handler(tmp_path, monkeypatch):
    dispatcher = types.SimpleNamespace(handlers=[("ray_print_logs", print)])
    dispatcher.remove_handler = lambda name: setattr(
        dispatcher, "handlers", [h for h in dispatcher.handlers if h[0] != name])
    dispatcher.add_handler = lambda name, fn: dispatcher.handlers.append((name, fn))
    import ray._private.ray_logging as ray_logging

    monkeypatch.setattr(ray_logging, "global_worker_stdstream_dispatcher", dispatcher)
    first = route_worker_output(tmp_path / "a" / "run.log", terminal=False)
    second = route_worker_output(tmp_path / "b" / "run.log", terminal=False)
    assert dispatcher.handlers == [(worker_output.HANDLER_NAME, second)]
    assert first._log.closed and not second._log.closed
    worker_output.unroute_worker_output()  # shutdown_ray: the next ray.init prints as Ray does
    assert dispatcher.handlers == [] and second._log.closed
    dispatcher.handlers = []  # ray.init(log_to_driver=False): nothing to route
    assert route_worker_output(tmp_path / "c" / "run.log") is None


def test_roll_ma_warnings_in_a_worker_take_the_form_the_console_keeps(capsys):
    logger = logging.getLogger("roll_ma")
    saved = logger.handlers[:], logger.level, logger.propagate
    try:
        worker_output.worker_logging()
        worker_output.worker_logging()  # once per process
        logging.getLogger("roll_ma.inference.vllm_infer").warning("top_p %s < 1", 0.9)
        logging.getLogger("roll_ma.workers.rollout_worker").info("rollout rank 0: vllm ready")
    finally:
        logger.handlers, logger.level, logger.propagate = saved
    assert capsys.readouterr().err.splitlines() == ["[roll_ma] warning: top_p 0.9 < 1",
                                                    "roll_ma info: rollout rank 0: vllm ready"]


def test_vllm_does_not_warn_about_what_roll_ma_chose():
    from roll_ma.inference.vllm_quiet import quiet_own_choices

    quiet_own_choices()
    quiet_own_choices()
    args = logging.getLogger("vllm.engine.arg_utils")
    processor = logging.getLogger("vllm.v1.engine.input_processor")
    # a handler of our own on the loggers, which are enabled at WARNING for the test: what ran before (vLLM's
    # import, a dictConfig of Hydra's or Ray's) may have cut "vllm" off the root logger or disabled it
    seen: list[str] = []
    keep = logging.Handler(logging.WARNING)
    keep.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    saved = [(lg, lg.disabled, lg.level) for lg in (args, processor)]
    disabled_below = logging.root.manager.disable  # a library's logging.disable(...) would drop them too
    logging.disable(logging.NOTSET)
    for vllm_logger in (args, processor):
        vllm_logger.addHandler(keep)
        vllm_logger.disabled = False
        vllm_logger.setLevel(logging.WARNING)
    try:
        args.warning("This model does not officially support disabling chunked prefill. Disabling this ...")
        processor.warning("vLLM has deprecated support for supporting different tokenizers for different ...")
        args.warning("max_model_len is larger than the model's context")
    finally:
        logging.disable(disabled_below)
        for vllm_logger, disabled, level in saved:
            vllm_logger.removeHandler(keep)
            vllm_logger.disabled = disabled
            vllm_logger.setLevel(level)
    assert seen == ["max_model_len is larger than the model's context"]
    assert len(args.filters) == 1


RUN_WITH_BARS = """
import sys
from roll_ma.distributed.worker_output import WorkerOutput, forget_colour_reset, is_terminal
import ray.autoscaler._private.cli_logger  # what ray.init imports: colorama's reset at exit
forget_colour_reset()
out = WorkerOutput(sys.argv[1], is_terminal(sys.stdout, sys.stderr), print)
for x in range(5):
    out({"pid": 7, "actor_name": "EnvWorker", "is_err": True, "lines": [BARS[x]]})
print("step 1/1  2.0 s")
out({"pid": 7, "actor_name": "EnvWorker", "is_err": True, "lines": [BARS[5]]})
out.close()
print("[roll_ma] done")
"""


def _run_with_bars(tmp_path, **streams) -> subprocess.CompletedProcess:
    bars = [_bar(x) for x in range(5)] + [_bar(4, closed=True)]
    script = f"BARS = {bars!r}\n" + RUN_WITH_BARS
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-c", script, str(tmp_path / "run.log")], env=env, check=True,
                          timeout=120, **streams)


def test_a_real_terminal_gets_bars_drawn_in_place_and_a_pipe_plain_lines(tmp_path):
    """The same run in a pseudo-terminal (as a user's shell) and into a pipe (as `| tee` or a batch job)."""
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    _run_with_bars(tmp_path, stdin=subprocess.DEVNULL, stdout=child, stderr=child)
    os.close(child)
    raw = b""
    while True:
        try:
            chunk = os.read(parent, 65536)
        except OSError:  # the child side is closed and everything was read
            break
        if not chunk:
            break
        raw += chunk
    os.close(parent)
    text = raw.decode()
    assert "\x1b[1A" in text and "|" in text  # a bar, redrawn by moving back up over it
    assert screen(text) == ["step 1/1  2.0 s", "[roll_ma] done"]  # no bar left behind, no blank line
    assert text.endswith("[roll_ma] done\r\n"), repr(text[-40:])  # nothing after the last line (ESC[0m)

    piped = _run_with_bars(tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    assert piped.stdout.decode().splitlines() == [
        "step 1/1  2.0 s", "rollout step 1, env worker 0: 4/4 episodes", "[roll_ma] done"]


def test_the_last_lines_put_the_first_and_last_evaluation_side_by_side_counts_left_out():
    rows = [
        {"step": 0, "eval/pass1@turn1": 0.46, "eval/critic_verdicts": 200, "eval/num_episodes": 200},
        {"step": 1, "train/loss": 0.3},  # a step without an evaluation
        {"step": 50, "eval/pass1@turn1": 0.655, "eval/critic_verdicts": 200},
        {"step": 100, "eval/pass1@turn1": 0.645, "eval/critic_balanced_accuracy": 0.616,
         "eval/critic_verdicts": 200, "eval/num_episodes": 200},
    ]  # fmt: skip
    assert eval_change_line(rows) == "[roll_ma] evaluation, step 0 -> 100: pass1@turn1 0.46 -> 0.645"
    assert eval_change_line(rows[:2]) is None  # one evaluation: nothing to compare
    counts_only = [{"step": 0, "eval/num_episodes": 9}, {"step": 5, "eval/num_episodes": 9}]
    assert eval_change_line(counts_only) is None
