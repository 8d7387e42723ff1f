"""A run leaves nothing behind, however it ends: no process it started, no Ray it started, no /dev/shm entry
of its processes. Real subprocess runs of the tiny CPU config: through the CLI to success, Ctrl-C and
SIGTERM (which ends like Ctrl-C: one line saying how to resume, exit 143) at any moment (mid-run, while Ray
starts, inside an import, during a checkpoint write; to the driver as a scheduler sends it, or to its whole
process group as ``timeout`` and a terminal do), SIGHUP (a closed terminal or ssh session: as SIGTERM, exit
129, nothing of Ray left 15 s after), and through ``roll_ma.train`` to success and to a failure, in a
caller that lives on."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from pipeline_helpers import REPO, steps_logged, toy_config, write_config

from roll_ma.distributed.shm_transfer import shm_dir

pytestmark = pytest.mark.slow
AGENTS = [{"name": "alice"}, {"name": "bob"}]
TAG = "ROLL_MA_LIFECYCLE_TEST"  # in the environment of the run's driver, hence of every process it starts


@contextlib.contextmanager
def _signals_of_a_terminal_job():
    """The driver starts with the signal dispositions of a job run from a terminal, however pytest itself
    was started: a shell's background job starts with SIGINT ignored, and ``nohup`` with SIGHUP ignored,
    which exec keeps (Python then installs no KeyboardInterrupt; roll_ma keeps an ignored SIGHUP ignored,
    as nohup asks)."""
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_hup = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous_int if previous_int is not None else signal.SIG_DFL)
        signal.signal(signal.SIGHUP, previous_hup if previous_hup is not None else signal.SIG_DFL)


def _launch(cmd: list[str], tag: str, **kwargs) -> subprocess.Popen:
    # its own session: a terminal's Ctrl-C reaches the driver and the Ray processes it started (killpg)
    env = {**os.environ, TAG: tag, "PYTHONUNBUFFERED": "1"}
    with _signals_of_a_terminal_job():
        return subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, **kwargs)


def _cli(config_dir: Path, tag: str, patch: str = "") -> subprocess.Popen:
    """The CLI on the toy config; ``patch``: Python run in the driver first (a slow save, a signal)."""
    args = ["--config_path", str(config_dir), "--config_name", "toy"]
    if not patch:
        return _launch([sys.executable, str(REPO / "start_pipeline.py"), *args], tag)
    main = f"import sys\n{patch}\nfrom roll_ma.cli import main\nsys.exit(main({args!r}))\n"
    return _launch([sys.executable, "-c", main], tag)


def _send(proc: subprocess.Popen, how: str) -> None:
    """What a terminal (Ctrl-C: the foreground process group), a scheduler (SIGTERM: the driver),
    ``timeout`` (SIGTERM: the group) or a closed terminal's shell (SIGHUP: the job's group) sends."""
    if how == "ctrl_c":
        os.killpg(proc.pid, signal.SIGINT)
    elif how == "sigterm_group":
        os.killpg(proc.pid, signal.SIGTERM)
    elif how == "sighup_group":
        os.killpg(proc.pid, signal.SIGHUP)
    else:
        os.kill(proc.pid, signal.SIGTERM)


# how -> (exit code, the stop line's start)
ENDINGS = {
    "ctrl_c": (130, "[roll_ma] interrupted (Ctrl-C)"),
    "sigterm": (143, "[roll_ma] stopped by SIGTERM"),
    "sigterm_group": (143, "[roll_ma] stopped by SIGTERM"),
    "sighup_group": (129, "[roll_ma] stopped by SIGHUP (a closed terminal or ssh session)"),
}
HUP_GONE_S = 15.0  # SIGHUP's bound: nothing of the run's Ray is left this long after the driver exits


def _stopped(proc: subprocess.Popen, how: str, seen: list[str], tag: str) -> str:
    """Wait for the stopped run; check its exit code, its last line (returned), no traceback or Ray noise,
    and that no process of it is left."""
    rest, _ = proc.communicate(timeout=120)  # the bound is 30 s; a loaded machine gets more
    log = "".join(seen) + rest
    code, what = ENDINGS[how]
    assert proc.returncode == code, log[-4000:]
    last = log.rstrip().splitlines()[-1]
    assert last.startswith(what), log[-4000:]
    for noise in ("Traceback", "SIGTERM received", "ImportError", "Segmentation fault", "GCS"):
        assert noise not in log, log[-4000:]
    assert _wait_until_gone(tag, deadline_s=HUP_GONE_S if how.startswith("sighup") else 60.0) == {}
    return last


def _processes(tag: str) -> dict[int, str]:
    """pid -> command line of every process whose environment holds the tag."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"{TAG}={tag}".encode() in (entry / "environ").read_bytes():
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _wait_until_gone(tag: str, keep: set[int] = frozenset(), deadline_s: float = 60.0) -> dict[int, str]:
    """Poll until no tagged process but ``keep`` is left (Ray's agents notice their raylet's end within
    seconds); returns what is still there at the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        left = {pid: cmd for pid, cmd in _processes(tag).items() if pid not in keep}
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.5)


def _shm_entries(pids: set[int]) -> list[str]:
    """roll_ma's /dev/shm entries owned by one of ``pids`` (each name carries its owner's pid)."""
    own = re.compile(r"^roll_ma_(?:sync|lora)_(\d+)_")
    return [p.name for p in shm_dir().iterdir() if (m := own.match(p.name)) and int(m.group(1)) in pids]


def _read_until(proc: subprocess.Popen, pattern: str, seen: list[str]) -> None:
    """Read the run's output until a line matches (the event to act on: no polling)."""
    wanted = re.compile(pattern)
    for line in proc.stdout:
        seen.append(line)
        if wanted.search(line):
            return
    pytest.fail(f"the run ended before {pattern!r}:\n{''.join(seen)[-4000:]}")


