"""One message per failure: the short form of worker errors, their log file, pickling, the CLI and train().

Everything here runs without Ray: worker failures are built from the traceback text Ray hands the driver
(``watchdog.task_failure`` / ``actor_failure``), the run is replaced by a function that raises.
"""

from __future__ import annotations

import pickle
import traceback
from pathlib import Path

import pytest

from roll_ma.distributed.watchdog import WorkerError, actor_failure, task_failure
from roll_ma.envs.team_hooks import HookError
from roll_ma.error_report import parse_traceback, summarize
from roll_ma.errors import PreflightError, RollMaError, UserCodeError

ESC = "\x1b["
# what Ray's str(RayTaskError) looks like: a coloured actor header, then the actor's frames
RAY_HEADER = "\x1b[36mray::EnvWorker.run_episodes()\x1b[39m (pid=1, ip=10.0.0.1, actor_id=ab, repr=<W>)"


def _traceback_of(fn) -> tuple[BaseException, str]:
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - the test wants any
        return err, RAY_HEADER + "\n" + "".join(traceback.format_exception(err)).split("\n", 1)[1]
    raise AssertionError("fn did not raise")


def _index_error() -> None:
    import torch

    torch.nn.functional.embedding(torch.tensor([600]), torch.zeros(512, 4))  # an id outside the vocabulary


def _hook_error() -> None:
    raise HookError("agent 'reasoner': pre_process of /x/hooks.py raised ZeroDivisionError: boom",
                    "/x/hooks.py:2 in pre_process", "correct pre_process at that line")


def test_parse_traceback_finds_frames_and_the_final_exception_without_colour():
    _, text = _traceback_of(_index_error)
    frames, final = parse_traceback(text)
    assert frames[0].function == "_traceback_of" and frames[-1].file.endswith("torch/nn/functional.py")
    assert final.startswith("IndexError: index out of range")
    assert ESC not in final


def test_a_plain_exception_in_a_worker_is_a_few_lines_naming_the_library_frame_and_the_callers():
    err, text = _traceback_of(_index_error)
    failure = task_failure("rollout", 1, "generate", err, text)
    lines = str(failure).splitlines()
    assert lines[0].startswith("rollout worker rank 1 failed in generate(): IndexError: index out of range")
    # where: the library's frame, and the deepest frame outside libraries (this test file here)
    assert lines[1].startswith("  where: ") and "torch/nn/functional.py:" in lines[1]
    assert f"called from {__file__}:" in lines[1] and "in _index_error" in lines[1]
    assert lines[2].startswith("  fix: ") and len(lines) == 3
    assert ESC not in str(failure) and "Traceback" not in str(failure)
    assert "torch/nn/functional.py" in failure.details and ESC not in failure.details  # the log's part
    assert (failure.role, failure.rank, failure.method) == ("rollout", 1, "generate")


def _gpu_out_of_memory() -> None:
    import torch

    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_a_gpu_out_of_memory_in_a_worker_says_which_settings_give_memory_back():
    err, text = _traceback_of(_gpu_out_of_memory)
    fix = str(task_failure("train", 0, "train_step", err, text)).splitlines()[2]
    for knob in ("train.max_tokens_per_micro_batch", "model.gradient_checkpointing=true",
                 "rollout.sleep_level=1 frees its weights", "rollout.gpu_memory_utilization"):
        assert knob in fix
    other, other_text = _traceback_of(_index_error)  # any other error keeps the general fix
    assert "sleep_level" not in str(task_failure("train", 0, "train_step", other, other_text))


def test_a_user_code_error_in_a_worker_keeps_its_what_where_and_fix():
    err, text = _traceback_of(_hook_error)
    failure = task_failure("env", 0, "run_episodes", err, text)
    assert str(failure).splitlines() == [
        "env worker rank 0 failed in run_episodes(): agent 'reasoner': pre_process of /x/hooks.py raised "
        "ZeroDivisionError: boom",
        "  where: /x/hooks.py:2 in pre_process",
        "  fix: correct pre_process at that line",
    ]
    assert "_hook_error" in failure.details


