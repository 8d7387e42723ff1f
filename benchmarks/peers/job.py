"""The side-by-side job (job.yaml), loaded and checked once, and what every runner shares.

Runners run in their framework's own Python environment (a peer's pins may differ from roll_ma's), so
this module imports only the standard library, PyYAML and, for the prompts, roll_ma's SeatGame (plain
Python). Each runner prints one result line, ``JSON {...}`` (``emit``), that run_all.py collects.

    python benchmarks/peers/job.py                 # print the job and each agent's rows per step
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_JOB = HERE / "job.yaml"
RESULT_PREFIX = "JSON "


@dataclass(frozen=True)
class Episodes:
    rows_per_step: int
    group_size: int
    turns: dict[int, int]  # N -> turns of one episode
    relay: bool
    relay_reply_chars: int


@dataclass(frozen=True)
class Prompt:
    filler_words: int
    max_prompt_tokens: int


@dataclass(frozen=True)
class Generation:
    max_new_tokens: int
    temperature: float


@dataclass(frozen=True)
class Lora:
    rank: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]


@dataclass(frozen=True)
class Train:
    lr: float


@dataclass(frozen=True)
class Grpo:
    clip_low: float
    clip_high: float
    kl_coef: float
    kl_estimator: str
    loss_agg: str
    norm_std: bool


@dataclass(frozen=True)
class Gpu:
    rollout_memory_fraction: float


ATTENTION = ("packed", "padded")
ADAPTERS = ("per_agent", "shared")  # a row's adapter layout: one per agent, or one for every seat
KV_CACHE_ONLY = "kv_cache"  # sleep_rollout: the engine frees its KV cache only, its weights stay (roll_ma)


@dataclass(frozen=True)
class Settings:
    """A row's framework settings in the table's words (job.yaml documents each); every runner maps them
    to its framework's own options."""

    gradient_checkpointing: bool
    update_tokens: int
    scoring_tokens: int
    sleep_rollout: bool | str  # true, false or kv_cache
    liger_kernel: bool
    attention: str
    update_rows: int | None = None  # optional: the update's micro-batch in rows (TRL), else by update_tokens

    def describe(self) -> str:
        """The settings as the table writes them beside a row."""
        sleep = {True: "on", False: "off", KV_CACHE_ONLY: "KV cache only"}[self.sleep_rollout]
        update = (
            f"{self.update_rows} rows/micro-batch"
            if self.update_rows
            else f"{self.update_tokens} tokens/micro-batch"
        )
        return (
            f"checkpointing {'on' if self.gradient_checkpointing else 'off'}, update {update}, "
            f"scoring {self.scoring_tokens}, "
            f"sleep {sleep}, "
            f"liger {'on' if self.liger_kernel else 'off'}, {self.attention} rows"
        )


@dataclass(frozen=True)
class Row:
    """One row of the table: a framework at named settings (job.yaml ``rows``)."""

    framework: str
    about: str
    settings: Settings
    native: dict[str, Any]
    adapters: str = "per_agent"  # optional: per_agent (one adapter per agent) or shared (one for every seat)
    name: str = ""  # its key under rows

    @property
    def shared(self) -> bool:
        """One adapter serves every seat (the prompt names the seat): one run trains it on all their rows."""
        return self.adapters == "shared"

    def describe(self) -> str:
        native = ", ".join(f"{k}={v}" for k, v in self.native.items() if k != "rollout.engine_kwargs")
        layout = "one adapter shared by every seat; " if self.shared else ""
        return layout + self.settings.describe() + (f"; {native}" if native else "")