def _config_dir(tmp_path: Path, model_dir: str, steps: int, **sections) -> Path:
    cfg = toy_config(tmp_path, model_dir, AGENTS, trainer={"max_steps": steps, "resume": "auto"}, **sections)
    return write_config(tmp_path, cfg)


VLLM = pytest.param("vllm", marks=pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                      reason="vllm(-cpu) is not installed"))


@pytest.mark.parametrize("backend", ["hf", VLLM])
def test_a_finished_cli_run_leaves_nothing_behind(backend, tiny_model_dir, tmp_path):
    # vllm (adapter_sync=disk): the engine's adapter folder lives in /dev/shm for the whole run
    rollout = {"backend": backend, **({"adapter_sync": "disk"} if backend == "vllm" else {})}
    tag, seen = uuid.uuid4().hex, []
    proc = _cli(_config_dir(tmp_path, tiny_model_dir, steps=2, rollout=rollout), tag)
    _read_until(proc, r"step 1/2 ", seen)
    pids = set(_processes(tag))  # the driver, Ray's processes and every actor, mid-run
    if backend == "vllm":
        assert any(name.startswith("roll_ma_lora_") for name in _shm_entries(pids))
    rest, _ = proc.communicate(timeout=600)
    log = "".join(seen) + rest
    assert proc.returncode == 0, log[-4000:]
    assert steps_logged(tmp_path / "out") == [1, 2]
    assert _wait_until_gone(tag) == {}
    assert _shm_entries(pids) == []


