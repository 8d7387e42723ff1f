"""The built-in ``python`` tool: run a model's program in a resource-limited subprocess.

``PythonTool(timeout_s=5)(code="print(6 * 7)")`` -> ``ToolResult(ok=True, output="42\\n")``. Each call
gets a fresh scratch directory (its working directory, deleted afterwards) and a fresh interpreter
(``python -I -B -u``, the env worker's own Python, so numpy and sympy import when installed).

What it protects against (each limit is a setting):

- **time**: a wall-clock limit ``timeout_s``, after which the whole process group is killed with
  SIGKILL, and a CPU-time limit (RLIMIT_CPU) a second above it as a backstop;
- **memory**: RLIMIT_AS = ``memory_mb`` (address space): an allocation beyond it is a MemoryError in
  the program, never swapping of the host;
- **output and files**: stdout and stderr go to files, and RLIMIT_FSIZE caps every file the program
  writes at ``max_output_kb``; the agent is shown at most ``max_output_chars`` of the output;
  RLIMIT_NOFILE caps open files; no core dumps;
- **network**: the child moves into a new, empty network namespace where the kernel allows it (as
  root, or with unprivileged user namespaces); in any case an audit hook refuses socket creation and
  imports of ``socket`` / ``ssl`` (so ``urllib``, ``http.client``, ``requests`` fail to import);
- **files**: the audit hook refuses writes outside the scratch directory and reads outside it and
  the Python installation's prefixes (stdlib, site-packages), and hard or symbolic links;
- **processes**: the hook refuses fork / exec / spawn / ``subprocess`` and signals to other
  processes; RLIMIT_NPROC = 0 for non-root users;
- **the environment**: the child sees PATH, HOME/TMPDIR (the scratch dir), a locale and one-thread
  caps for BLAS, nothing else: no proxies, tokens or credentials of the parent; ``-I`` ignores
  PYTHON* variables and the user site.

What it does NOT protect against (for hostile code, run it in a container or VM: gVisor, nsjail,
firejail, Docker with ``--network none``):

- the audit hook is not a security boundary: native code (a C extension, ctypes objects that exist
  before the hook, a crafted marshal or pickle, interpreter memory bugs) can skip it, C libraries
  that open files themselves are not seen, and a thread may swap a path between the hook's check
  and the actual open;
- file metadata: ``os.stat`` / ``os.path.exists`` of any path raise no audit event, so a program can
  learn which files exist and their sizes;
- reads of anything under the Python prefixes (on a system Python that is all of /usr);
- as root, RLIMIT_NPROC does nothing, so only the hook stops new processes;
- where the kernel refuses the network namespace, native code can still open sockets;
- contention: the program shares the host's cores; scratch disk use is capped per file, not in
  total; a native-code child that calls setsid() escapes the group kill (RLIMIT_CPU still ends it);
- reading the program's own harness (a test runner in the same process can be inspected or faked).
"""

from __future__ import annotations

import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile

from roll_ma.workflows.tools import Tool, ToolResult

_BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_boot.py")