@dataclass(frozen=True)
class Job:
    """The work of one side-by-side run; job.yaml documents every field."""

    model: str
    dtype: str
    seed: int
    agents: tuple[int, ...]
    steps: int
    warmup_steps: int
    repeats: int
    episodes: Episodes
    prompt: Prompt
    generation: Generation
    lora: Lora
    train: Train
    grpo: Grpo
    gpu: Gpu
    rows: dict[str, Row]
    source: str = field(default="", compare=False)  # the file it came from (error messages)

    # ------------------------------------------------------------------ derived sizes
    def turns(self, n_agents: int) -> int:
        """Turns of one episode with N agents."""
        return self.episodes.turns[n_agents]

    def groups_per_step(self, n_agents: int) -> int:
        """Games (GRPO groups, distinct seeds) per step with N agents."""
        return self.episodes.rows_per_step // (self.episodes.group_size * self.turns(n_agents))

    def prompts_per_step(self, n_agents: int) -> int:
        """Distinct prompts one agent answers per step (each sampled group_size times)."""
        return self.groups_per_step(n_agents) * self.turns(n_agents) // n_agents

    def rows_per_step(self, n_agents: int) -> int:
        """Trained rows (turns) of one agent per step."""
        return self.prompts_per_step(n_agents) * self.episodes.group_size

    def timed_steps(self) -> int:
        return self.steps - self.warmup_steps


_SECTIONS = {
    "episodes": Episodes,
    "prompt": Prompt,
    "generation": Generation,
    "lora": Lora,
    "train": Train,
    "grpo": Grpo,
    "gpu": Gpu,
    "settings": Settings,
}
FRAMEWORK_NAMES = ("roll_ma", "trl", "verl", "openrlhf", "atgrpo")
# Frameworks whose one run plays every seat of a game (run_all plans one run a row, whatever its adapters),
# so a turn's prompt can carry the earlier turns' replies (a relay job): roll_ma, and AT-GRPO on verl
# (atgrpo_loop.py). The others train one agent a run on prompts handed to them in advance.
WHOLE_GAME_FRAMEWORKS = ("roll_ma", "atgrpo")


_NOT_IN_FILE = ("source", "name")  # set by the loader, never written in a job file


def _optional(f: dataclasses.Field) -> bool:
    """A field a job file may leave out: one with a default (documented in job.yaml as optional)."""
    return f.default is not dataclasses.MISSING


def _build(cls: type, raw: Any, where: str, source: str) -> Any:
    """``cls`` from the mapping ``raw``: every field present (but the optional ones), no unknown key, values
    of the field's type."""
    if not isinstance(raw, dict):
        raise ValueError(f"{source}: {where or 'the file'} must be a mapping, got {type(raw).__name__}")
    fields = [f for f in dataclasses.fields(cls) if f.name not in _NOT_IN_FILE]
    names = [f.name for f in fields]
    unknown = sorted(set(raw) - set(names))
    missing = [f.name for f in fields if f.name not in raw and not _optional(f)]
    if unknown or missing:
        parts = [f"unknown key(s) {', '.join(where + k for k in unknown)}"] if unknown else []
        parts += [f"missing key(s) {', '.join(where + k for k in missing)}"] if missing else []
        raise ValueError(f"{source}: {'; '.join(parts)} (job.yaml documents every key)")
    values: dict[str, Any] = {}
    for f in fields:
        if f.name in raw:
            values[f.name] = _value(f.name, str(f.type), raw[f.name], where, source)
    return cls(**values)