def test_a_failure_inside_a_nested_worker_call_keeps_naming_the_inner_worker():
    inner = task_failure("rollout", 0, "generate", *_traceback_of(_index_error))
    outer_tb = RAY_HEADER + '\n  File "/a.py", line 1, in f\nX: y'
    outer = task_failure("env", 1, "run_episodes", inner, outer_tb)
    assert outer is inner and str(outer).startswith("rollout worker rank 0 failed in generate()")
    assert "re-raised by env worker rank 1 in run_episodes()" in outer.details


def test_an_actor_that_fails_to_start_names_its_exception_and_where():
    text = ("The actor died because of an error raised in its creation task, " + RAY_HEADER + "\n"
            '  File "/work/roll_ma/models/loading.py", line 33, in load_tokenizer\n'
            "    tok = AutoTokenizer.from_pretrained(\n"
            '  File "/venv/lib/python3.11/site-packages/transformers/hub.py", line 620, in cached_files\n'
            "    raise OSError(\n"
            "OSError: We couldn't connect to 'https://huggingface.co' to load the files.\n")
    failure = actor_failure("env", 0, "ping", text, in_init=True)
    lines = str(failure).splitlines()
    assert lines[0] == ("env worker rank 0 failed to start (its __init__ raised): OSError: We couldn't "
                        "connect to 'https://huggingface.co' to load the files.")
    assert lines[1] == ("  where: /venv/lib/python3.11/site-packages/transformers/hub.py:620 in "
                        "cached_files, called from /work/roll_ma/models/loading.py:33 in load_tokenizer")
    assert ESC not in str(failure) + failure.details


def test_an_actor_killed_without_a_python_error_points_at_memory():
    text = "The actor died unexpectedly before finishing this task.\n\tclass_name: TrainWorker\n\tpid: 7"
    failure = actor_failure("train", 0, "train_step", text, in_init=False)
    assert str(failure).startswith("train worker rank 0 died in train_step(): The actor died unexpectedly")
    assert "out of memory" in str(failure) and "class_name" not in str(failure)


def test_long_messages_are_cut_to_a_few_lines():
    rows = "\n".join(f"row {i}" for i in range(50))
    text = summarize("env worker rank 0 failed in f()", "ValueError: " + rows, "")
    assert text.count("\n") < 8 and "more lines in the log" in text


@pytest.mark.parametrize("err", [
    UserCodeError("what", "where", "fix"),
    HookError("agent 'a': pre_process returned str 'x'", "/h.py:1 in pre_process", "return ids"),
    WorkerError("env", 0, "run_episodes", "", "env worker rank 0 failed", details="tb"),
    PreflightError(["data.jsonl:3: chosen: empty"]),
])
def test_user_errors_cross_process_boundaries_whole(err):
    """Ray pickles a worker's exception: message and attributes must survive (cls(*args) would not)."""
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err) and back.__dict__ == err.__dict__


def test_the_log_file_holds_the_driver_and_worker_tracebacks_and_the_message_names_it(tmp_path):
    from roll_ma.error_report import attach_log

    err, text = _traceback_of(_index_error)
    failure = task_failure("rollout", 0, "generate", err, text)
    try:
        raise failure
    except WorkerError as raised:
        attach_log(raised, tmp_path / "out")
    log = Path(failure.log_path)
    assert log.parent == tmp_path / "out" / "logs" and log.is_file()
    assert str(failure).splitlines()[-1] == f"  full traceback: {log}"
    body = log.read_text()
    assert "---- traceback in the driver ----" in body and "test_error_report.py" in body
    assert "---- traceback in the worker(s) ----" in body and "torch/nn/functional.py" in body
    assert ESC not in body


# ---- the CLI and roll_ma.train print / raise the same message -------------------------------------------

@pytest.fixture
def tiny_cfg(tmp_path):
    from roll_ma.preflight.config_loader import load_config

    return load_config("math_selfplay_tiny", None, [f"trainer.output_dir={tmp_path / 'out'}"])