@pytest.mark.parametrize("how", ["ctrl_c", "sigterm", "sigterm_group", "sighup_group"])
def test_an_interrupted_cli_run_says_how_to_resume_leaves_nothing_and_resumes(how, tiny_model_dir, tmp_path):
    # 8 steps of ~0.6 s: the signal lands mid-run on a loaded machine too (3 steps finished first once)
    config_dir, out = _config_dir(tmp_path, tiny_model_dir, steps=8), tmp_path / "out"
    tag, seen = uuid.uuid4().hex, []
    proc = _cli(config_dir, tag)
    _read_until(proc, r"step 2/8 ", seen)  # step 1's checkpoint is written: there is something to resume
    pids = set(_processes(tag))
    _send(proc, how)
    last = _stopped(proc, how, seen, tag)
    resume = rf"run the same command to resume from {re.escape(str(out / 'checkpoints'))}/step_00000[1-7]"
    assert re.fullmatch(rf"\[roll_ma\] [^;]+; {resume} \(trainer.resume=auto\)", last), last
    assert _shm_entries(pids) == []

    again = _cli(config_dir, uuid.uuid4().hex)
    log, _ = again.communicate(timeout=600)
    assert again.returncode == 0, log[-4000:]
    assert "resumed from" in log and steps_logged(out) == list(range(1, 9)), "every step exactly once"


# the driver as a terminal runs it: its session's leader, the terminal its controlling one (a pty)
ON_A_TERMINAL = ("import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
                 "os.execv(sys.argv[1], sys.argv[1:])")


def _read_terminal(master: int, pattern: str) -> str:
    """What the run wrote on its terminal, up to a line matching ``pattern``."""
    wanted, text = re.compile(pattern), ""
    while not wanted.search(text):
        try:
            chunk = os.read(master, 65536).decode(errors="replace")
        except OSError:  # EIO: the run ended and closed its side
            chunk = ""
        if not chunk:
            pytest.fail(f"the run ended before {pattern!r}:\n{text[-4000:]}")
        text += chunk
    return text