def _value(name: str, kind: str, value: Any, where: str, source: str) -> Any:
    """One field's value, checked against its declared type (the dataclasses' type strings)."""
    if name in _SECTIONS:
        return _build(_SECTIONS[name], value, f"{where}{name}.", source)
    if name == "rows":
        if not isinstance(value, dict) or not value:
            raise ValueError(f"{source}: {where}rows must map row names to rows")
        return {key: _row(key, raw, f"{where}rows.{key}.", source) for key, raw in value.items()}
    if kind == "dict[int, int]":
        ok = isinstance(value, dict) and all(
            isinstance(k, int) and isinstance(v, int) and not isinstance(v, bool) for k, v in value.items()
        )
        if not ok:
            raise ValueError(f"{source}: {where}{name} must map each N to an int, got {value!r}")
        return dict(value)
    if kind == "dict[str, Any]":
        if not isinstance(value, dict):
            raise ValueError(f"{source}: {where}{name} must be a mapping, got {value!r}")
        return dict(value)
    if kind == "int | None":  # update_rows: null or a whole number >= 1
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{source}: {where}{name} must be null or an int >= 1, got {value!r}")
        return value
    if kind == "bool | str":  # sleep_rollout
        if value not in (True, False, KV_CACHE_ONLY):
            raise ValueError(f"{source}: {where}{name} must be true, false or {KV_CACHE_ONLY}, got {value!r}")
        return value
    if kind == "float" and isinstance(value, str):  # PyYAML reads 2e-5 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
    }.get(kind, isinstance(value, list) and all(isinstance(v, (int, str)) for v in value))
    if not ok:
        raise ValueError(f"{source}: {where}{name} must be {kind}, got {value!r}")
    return tuple(value) if isinstance(value, list) else float(value) if kind == "float" else value


def _row(name: str, raw: Any, where: str, source: str) -> Row:
    row = _build(Row, raw, where, source)
    row = dataclasses.replace(row, name=name)
    if row.framework not in FRAMEWORK_NAMES:
        raise ValueError(
            f"{source}: {where}framework={row.framework!r}: use one of {', '.join(FRAMEWORK_NAMES)}"
        )
    if row.settings.attention not in ATTENTION:
        raise ValueError(
            f"{source}: {where}settings.attention={row.settings.attention!r}: use {' or '.join(ATTENTION)}"
        )
    if row.adapters not in ADAPTERS:
        raise ValueError(f"{source}: {where}adapters={row.adapters!r}: use {' or '.join(ADAPTERS)}")
    return row


def check(job: Job) -> Job:
    """The job's cross-field rules, each failure naming the key and the fix."""
    src, e = job.source, job.episodes
    problems = []
    if not job.agents or min(job.agents) < 1:
        problems.append("agents must list agent counts >= 1")
    no_turns = [n for n in job.agents if n not in e.turns]
    if no_turns:
        problems.append(f"episodes.turns gives no turns for agents {no_turns}: add N: turns for each")
    bad = [n for n in job.agents if n in e.turns and e.turns[n] % n]
    if bad:
        problems.append(
            f"episodes.turns at N = {bad} is not a multiple of N: every agent must act the same number of "
            "turns per episode (peers train one agent per run on a fixed share of each step)"
        )
    uneven = [n for n in job.agents if n in e.turns and e.rows_per_step % (e.group_size * e.turns[n])]
    if uneven:
        problems.append(
            f"episodes.rows_per_step={e.rows_per_step} is not a whole number of games (group_size x turns) "
            f"at N = {uneven}"
        )
    if job.warmup_steps < 1 or job.steps <= job.warmup_steps:
        problems.append(
            f"steps={job.steps} must exceed warmup_steps={job.warmup_steps} >= 1 (median over the rest; "
            "step 1 is never timed: a step's time is the wall time since the previous step's end)"
        )
    if job.repeats < 1:
        problems.append("repeats must be >= 1")
    if e.group_size < 2:
        problems.append("episodes.group_size must be >= 2 (GRPO compares samples of one prompt)")
    if job.grpo.loss_agg not in ("token_mean", "seq_mean"):
        problems.append(f"grpo.loss_agg={job.grpo.loss_agg!r}: use token_mean or seq_mean")
    if job.grpo.kl_estimator not in ("k1", "k3"):
        problems.append(f"grpo.kl_estimator={job.grpo.kl_estimator!r}: use k1 or k3")
    if not 0 < job.gpu.rollout_memory_fraction < 1:
        problems.append("gpu.rollout_memory_fraction must be in (0, 1)")
    if problems:
        raise ValueError(f"{src}: " + "; ".join(problems))
    return job


