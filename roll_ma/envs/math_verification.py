"""Checking a model's math answer against the reference answer, fast and time-bounded.

Order of checks in `MathVerifier.verify(pred, gold)`:

1. `empty`: no prediction -> wrong.
2. `exact`: equal after `normalize_answer` (spaces, `$`, `\\left`/`\\right`, `\\dfrac`...) -> right.
3. `numeric`: both plain numbers (`-12`, `0.50`, `1,000`) -> compared as decimals, final.
4. `expression_for_number` (with `strict_numbers`, the default): the gold answer is a plain
   number but the prediction is an expression with an operator (`+ * ^ \\times \\cdot \\div`,
   or `-` after the start) -> wrong. Why: math_verify evaluates `37+48` to 85, so a model could
   copy the question and be rewarded. Fractions (`1/2`, `\\frac{1}{2}`) still go to step 5.
5. `too_long`: a prediction or gold over `max_answer_chars` -> wrong (answers are short).
6. `math_verify`: `math_verify.parse`/`verify` (timeouts disabled: they rely on
   `signal.alarm`, which fails outside the main thread) run in a child process reused across
   calls. The parent waits at most `timeout_s`; past it the child is killed (restarted on the
   next call) and the answer falls back to the exact comparison of step 2, i.e. wrong
   (`timeout`). A child error also falls back (`error`); so does a missing math_verify
   (`unavailable`). This works in any thread and inside Ray actors, and `9^{9^{9^{9}}}` costs
   one `timeout_s`.

Model text is never evaluated as Python.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

logger = logging.getLogger(__name__)

_WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_verify_worker.py")
_SPACES = re.compile(r"\s+")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)", re.ASCII)
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?", re.ASCII)
_BOX_TOKENS = re.compile(r"\\boxed\{|\{|\}")
_OPERATORS = ("+", "*", "^", "\\times", "\\cdot", "\\div")
_LATEX_NOISE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "$")


def extract_boxed(text: object) -> str | None:
    """Content of the last `\\boxed{...}` with balanced braces (the box that closes last), or None.

    One linear pass over brace tokens, so unclosed or deeply nested input is cheap.
    """
    if not isinstance(text, str):
        return None
    stack: list[int] = []  # content start of a box, or -1 for a plain brace
    last: tuple[int, int] | None = None
    for m in _BOX_TOKENS.finditer(text):
        token = m.group()
        if token == "}":
            if stack:
                start = stack.pop()
                if start >= 0:
                    last = (start, m.start())
        else:
            stack.append(m.end() if token != "{" else -1)
    return None if last is None else text[last[0] : last[1]]


def normalize_answer(answer: str) -> str:
    """Cheap canonical text of an answer for exact comparison (not math equivalence)."""
    s = answer
    for noise in _LATEX_NOISE:
        s = s.replace(noise, "")
    s = _SPACES.sub("", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.rstrip(".")
    if s.startswith("\\text{") and s.endswith("}"):
        s = s[6:-1]
    return s


def as_plain_number(answer: str) -> Decimal | None:
    """The value of a plain decimal number (`-3`, `0.50`, `1,000`), else None."""
    s = normalize_answer(answer)
    if len(s) > 64:
        return None
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    if not _PLAIN_NUMBER.fullmatch(s):
        return None
    try:
        return Decimal(s)
    except InvalidOperation:
        return None


@dataclass
class VerifyResult:
    """Verdict of one verification.

    Attributes:
        correct: Whether the prediction matches the gold answer.
        method: Which check decided: "empty", "exact", "numeric", "expression_for_number",
            "too_long", "math_verify", "timeout", "error" or "unavailable".
    """

    correct: bool
    method: str


class MathVerifier:
    """Time-bounded answer checking, safe in threads and Ray actors (see module docstring).

    Args:
        timeout_s: Longest wait for one math_verify call before the child is killed.
        num_workers: Child processes (calls beyond that wait for a free one).
        max_answer_chars: Longer answers are judged wrong without math_verify.
        strict_numbers: A plain-number gold answer needs a number or fraction, not an expression.
        memory_limit_mb: Address-space limit of each child (0 = none).
        startup_timeout_s: Longest wait for a child to import math_verify.
    """

    def __init__(
        self,
        timeout_s: float = 2.0,
        num_workers: int = 1,
        max_answer_chars: int = 512,
        strict_numbers: bool = True,
        memory_limit_mb: int = 4096,
        startup_timeout_s: float = 60.0,
    ):
        if timeout_s <= 0 or num_workers < 1:
            raise ValueError("MathVerifier needs timeout_s > 0 and num_workers >= 1")
        self.timeout_s = float(timeout_s)
        self.max_answer_chars = int(max_answer_chars)
        self.strict_numbers = bool(strict_numbers)
        self._idle: queue.Queue[_Worker] = queue.Queue()
        for _ in range(num_workers):
            self._idle.put(_Worker(int(memory_limit_mb), float(startup_timeout_s)))
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def verify(self, pred: str | None, gold: str) -> VerifyResult:
        """Is `pred` (an extracted answer, or None) equal to `gold`? Never raises on input text."""
        result = self._verify(pred, str(gold))
        with self._lock:
            self.counts[result.method] = self.counts.get(result.method, 0) + 1
        return result

    def is_correct(self, pred: str | None, gold: str) -> bool:
        """Shortcut for `verify(pred, gold).correct`."""
        return self.verify(pred, gold).correct

    def _verify(self, pred: str | None, gold: str) -> VerifyResult:
        if not isinstance(pred, str) or not pred.strip():
            return VerifyResult(False, "empty")
        norm_pred, norm_gold = normalize_answer(pred), normalize_answer(gold)
        if norm_pred == norm_gold:
            return VerifyResult(True, "exact")
        gold_number = as_plain_number(gold)
        if gold_number is not None:
            pred_number = as_plain_number(pred)
            if pred_number is not None:
                return VerifyResult(pred_number == gold_number, "numeric")
            if self.strict_numbers and _has_operator(norm_pred):
                return VerifyResult(False, "expression_for_number")
        if len(pred) > self.max_answer_chars or len(gold) > self.max_answer_chars:
            return VerifyResult(False, "too_long")
        worker = self._idle.get()
        try:
            response = worker.request({"pred": pred, "gold": gold}, self.timeout_s)
        finally:
            self._idle.put(worker)
        if "correct" in response:
            return VerifyResult(bool(response["correct"]), "math_verify")
        # why: fallback to the exact comparison, which already said "not equal"
        return VerifyResult(False, response.get("status", "error"))

    def close(self) -> None:
        """Stop the child processes (they are restarted if the verifier is used again)."""
        workers = []
        while not self._idle.empty():
            workers.append(self._idle.get())
        for w in workers:
            w.stop()
            self._idle.put(w)


def _has_operator(norm: str) -> bool:
    return any(op in norm for op in _OPERATORS) or "-" in norm[1:]


class _Worker:
    """One math_verify child process speaking JSON lines over pipes."""

    def __init__(self, memory_limit_mb: int, startup_timeout_s: float):
        self.memory_limit_mb = memory_limit_mb
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.unavailable = False
        self._died = False
        self._buffer = b""

    def request(self, payload: dict, timeout_s: float) -> dict:
        if self.unavailable:
            return {"status": "unavailable"}
        if self.proc is None and not self._start():
            return {"status": "unavailable"}
        proc = self.proc
        assert proc is not None and proc.stdin is not None  # _start opened it with pipes
        try:
            proc.stdin.write((json.dumps(payload) + "\n").encode())
            proc.stdin.flush()
        except OSError:
            self.stop()
            return {"status": "error"}
        line = self._readline(time.monotonic() + timeout_s)
        if line is None:
            status = "error" if self._died else "timeout"
            self.stop()  # why: the only way to interrupt a runaway sympy computation
            return {"status": status}
        try:
            return json.loads(line)
        except ValueError:
            return {"status": "error"}

    def _start(self) -> bool:
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", _WORKER_SCRIPT, str(self.memory_limit_mb)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError as e:
            logger.warning("math verification worker did not start (%s); using exact comparison", e)
            self.unavailable = True
            return False
        weakref.finalize(self, _kill, self.proc)
        self._buffer, self._died = b"", False
        if self._readline(time.monotonic() + self.startup_timeout_s) is None:
            logger.warning("math_verify worker failed to start; falling back to exact comparison")
            self.stop()
            self.unavailable = True
            return False
        return True

    def _readline(self, deadline: float) -> str | None:
        assert self.proc is not None and self.proc.stdout is not None  # called while the worker runs
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                self._died = True  # e.g. killed for memory
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace")

    def stop(self) -> None:
        if self.proc is not None:
            _kill(self.proc)
            self.proc = None
        self._buffer = b""


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


_default_verifier: list[MathVerifier] = []
_default_lock = threading.Lock()


def get_default_verifier() -> MathVerifier:
    """One shared `MathVerifier` per process (each Ray actor builds its own on first use)."""
    with _default_lock:
        if not _default_verifier:
            _default_verifier.append(MathVerifier())
        return _default_verifier[0]