class PythonTool(Tool):
    """Runs a Python program in a sandboxed subprocess; the agent sees what it prints.

    Args:
        timeout_s: Wall-clock limit of one program (seconds).
        memory_mb: Address-space limit (MiB); keep it >= 256 for numpy / sympy.
        max_output_chars: At most this much of stdout (and of an error) goes back to the agent.
        max_output_kb: Size cap of every file the program writes, stdout and stderr included (KiB).
        max_open_files: Open file descriptors.
        isolate_network: Try a new network namespace (the audit hook blocks sockets either way).
        python: Interpreter to run (default: this process's).
    """

    name = "python"
    description = "Runs a Python program (standard library, numpy, sympy) and returns what it prints."

    def __init__(
        self,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_output_chars: int = 2000,
        max_output_kb: int = 1024,
        max_open_files: int = 64,
        isolate_network: bool = True,
        python: str | None = None,
    ):
        for key, value, low in (
            ("timeout_s", timeout_s, 0.1),
            ("memory_mb", memory_mb, 64),
            ("max_output_chars", max_output_chars, 1),
            ("max_output_kb", max_output_kb, 1),
            ("max_open_files", max_open_files, 16),
        ):
            if value < low:
                raise ValueError(f"PythonTool {key}={value} is too small; use at least {low}")
        self.timeout_s = float(timeout_s)
        self.memory_mb, self.max_output_chars = int(memory_mb), int(max_output_chars)
        self.max_output_kb, self.max_open_files = int(max_output_kb), int(max_open_files)
        self.isolate_network = bool(isolate_network)
        self.python = python or sys.executable

    def __call__(self, code: str) -> ToolResult:  # type: ignore[override]
        if not isinstance(code, str):
            return ToolResult.failure(f"code must be a string, got {type(code).__name__}")
        work = tempfile.mkdtemp(prefix="roll_ma_python_")
        try:
            scratch = os.path.join(work, "scratch")
            os.mkdir(scratch, 0o700)
            program = os.path.join(scratch, "main.py")
            with open(program, "w", encoding="utf-8") as f:
                f.write(code)
            out_path, err_path = os.path.join(work, "stdout"), os.path.join(work, "stderr")
            with open(out_path, "wb") as out, open(err_path, "wb") as err:
                returncode, timed_out = self._run(scratch, program, out, err)
            stdout, out_size = _read_head(out_path, self.max_output_chars)
            stderr, _ = _read_tail(err_path, self.max_output_chars)
            return self._result(returncode, timed_out, stdout, out_size, stderr)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _run(self, scratch: str, program: str, out, err) -> tuple[int, bool]:
        cmd = [self.python, "-I", "-B", "-u", _BOOT, scratch, program, "1" if self.isolate_network else "0"]
        proc = subprocess.Popen(
            cmd,
            cwd=scratch,
            env=_child_env(scratch),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            close_fds=True,
            start_new_session=True,
            preexec_fn=self._set_limits,
        )
        timed_out = False
        try:
            proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # why always: the program may have left children in its process group
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        return proc.returncode, timed_out

    def _set_limits(self) -> None:
        """Runs in the child between fork and exec (``preexec_fn``): only ``resource`` calls, on a module
        imported beforehand, since the parent has threads (a hang here would still meet the wall-clock
        kill: the new session exists before this runs)."""
        _lower(resource.RLIMIT_AS, self.memory_mb * 2**20)
        cpu = int(math.ceil(self.timeout_s)) + 1
        _lower(resource.RLIMIT_CPU, cpu, cpu + 1)
        _lower(resource.RLIMIT_FSIZE, self.max_output_kb * 1024)
        _lower(resource.RLIMIT_NOFILE, self.max_open_files)
        _lower(resource.RLIMIT_CORE, 0)
        if os.geteuid() != 0:  # why: root ignores RLIMIT_NPROC; for others 0 means no new processes
            _lower(resource.RLIMIT_NPROC, 0)

    def _result(
        self, returncode: int, timed_out: bool, stdout: str, out_size: int, stderr: str
    ) -> ToolResult:
        cap = self.max_output_kb * 1024
        if out_size > self.max_output_chars:
            stdout += f"\n... [output cut: {out_size - self.max_output_chars} more bytes]"
        if timed_out or returncode == -signal.SIGXCPU:
            return ToolResult(False, stdout, f"time limit exceeded ({self.timeout_s:g} s)", "time")
        if out_size >= cap or returncode == -signal.SIGXFSZ or "File too large" in stderr:
            return ToolResult(False, stdout, f"output limit exceeded ({self.max_output_kb} KiB)", "output")
        if "MemoryError" in stderr:
            return ToolResult(False, stdout, f"memory limit exceeded ({self.memory_mb} MiB)", "memory")
        if returncode != 0:
            reason = stderr.strip() or (
                f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
            )
            return ToolResult(False, stdout, reason)
        return ToolResult(True, stdout)


def _lower(kind: int, soft: int, hard: int | None = None) -> None:
    """Lower a resource limit (never above the current hard limit, which only root could raise)."""
    _, current_hard = resource.getrlimit(kind)
    hard = soft if hard is None else hard
    if current_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, current_hard), min(hard, current_hard)
    resource.setrlimit(kind, (soft, hard))


def _child_env(scratch: str) -> dict[str, str]:
    """The child's whole environment: no proxies, tokens or credentials of the parent."""
    one = "1"
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": scratch,
        "TMPDIR": scratch,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": one,
        "OPENBLAS_NUM_THREADS": one,
        "MKL_NUM_THREADS": one,
    }


def _read_head(path: str, max_chars: int) -> tuple[str, int]:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        data = f.read(max_chars * 4)  # why x4: UTF-8 characters take up to 4 bytes
    return data.decode("utf-8", errors="replace")[:max_chars], size


def _read_tail(path: str, max_chars: int) -> tuple[str, int]:
    """The end of a file (a traceback's last lines say what went wrong)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(max(0, size - max_chars * 4))
        data = f.read()
    return data.decode("utf-8", errors="replace")[-max_chars:], size