def test_a_closed_terminal_stops_the_run_like_sigterm_leaves_nothing_and_resumes(tiny_model_dir, tmp_path):
    # once: SIGHUP killed the driver outright (exit 129, no line) and two Ray agents outlived it by 60-106 s
    config_dir, out = _config_dir(tmp_path, tiny_model_dir, steps=8), tmp_path / "out"
    tag = uuid.uuid4().hex
    master, terminal = os.openpty()
    cli = [sys.executable, str(REPO / "start_pipeline.py"), "--config_path", str(config_dir), "-cn", "toy"]
    with _signals_of_a_terminal_job():
        proc = subprocess.Popen([sys.executable, "-c", ON_A_TERMINAL, *cli], cwd=REPO,
                                start_new_session=True, env={**os.environ, TAG: tag},
                                stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    try:
        seen = _read_terminal(master, r"step 2/8 ")  # step 1's checkpoint is written
        pids = set(_processes(tag))
    finally:
        os.close(master)  # the terminal closes: the kernel sends SIGHUP to its session's leader, the driver
    assert proc.wait(timeout=120) == 129, seen[-4000:]
    # the terminal is gone with the stop line: the run's log file has it
    last = (out / "logs" / "run.log").read_text().rstrip().splitlines()[-1]
    resume = rf"run the same command to resume from {re.escape(str(out / 'checkpoints'))}/step_00000[1-7]"
    stopped = r"\[roll_ma\] stopped by SIGHUP \(a closed terminal or ssh session\)"
    assert re.fullmatch(rf"\(driver [\d:]+\) {stopped}; {resume} \(trainer.resume=auto\)", last), last
    assert _wait_until_gone(tag, deadline_s=HUP_GONE_S) == {}
    assert _shm_entries(pids) == []

    again = _cli(config_dir, uuid.uuid4().hex)
    log, _ = again.communicate(timeout=600)
    assert again.returncode == 0, log[-4000:]
    assert "resumed from" in log and steps_logged(out) == list(range(1, 9)), "every step exactly once"


def _ray_starting(tag: str) -> None:
    """Wait until the run's GCS process exists: ray.init is under way (no line is printed before it ends)."""
    while not any("gcs_server" in cmd for cmd in _processes(tag).values()):
        time.sleep(0.05)


@pytest.mark.parametrize("how", ["ctrl_c", "sigterm_group"])
def test_a_run_stopped_while_ray_starts_ends_cleanly(how, tiny_model_dir, tmp_path):
    # once: Ctrl-C here crashed the driver after its message (exit 139), and the group's SIGTERM killed the
    # GCS under a starting driver, which then waited 60 s for it and exited 1
    tag = uuid.uuid4().hex
    proc = _cli(_config_dir(tmp_path, tiny_model_dir, steps=2), tag)
    _ray_starting(tag)
    _send(proc, how)
    last = _stopped(proc, how, [], tag)
    assert last.endswith("no checkpoint was written yet, so running the same command starts afresh"), last


# the driver sends itself SIGTERM as soon as its core worker exists, inside ray.init: a scheduler's SIGTERM to
# the driver alone, at the moment Ray's C failure-signal handler would have been in place
SIGTERM_AFTER_CORE_WORKER = """
import os, signal
import ray._private.worker as ray_worker

def connect_then_sigterm(*args, connect=ray_worker.connect, **kwargs):
    result = connect(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    return result

ray_worker.connect = connect_then_sigterm
"""


def test_a_sigterm_to_the_driver_alone_as_its_ray_core_worker_starts_ends_cleanly(tiny_model_dir, tmp_path):
    # once: Ray's C handler printed "*** SIGTERM received ***" and its stack, and at times aborted (exit 134)
    tag = uuid.uuid4().hex
    proc = _cli(_config_dir(tmp_path, tiny_model_dir, steps=2), tag, patch=SIGTERM_AFTER_CORE_WORKER)
    last = _stopped(proc, "sigterm", [], tag)
    assert last.endswith("no checkpoint was written yet, so running the same command starts afresh"), last


# the driver sends itself SIGTERM as it starts importing torch: the signal lands inside that import
SIGTERM_IN_IMPORT = """
import importlib.abc, os, signal

class SignalOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGTERM)
        return None

sys.meta_path.insert(0, SignalOnImport())
"""


def test_sigterm_inside_an_import_before_the_run_ends_cleanly(tiny_model_dir, tmp_path):
    # once: a half-imported torch crashed the driver (segmentation fault, exit 139) with no message
    tag = uuid.uuid4().hex
    proc = _cli(_config_dir(tmp_path, tiny_model_dir, steps=2), tag, patch=SIGTERM_IN_IMPORT)
    last = _stopped(proc, "sigterm", [], tag)
    assert last == "[roll_ma] stopped by SIGTERM before the run started; run the same command to start it"
    assert not (tmp_path / "out").exists()


# a slow checkpoint write: it says when it began, then takes its time
SLOW_SAVE = """
import time
import roll_ma.checkpoint as ckpt

def slow_marker(path, step, sha, write=ckpt.write_marker):
    print(f"writing checkpoint {step}", flush=True)
    time.sleep(60 if step == 2 else 0)
    write(path, step, sha)

ckpt.write_marker = slow_marker
"""


def test_sigterm_during_a_checkpoint_write_keeps_the_last_one_and_resumes(tiny_model_dir, tmp_path):
    config_dir, out = _config_dir(tmp_path, tiny_model_dir, steps=3), tmp_path / "out"
    checkpoints = out / "checkpoints"
    tag, seen = uuid.uuid4().hex, []
    proc = _cli(config_dir, tag, patch=SLOW_SAVE)
    _read_until(proc, r"^writing checkpoint 2$", seen)
    _send(proc, "sigterm")
    last = _stopped(proc, "sigterm", seen, tag)
    assert last.endswith(f"resume from {checkpoints / 'step_000001'} (trainer.resume=auto)"), last
    written = f"[roll_ma] checkpoint written: {checkpoints / 'step_000001'} (step 1)"
    (unfinished,) = checkpoints.glob(".tmp_step_000002_*")  # the write the SIGTERM cut short

    again = _cli(config_dir, uuid.uuid4().hex)
    log, _ = again.communicate(timeout=600)
    assert again.returncode == 0, log[-4000:]
    assert f"resumed from {checkpoints / 'step_000001'} (step 1)" in log, log[-4000:]
    assert steps_logged(out) == [1, 2, 3], "every step exactly once"
    # each checkpoint written and the unfinished one removed: one line each, on the console and in run.log
    removed = f"[roll_ma] removed the unfinished checkpoint of step 2 (its write was cut short): {unfinished}"
    assert written in "".join(seen) and removed in log.splitlines(), log[-4000:]
    assert not unfinished.exists()
    logged = [line.split(") ", 1)[-1] for line in (out / "logs" / "run.log").read_text().splitlines()
              if line.startswith("(driver ")]
    assert logged == [  # the stop line too: after a SIGHUP the console is gone
        written, last, removed, f"[roll_ma] resumed from {checkpoints / 'step_000001'} (step 1)",
        *(f"[roll_ma] checkpoint written: {checkpoints / f'step_{n:06d}'} (step {n})" for n in (2, 3)),
    ]


CALLER = textwrap.dedent('''
    import os, sys, yaml
    import ray
    import roll_ma
    from roll_ma.errors import RollMaError

    ok, failing = yaml.safe_load(open(sys.argv[1])), yaml.safe_load(open(sys.argv[2]))
    roll_ma.train(ok)
    print("after success: ray initialised", ray.is_initialized(), flush=True)
    sys.stdin.readline()  # the test looks for processes left, then lets this caller go on
    try:
        roll_ma.train(failing)
    except RollMaError as err:
        print("raised", type(err).__name__, flush=True)
    print("after failure: ray initialised", ray.is_initialized(), flush=True)
    sys.stdin.readline()
''')


def test_train_stops_the_ray_it_started_after_success_and_failure(tiny_model_dir, tmp_path):
    import yaml

    ok = toy_config(tmp_path / "ok", tiny_model_dir, AGENTS, trainer={"max_steps": 1})
    task = tmp_path / "task.py"
    task.write_text("class Grader:\n    def reset(self, problem):\n        return problem['problem']\n\n"
                    "    def step(self, actions, ground_truth):\n        return '', 1 / 0, True\n")
    failing = {
        "model": {"path": tiny_model_dir, "max_prompt_tokens": 64},
        "agents": [{"name": "solver"}, {"name": "judge"}],
        "env": {"name": "marft", "path": f"{task}:Grader", "max_assistant_turns": 2, "groups_per_step": 2,
                "group_size": 2, "data": {"source": "synthetic", "num_eval_problems": 2}},
        "rollout": {"backend": "hf", "max_new_tokens": 4},
        "reference": {"mode": "none"},
        "trainer": {"max_steps": 1, "eval_every": 0, "output_dir": str(tmp_path / "failing")},
    }
    paths = [tmp_path / "ok.yaml", tmp_path / "failing.yaml"]
    for path, cfg in zip(paths, [ok, failing]):
        path.write_text(yaml.safe_dump(cfg))
    tag, seen = uuid.uuid4().hex, []
    caller = _launch([sys.executable, "-c", CALLER, *map(str, paths)], tag, stdin=subprocess.PIPE)
    try:
        _read_until(caller, r"^after success: ", seen)
        assert seen[-1].strip() == "after success: ray initialised False", "".join(seen)[-4000:]
        assert _wait_until_gone(tag, keep={caller.pid}) == {}
        caller.stdin.write("\n")
        caller.stdin.flush()
        _read_until(caller, r"^after failure: ", seen)
        assert "raised WorkerError\n" in seen, "".join(seen)[-4000:]
        assert seen[-1] == "after failure: ray initialised False\n", "".join(seen)[-4000:]
        assert _wait_until_gone(tag, keep={caller.pid}) == {}
    finally:
        caller.kill()
        caller.communicate()