def shrink_for_smoke(job: Job, n_agents: int) -> Job:
    """The job of a run with N agents at a size a 2-core CPU runs in a minute (the smoke tests): same
    shape, tiny counts (one game per step: rows_per_step is whole games at this N only)."""
    r = dataclasses.replace
    e = job.episodes
    return r(
        job,
        steps=2,
        warmup_steps=1,
        episodes=r(e, group_size=2, rows_per_step=2 * job.turns(n_agents)),
        prompt=r(job.prompt, filler_words=8),
        generation=r(job.generation, max_new_tokens=8),
    )


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s keys replaced, mappings merged key by key."""
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def _read(path: Path) -> dict[str, Any]:
    """A job file's mapping; ``inherit: other.yaml`` (beside it) is read first and overridden key by key."""
    import yaml

    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        beside = ", ".join(sorted(p.name for p in Path(__file__).parent.glob("*.yaml")))
        problem = (exc.strerror or str(exc)).lower()
        raise ValueError(f"job file {path}: {problem} (the jobs beside run_all.py: {beside})") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        raise ValueError(f"job file {path}: not YAML{at} ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a job file is a mapping (job.yaml documents every key)")
    parent = raw.pop("inherit", None)
    return _merged(_read(path.parent / parent), raw) if parent else raw


def load_job(path: str | Path = DEFAULT_JOB) -> Job:
    """The checked job of ``path`` (default: job.yaml beside this file)."""
    path = Path(path)
    job = _build(Job, _read(path), "", str(path))
    return check(dataclasses.replace(job, source=str(path)))


def job_row(job: Job, name: str, framework: str) -> Row:
    """Row ``name`` of the job, which must be a row of ``framework`` (a runner runs its own rows only)."""
    row = job.rows.get(name)
    if row is None:
        raise ValueError(f"{job.source}: no row {name!r} (rows: {', '.join(job.rows)})")
    if row.framework != framework:
        raise ValueError(f"{job.source}: row {name!r} is a {row.framework} row, not {framework}'s")
    return row


# ---------------------------------------------------------------------------- the prompts
def game_seed(job_seed: int, step: int, group: int) -> int:
    """The env seed roll_ma's EpisodePlanner gives group ``group`` of ``step`` (1-based) in training."""
    return zlib.crc32(f"{job_seed}/train/{step}/{group}".encode()) & 0x7FFFFFFF


def seat_game(job: Job, n_agents: int) -> Any:
    """The job's SeatGame for N agents (benchmarks/seat_game.py, the env the roll_ma runner plays)."""
    sys.path.insert(0, str(HERE.parent))
    from seat_game import SeatGame

    e = job.episodes
    return SeatGame(
        players=n_agents,
        turns=job.turns(n_agents),
        prompt_words=job.prompt.filler_words,
        relay_reply_chars=e.relay_reply_chars if e.relay else 0,
    )


def agent_prompts(job: Job, n_agents: int, agent: int | None) -> list[list[list[dict[str, str]]]]:
    """Per step (1..steps), the chat prompts agent ``agent`` of N answers: the (seed, turn) prompts of
    that step's games where its seat acts, in (group, turn) order. Each is sampled group_size times.
    ``agent=None``: every seat's prompts (one adapter shared by all seats; the prompt names the seat)."""
    if job.episodes.relay:
        raise ValueError(
            f"{job.source}: episodes.relay: a turn's prompt carries earlier replies, so no single-turn "
            "trainer "
            "can be given this job's prompts in advance"
        )
    env = seat_game(job, n_agents)
    share = job.prompts_per_step(n_agents) * (n_agents if agent is None else 1)
    steps = []
    for step in range(1, job.steps + 1):
        prompts = []
        for g in range(job.groups_per_step(n_agents)):
            turn = env.reset(game_seed(job.seed, step, g))
            while turn is not None:
                if agent is None or turn.player == agent:
                    prompts.append(turn.messages)
                turn = env.step("0").next_turn
        assert len(prompts) == share, "turns % N == 0 gives every agent its share"
        steps.append(prompts)
    return steps