def _raising(err: BaseException):
    def run_training(cfg, step_hook=None):  # noqa: ANN001, ANN202 - stands in for the real one
        raise err

    return run_training


def test_cli_prints_a_worker_failure_as_its_message_with_the_log_and_exits_1(tiny_cfg, monkeypatch, capsys):
    import roll_ma.pipelines
    from roll_ma import cli

    err, text = _traceback_of(_hook_error)
    failure = task_failure("env", 0, "run_episodes", err, text)
    monkeypatch.setattr(roll_ma.pipelines, "run_training", _raising(failure))
    assert cli.run(tiny_cfg) == 1
    printed = capsys.readouterr().err
    lines = printed.strip().splitlines()
    assert lines[0].startswith("error: env worker rank 0 failed in run_episodes(): agent 'reasoner': pre")
    assert lines[1:3] == ["  where: /x/hooks.py:2 in pre_process", "  fix: correct pre_process at that line"]
    log = Path(lines[3].removeprefix("  full traceback: "))
    assert len(lines) == 4 and log.is_file() and log.parent == Path(tiny_cfg.trainer.output_dir) / "logs"
    assert "_hook_error" in log.read_text()
    assert "Traceback" not in printed and ESC not in printed


def test_cli_prints_an_unknown_driver_error_in_short_form_too(tiny_cfg, monkeypatch, capsys):
    import roll_ma.pipelines
    from roll_ma import cli

    monkeypatch.setattr(roll_ma.pipelines, "run_training", _raising(KeyError("adapter_version")))
    assert cli.run(tiny_cfg) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "error: the run failed: KeyError: 'adapter_version'"
    assert lines[1].startswith("  where: ") and "test_error_report.py" in lines[1]
    assert "in run_training" in lines[1]
    assert Path(lines[-1].removeprefix("  full traceback: ")).is_file()


def test_cli_prints_a_preflight_error_without_log_and_exits_2(tiny_cfg, monkeypatch, capsys):
    import roll_ma.pipelines
    from roll_ma import cli

    failure = PreflightError(["data.jsonl:3: chosen: empty"])
    monkeypatch.setattr(roll_ma.pipelines, "run_training", _raising(failure))
    assert cli.run(tiny_cfg) == 2
    assert capsys.readouterr().err == ("error: the run cannot start (1 problem):\n"
                                       "  - data.jsonl:3: chosen: empty\n")
    assert not (Path(tiny_cfg.trainer.output_dir) / "logs").exists()


def test_train_raises_the_typed_error_with_the_same_message_and_log(tiny_cfg, monkeypatch):
    import roll_ma
    import roll_ma.pipelines

    err, text = _traceback_of(_hook_error)
    failure = task_failure("env", 0, "run_episodes", err, text)
    monkeypatch.setattr(roll_ma.pipelines, "run_training", _raising(failure))
    with pytest.raises(WorkerError) as raised:
        roll_ma.train(tiny_cfg)
    assert isinstance(raised.value, RollMaError)
    assert str(raised.value).startswith("env worker rank 0 failed in run_episodes(): agent 'reasoner'")
    assert Path(raised.value.log_path).is_file()
    assert f"full traceback: {raised.value.log_path}" in str(raised.value)


def test_plain_output_strips_escapes_only_where_the_stream_is_not_a_terminal(capsys):
    import sys

    from roll_ma.cli import plain_output

    with plain_output():
        print("\x1b[36m(EnvWorker pid=1)\x1b[0m line\x1b[A", file=sys.stderr)
    assert capsys.readouterr().err == "(EnvWorker pid=1) line\n"


