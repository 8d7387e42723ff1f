"""The python tool's limits hold, and the ToolBox turns every tool failure into an observation."""

import asyncio
import os

import pytest

from roll_ma.workflows import PythonTool, ToolBox, ToolResult, list_tools, make_tool, register_tool


@pytest.fixture(scope="module")
def python():
    # why a generous time limit: on a loaded machine an interpreter may take seconds to start, and only the
    # time-limit tests below should ever meet it
    return PythonTool(timeout_s=60.0, memory_mb=512, max_output_chars=200, max_output_kb=64)


@pytest.fixture(scope="module")
def quick():
    return PythonTool(timeout_s=1.0, memory_mb=512)


def test_a_program_runs_and_its_output_comes_back(python):
    result = python(code="import math\nprint(math.comb(5, 2))")
    assert result == ToolResult(ok=True, output="10\n")
    assert result.observation == "10"


def test_numpy_and_sympy_work_inside_the_limits(python):
    result = python(
        code="import numpy, sympy\nx = sympy.symbols('x')\n"
        "print(sympy.solve(x**2 - 4, x), int(numpy.arange(4).sum()))"
    )
    assert result.ok, result.error
    assert result.output == "[-2, 2] 6\n"


def test_an_infinite_loop_is_stopped_at_the_time_limit(quick):
    result = quick(code="while True:\n    pass")
    assert not result.ok and result.limit == "time" and "time limit" in result.error


def test_a_sleeping_program_is_killed_with_its_process_group(quick):
    result = quick(code="import time\ntime.sleep(60)")
    assert not result.ok and result.limit == "time"


def test_huge_output_is_cut_and_stopped(python):
    result = python(code="while True:\n    print('x' * 1000)")
    assert not result.ok and result.limit == "output"
    assert result.output.startswith("x" * 200) and "output cut" in result.output
    assert len(result.output) < 300  # the agent never sees more than max_output_chars (+ the note)


def test_one_huge_write_is_refused(python):
    result = python(code="print('y' * 10**8)")
    assert not result.ok and result.limit == "output"


def test_memory_beyond_the_limit_is_a_memory_error(python):
    result = python(code="x = bytearray(2 * 1024**3)\nprint(len(x))")
    assert not result.ok and result.limit == "memory"


@pytest.mark.parametrize(
    "code",
    [
        "import socket",
        "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=2)",
        "import http.client",
    ],
)
def test_network_modules_cannot_be_imported(python, code):
    result = python(code=code)
    assert not result.ok
    assert "import of socket is blocked" in result.error and "no network access" in result.error


def test_the_socket_c_module_is_refused_too(python):
    result = python(code="import _socket\n_socket.socket()")
    assert not result.ok and "import of _socket is blocked" in result.error


@pytest.mark.parametrize(
    "code, what",
    [
        ("print(open('/etc/hostname').read())", "reading /etc/hostname is not allowed"),
        ("import os\nprint(os.listdir('/'))", "reading / is not allowed"),
        ("open('../outside.txt', 'w').write('x')", "is not allowed"),
        ("import subprocess\nsubprocess.run(['true'])", "subprocess.Popen is blocked"),
        ("import os\nos.system('true')", "os.system is blocked"),
        ("import os\nos.symlink('/etc/hostname', 'link')", "os.symlink is blocked"),
        ("import ctypes\nctypes.CDLL(None)", "ctypes.dlopen is blocked"),
    ],
)
def test_files_outside_the_scratch_dir_processes_and_native_code_are_refused(python, code, what):
    result = python(code=code)
    assert not result.ok and what in result.error


def test_the_scratch_dir_is_writable_and_the_environment_is_clean(python, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("SECRET_TOKEN", "s3cret")
    result = python(
        code="import os\nopen('a.txt', 'w').write('hi')\nprint(open('a.txt').read())\n"
        "print(sorted(k for k in os.environ if 'PROXY' in k or 'TOKEN' in k))"
    )
    assert result.ok and result.output == "hi\n[]\n"


def test_a_program_error_shows_the_programs_traceback(python):
    result = python(code="def f():\n    return 1 / 0\nf()")
    assert not result.ok and result.limit is None
    assert 'File "main.py", line 2, in f' in result.error and "ZeroDivisionError" in result.error
    assert "_sandbox_boot" not in result.error


def test_scratch_directories_are_removed(python, quick, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    python(code="open('x', 'w').write('1')")
    quick(code="while True: pass")
    assert os.listdir(tmp_path) == []


def test_bad_settings_are_refused_with_the_setting_named():
    with pytest.raises(ValueError, match="memory_mb=1 is too small"):
        PythonTool(memory_mb=1)


def test_toolbox_turns_hangs_and_crashes_into_observations():
    class Slow:
        timeout_s, grace_s = 0.1, 0.1

        def __call__(self):
            import threading

            threading.Event().wait(2.0)
            return ToolResult(ok=True, output="late")

    def crash(**_):
        raise OSError("disk on fire")

    box = ToolBox({"slow": Slow(), "crash": crash, "plain": lambda: 42})

    async def use():
        return await box["slow"](), await box.call("crash", a=1), await box["plain"]()

    slow, crashed, plain = asyncio.run(use())
    assert not slow.ok and slow.limit == "time" and "gave no answer" in slow.error
    assert not crashed.ok and "OSError: disk on fire" in crashed.error
    assert plain == ToolResult(ok=True, output="42")
    assert box.stats == {"tool_calls": 3, "tool_errors": 2, "tool_timeouts": 1}
    with pytest.raises(KeyError, match="no tool 'nope'"):
        box["nope"]


def test_tools_register_by_decorator_and_resolve_by_name_or_path():
    @register_tool("reverse_text_test")
    def reverse(text: str) -> str:
        """Reverses text."""
        return text[::-1]

    assert "reverse_text_test" in list_tools() and "python" in list_tools()
    tool = make_tool("reverse_text_test", timeout_s=3)
    assert tool(text="abc") == ToolResult(ok=True, output="cba") and tool.description == "Reverses text."
    assert isinstance(make_tool("roll_ma.workflows.python_tool:PythonTool", timeout_s=2), PythonTool)
    with pytest.raises(ValueError, match="already registered"):
        register_tool("python")(reverse)
    with pytest.raises(ValueError, match="did you mean 'python'"):
        make_tool("pyton")