def longest_prompt_tokens(model: str, prompts: list[list[dict[str, str]]]) -> int:
    """Tokens of the longest prompt with the model's chat template and the generation prompt, as the
    peers feed a conversational prompt to the policy. The template is rendered to text first:
    transformers 5's ``apply_chat_template(tokenize=True)`` returns a BatchEncoding, whose len() is its
    number of fields (2), not of tokens (verl_best once ran with max_prompt_length=2)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in prompts]
    return max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)


def rows_of_run(job: Job, n_agents: int, agent: int | None) -> int:
    """Trained rows per step of one run: one agent's share, or every seat's (agent None: shared)."""
    return job.rows_per_step(n_agents) * (n_agents if agent is None else 1)


# ---------------------------------------------------------------------------- results
# One clock for every framework: a step's time is the wall time between its end and the previous step's
# end, each end read the same way from outside the framework's own timers (a callback in TRL's process,
# the arrival of verl's / OpenRLHF's per-step log line, roll_ma's metrics line). Step 1 has no previous
# end; it is a warm-up step in every job (warmup_steps >= 1).
def step_summary_from_ends(
    step_ends: list[float], warmup: int, started_at: float | None = None
) -> dict[str, Any]:
    """Median, min and max step time of the steps after ``warmup``, from each step's end time (seconds on
    any one clock), with every step's time kept for the record (step 1's is None: no previous end).
    ``started_at`` (the same clock): when the runner began the run; then ``first_step_end_s``, its
    start-up and first step together, is kept too."""
    times = [None] + [round(b - a, 4) for a, b in zip(step_ends, step_ends[1:])]
    timed = [t for t in times[max(warmup, 1) :] if t is not None]
    first = round(step_ends[0] - started_at, 1) if started_at is not None and step_ends else None
    return {
        "first_step_end_s": first,
        "step_s": statistics.median(timed) if timed else None,
        "step_min_s": min(timed) if timed else None,
        "step_max_s": max(timed) if timed else None,
        "timed_steps": len(timed),
        "step_times_s": times,
        "steps_done": len(step_ends),
        "clock": "wall time between consecutive step ends",
    }


def phase_medians(
    steps: list[dict[str, float]], names: dict[str, str], warmup: int
) -> dict[str, float | None]:
    """The framework's own per-step phase timers, as the median over the timed steps: ``names`` maps
    the table's phase (rollout, scoring, update, sync, ...) to the framework's metric key."""
    out: dict[str, float | None] = {}
    for phase, key in names.items():
        vals = [float(s[key]) for s in steps[warmup:] if s.get(key) is not None]
        out[phase] = round(statistics.median(vals), 3) if vals else None
    return out


def with_throughput(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with tokens_per_s = response tokens per step / median step time (None if unknown)."""
    tokens, step = result.get("response_tokens_per_step"), result.get("step_s")
    result["tokens_per_s"] = round(tokens / step, 2) if tokens and step else None
    return result


def versions(*names: str) -> dict[str, str | None]:
    """Installed versions of ``names`` (distribution names), None where absent."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def flash_attn_installed() -> bool:
    """Whether the flash-attn package (with its CUDA kernels) is installed. No binary wheel exists for the
    lent GPU's torch 2.11 / CUDA 13, so without a source build it is not; verl and OpenRLHF then run
    transformers' sdpa attention."""
    import importlib.util

    return importlib.util.find_spec("flash_attn") is not None and bool(versions("flash-attn")["flash-attn"])


def is_oom(text: str) -> bool:
    """Whether a run's error text is a GPU out-of-memory (torch, CUDA or vLLM's wording)."""
    marks = (
        "CUDA out of memory",
        "OutOfMemoryError",
        "CUBLAS_STATUS_ALLOC_FAILED",
        "No available memory for",
    )
    return any(m in text for m in marks)


# roll_ma's loss_agg -> verl's and OpenRLHF's loss_agg_mode (the two share verl's names)
LOSS_AGG_MODE = {"token_mean": "token-mean", "seq_mean": "seq-mean-token-mean"}