def test_str_of_the_error_train_raises_is_the_whole_message_the_cli_prints(tiny_cfg, monkeypatch, capsys):
    import roll_ma
    import roll_ma.pipelines
    from roll_ma import cli

    err, text = _traceback_of(_hook_error)
    failure = lambda: task_failure("env", 0, "run_episodes", err, text)  # noqa: E731 - a fresh one per run
    monkeypatch.setattr(roll_ma.pipelines, "run_training", _raising(failure()))
    assert cli.run(tiny_cfg) == 1
    printed = capsys.readouterr().err.removeprefix("error: ").rstrip("\n").splitlines()
    monkeypatch.setattr(roll_ma.pipelines, "run_training", _raising(failure()))
    with pytest.raises(WorkerError) as raised:
        roll_ma.train(tiny_cfg)
    lines = str(raised.value).splitlines()
    assert len(lines) == 4 and lines[:3] == printed[:3]  # what, where, fix; then each its own log file
    assert lines[1].startswith("  where: ") and lines[2].startswith("  fix: ")
    assert lines[3].startswith("  full traceback: ") and printed[3].startswith("  full traceback: ")


def test_a_log_folder_that_cannot_be_written_sends_the_log_to_temp_and_says_why(tmp_path):
    import tempfile

    from roll_ma.error_report import attach_log

    out = tmp_path / "out"
    out.mkdir()
    (out / "logs").write_text("a file where the logs folder goes")
    failure = attach_log(RollMaError("the run failed"), out)
    log = Path(failure.log_path)
    assert log.is_file() and log.parent == Path(tempfile.gettempdir())
    assert str(failure).splitlines()[-1] == (
        f"  full traceback: {log} (trainer.output_dir's {out / 'logs'} cannot be written: a file is in the "
        f"way ({out / 'logs'}))")
    log.unlink()


def test_a_file_the_run_cannot_write_in_the_output_dir_names_trainer_output_dir(tmp_path):
    from roll_ma.error_report import unexpected

    target = tmp_path / "checkpoints" / "step_000003" / "state.json"
    try:
        raise PermissionError(13, "Permission denied", str(target))
    except PermissionError as err:
        failure = unexpected(err, tmp_path)
    lines = str(failure).splitlines()
    assert lines[0] == (f"the run could not write to trainer.output_dir={tmp_path}: PermissionError: "
                        f"[Errno 13] Permission denied: '{target}'")
    assert lines[2].startswith("  fix: make trainer.output_dir writable again")
    assert Path(failure.log_path).parent == tmp_path / "logs"


def test_a_run_line_goes_to_the_console_and_with_its_time_to_run_log(tmp_path, capsys):
    import re

    from roll_ma.error_report import run_line

    run_line("[roll_ma] checkpoint written: x (step 1)", tmp_path)
    run_line("[roll_ma] stopped by SIGHUP", tmp_path / "never_made")  # a run stopped before its folder
    said = ["[roll_ma] checkpoint written: x (step 1)", "[roll_ma] stopped by SIGHUP"]
    assert capsys.readouterr().out.splitlines() == said
    logged = (tmp_path / "logs" / "run.log").read_text().splitlines()
    assert len(logged) == 1 and re.fullmatch(r"\(driver \d\d:\d\d:\d\d\) " + re.escape(said[0]), logged[0])
    assert not (tmp_path / "never_made").exists()  # no folder made for one line


# the driver's console is a pipe (``| tee run.txt``) whose reader died with the terminal: a line of the run
# still in the pipe's buffer, then the stop line
CONSOLE_GONE = """
import sys
from roll_ma.error_report import run_line

print("step 3/8 ...")
sys.stdin.readline()  # the test closes the console's reader, then says go
run_line("[roll_ma] stopped by SIGHUP (a closed terminal or ssh session)", sys.argv[1], sys.stderr)
sys.exit(129)
"""


def test_a_run_line_to_a_console_that_is_gone_is_in_run_log_and_the_exit_code_stays(tmp_path):
    # the stop line's write failed (EPIPE; EIO on a closed terminal), and Python's last flush of what was
    # left for the console turned the run's exit code into 120
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a console buffered as a pipe's
    reader, console = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", CONSOLE_GONE, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=console, stderr=console, text=True, env=env)
    os.close(console)
    os.close(reader)  # the console is gone
    proc.communicate("go\n", timeout=60)
    assert proc.returncode == 129
    assert (tmp_path / "logs" / "run.log").read_text().rstrip().endswith(
        ") [roll_ma] stopped by SIGHUP (a closed terminal or ssh session)")