# ---------------------------------------------------------------------------- what every runner does
def runner_parser(doc: str | None, one_agent: bool = True) -> argparse.ArgumentParser:
    """The arguments every runner takes: N agents, the agent this run trains (peers: one policy a run; none
    for a row with ``adapters: shared``, whose one adapter serves every seat), the model directory, the job
    file and its row. Nothing else: every setting is the row's."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--agents",
        type=int,
        required=True,
        help="N agents of the job" + ("" if one_agent else ", all trained in this one run"),
    )
    if one_agent:
        p.add_argument(
            "--agent", type=int, default=None, help="the agent this run trains (0..N-1; none: a shared row)"
        )
    p.add_argument("--model", required=True, help="model directory (the random 7B of run_all.py)")
    p.add_argument("--job", default=None, help="job file (default: job.yaml beside this script)")
    p.add_argument(
        "--row",
        default=None,
        help="the job's row whose settings this run uses (default: the framework's name); a row with "
        "adapters: shared trains one adapter on every seat's rows",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="check the row at this N (the runner's own check, in its own environment), print one line and "
        "exit: nothing starts and the model is not read (run_all.py does this for every run before any)",
    )
    return p


def parse_runner_args(
    p: argparse.ArgumentParser,
    argv: list[str] | None,
    framework: str,
    check: Callable[[Job, Row, int], None] | None = None,
) -> tuple[argparse.Namespace, Job, Row]:
    """The parsed arguments, the job they name and its row this run uses (one of ``framework``'s);
    ``args.shared`` is the row's adapter layout. A one-agent runner needs --agent for a per-agent row and
    none for a shared one; an --agent outside 0..N-1 is refused. ``check(job, row, N)``: the runner's own
    check of its row (its framework's option names, what it cannot do), before anything starts; each
    failure is one line naming the row's key."""
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # flashinfer is not on the GPU image
    try:
        job = load_job(args.job) if args.job else load_job()
        if args.agents not in job.episodes.turns:
            raise ValueError(f"{job.source}: episodes.turns gives no turns for N = {args.agents}")
        row = job_row(job, args.row or framework, framework)
    except ValueError as exc:
        p.error(str(exc))
    args.shared = row.shared
    if hasattr(args, "agent"):
        if row.shared and args.agent is not None:
            p.error(f"rows.{row.name} has adapters: shared (one adapter, every seat's rows): give no --agent")
        if not row.shared and args.agent is None:
            p.error(f"rows.{row.name} trains one adapter per agent: give --agent K (0..{args.agents - 1})")
        if args.agent is not None and not 0 <= args.agent < args.agents:
            p.error(f"--agent {args.agent} is not one of the {args.agents} agents (0..{args.agents - 1})")
    if check is not None:
        try:
            check(job, row, args.agents)
        except ValueError as exc:
            p.error(str(exc).splitlines()[0])
    if getattr(args, "check", False):
        print(f"ok: rows.{row.name} at N = {args.agents}", flush=True)
        raise SystemExit(0)
    return args, job, row


def measure_and_emit(result: dict[str, Any], measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``result`` with ``measure()``'s numbers, or with what failed (the exception, OOM or not), and the
    run's wall time; printed as the run's one result line either way (run_all.py records failures)."""
    result.setdefault("oom", False)
    result.setdefault("error", None)
    start = time.perf_counter()
    try:
        result.update(measure())
    except Exception as exc:  # noqa: BLE001 - the result line is still printed
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        result.update(oom=is_oom(text), error=f"{type(exc).__name__}: {exc}"[:500])
    result["run_wall_s"] = round(time.perf_counter() - start, 2)
    emit(result)
    return result


def exit_code(result: dict[str, Any]) -> int:
    """A runner's exit status: 1 when its run failed (the result line says why), so that a runner started
    alone tells its shell; run_all.py reads the result line either way."""
    return 1 if result.get("error") else 0


def run_logged(
    cmd: list[str], env: dict[str, str], tag: str, step_line: re.Pattern[str] | None = None
) -> tuple[str, dict[str, Any], list[float]]:
    """Run a peer's own launcher; (its output, {returncode, oom, error}, step ends) with the error its
    last line that says one. The output is read as it comes: each line that matches ``step_line`` (the
    launcher's per-step log line) ends a step at the time it arrives (seconds since the launch). Each line
    is echoed as it comes, so that a run killed by run_all's timeout leaves its log up to that moment."""
    print(f"[{tag}] " + " ".join(cmd), flush=True)
    launched = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    assert proc.stdout is not None
    lines, step_ends = [], []
    for line in proc.stdout:
        if step_line is not None and step_line.search(line):
            step_ends.append(time.monotonic() - launched)
        lines.append(line)
        sys.stdout.write(line)
        sys.stdout.flush()
    proc.wait()
    output = "".join(lines)
    error = None
    if proc.returncode != 0:
        bad = [ln for ln in output.splitlines() if "Error" in ln or "error" in ln]
        error = (bad[-1] if bad else f"exit code {proc.returncode}")[:500]
    return output, {"returncode": proc.returncode, "oom": is_oom(output), "error": error}, step_ends


def gpu_identity() -> dict[str, str | None]:
    """The GPU this process sees (the first of CUDA_VISIBLE_DEVICES) and the driver, from nvidia-smi;
    every run records it so that ratios are taken only between runs on the same GPU model."""
    gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    try:
        out = subprocess.run(
            ["nvidia-smi", "-i", gpu, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        name, driver = (v.strip() for v in out.split(",", 1))
        return {"gpu_name": name, "gpu_driver": driver}
    except (OSError, subprocess.SubprocessError, ValueError):
        return {"gpu_name": None, "gpu_driver": None}


def emit(result: dict[str, Any]) -> None:
    """Print the run's one result line (run_all.py reads the last line that starts with ``JSON ``)."""
    print(RESULT_PREFIX + json.dumps(with_throughput(result), sort_keys=True), flush=True)


def read_result(output: str) -> dict[str, Any] | None:
    """The last result line of a runner's output, None if it printed none."""
    for line in reversed(output.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    return None


def main() -> None:
    job = load_job(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_JOB)
    print(json.dumps(dataclasses.asdict(job), indent=1))
    for n in job.agents:
        print(
            f"N={n}: {job.prompts_per_step(n)} prompts x {job.episodes.group_size} samples = "
            f"{job.rows_per_step(n)} rows per agent per step"
        )


def micro_batch_rows(rows: int, row_tokens: int, budget: int) -> int:
    """The largest divisor of ``rows`` (a peer whose micro-batches split a step evenly: TRL, DeepSpeed's
    train_batch = micro x accumulation) whose padded size, that many rows of ``row_tokens`` tokens, fits the
    token ``budget``; 1 when no row fits."""
    return max((d for d in range(1, rows + 1) if rows % d == 0 and d * row_tokens <= budget), default=1)


def refuse_update_rows(job: Job, row: Row, why: str) -> None:
    """``settings.update_rows`` sizes TRL's micro-batches; a runner whose micro-batches are token budgets
    refuses it, saying ``why``."""
    if row.settings.update_rows is not None:
        raise ValueError(f"{job.source}: rows.{row.name}.settings.update_rows={row.settings.update_rows}: "
                         f"{why}; leave update_rows out")


def plain_sleep(row: Row) -> bool:
    """A peer's sleep setting: on or off. Freeing the KV cache alone is roll_ma's (rollout.sleep_level=
    kv_cache); a peer's row asking for it is refused rather than run as something else."""
    if row.settings.sleep_rollout == KV_CACHE_ONLY:
        raise ValueError(f"rows.{row.name}: settings.sleep_rollout={KV_CACHE_ONLY} is roll_ma's (its engine "
                         f"frees the KV cache alone); {row.framework} sleeps or not: use true or false")
    return bool(row.settings.sleep_rollout)


if __name__ == "__main__":
    main()
