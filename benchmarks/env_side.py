"""The env workers' own time in one step of a job: its episodes played against a stand-in rollout that
answers every turn at once with random token ids of the model's vocabulary (what random weights reply), so
that what is timed is the env side alone: rendering and tokenizing prompts (and cutting over-long ones),
stepping the envs, the rows. With --profile, the functions that take that time.

    python benchmarks/env_side.py --config math_selfplay_7b --profile    # the 7B benchmark's env side, on CPU
    python benchmarks/env_side.py --config math_selfplay_tiny --steps 2

The job file is the one source (env, agents, model.max_prompt_tokens, rollout.max_new_tokens); only the model
is swapped for a tiny random one with the job model's vocabulary size (--vocab-size, default from the
model's config when it is a local folder, else 152,064: Qwen2.5's), whose tokenizer is the benchmarks' padded
one, as on the GPU. Replies are rollout.max_new_tokens long. The stand-in decodes each reply once, as the
rollout workers do (its time is reported apart).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import environment, log, median, report

QWEN_VOCAB = 152064


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="a shipped config's name or a yaml path (the job file)")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the job")
    p.add_argument("--steps", type=int, default=1, help="steps of episodes to play (the median is shown)")
    p.add_argument("--vocab-size", type=int, default=None, help="token ids the stand-in replies with")
    p.add_argument("--profile", action="store_true", help="print the functions that take the env side's time")
    p.add_argument("--out", default=None, help="save the results as JSON here")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")
    return args


class RandomReplies:
    """A stand-in rollout: every row gets ``new_tokens`` random ids, decoded once (as the rollout does)."""

    def __init__(self, tokenizer: Any, vocab_size: int, new_tokens: int, seed: int):
        self.tokenizer, self.vocab_size, self.new_tokens = tokenizer, vocab_size, new_tokens
        self.rng = random.Random(seed)
        self.seconds = 0.0

    def generate(self, data: Any, request: Any) -> Any:
        from roll_ma.inference.rollout_common import RowResult, pack_generation, request_rows, response_text

        start = time.perf_counter()
        prompts, _ = request_rows(data, [])
        rows = []
        for _ in prompts:
            ids = [self.rng.randrange(3, self.vocab_size) for _ in range(self.new_tokens)]
            rows.append(RowResult(ids, [0.0] * len(ids), response_text(self.tokenizer, ids, ()), "length", 0))
        out = pack_generation(data, prompts, rows, self.tokenizer.pad_token_id)
        self.seconds += time.perf_counter() - start
        return out


def job_vocab(model_path: str) -> int:
    import json

    from roll_ma.models.loading import resolve_model_path

    try:
        config = Path(resolve_model_path(model_path)) / "config.json"  # a local folder or builtin:tiny
    except Exception:  # a hub name that is not on this machine
        config = Path("/nonexistent")
    if config.exists():
        cfg = json.loads(config.read_text())
        return int(cfg.get("text_config", cfg)["vocab_size"])
    return QWEN_VOCAB  # a hub name (nothing is downloaded): the shipped GPU configs' Qwen2.5 vocabulary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    from roll_ma.config.compose import compose_raw
    from roll_ma.models.loading import load_tokenizer
    from roll_ma.models.tiny import build_tiny_model
    from roll_ma.pipelines.clusters import env_worker_spec
    from roll_ma.preflight.config_loader import build_config
    from roll_ma.workers.env_worker import EnvWorker
    from roll_ma.workers.episodes import EpisodePlanner

    path = Path(args.config).expanduser()
    name, folder = (
        (path.stem, str(path.resolve().parent)) if path.suffix in (".yaml", ".yml") else (args.config, None)
    )
    from roll_ma.errors import ConfigError

    try:
        raw = compose_raw(name, folder, list(args.overrides))
    except ConfigError as err:  # a misspelled job or key: its message, as start_pipeline.py prints it
        raise SystemExit(f"env_side.py: {err}") from None
    vocab = args.vocab_size or job_vocab(str(raw.get("model", {}).get("path", "")))
    model_dir = Path(tempfile.gettempdir()) / f"roll_ma_env_side_tiny_v{vocab}"
    if not (model_dir / "config.json").exists():
        build_tiny_model(model_dir, shape="tiny", seed=0, vocab_size=vocab, dtype="float32")
    raw.setdefault("model", {}).update(path=str(model_dir), dtype="float32")
    raw.setdefault("rollout", {}).update(backend="hf")  # nothing of the rollout runs: no GPU-only checks
    try:
        cfg = build_config(raw, check_env=False, check_local_gpus=False)
    except ConfigError as err:
        raise SystemExit(f"env_side.py: {err}") from None
    tokenizer = load_tokenizer(cfg.model)
    seats = [a.name for a in cfg.agents]
    worker = EnvWorker("env", spec=env_worker_spec(cfg, seats, cfg.model))  # as the run builds it
    planner = EpisodePlanner(cfg.env, cfg.seed)
    profiler = cProfile.Profile() if args.profile else None
    rows = []
    for step in range(1, args.steps + 1):
        replies = RandomReplies(tokenizer, vocab, cfg.rollout.max_new_tokens, cfg.seed + step)
        start = time.perf_counter()
        if profiler:
            profiler.enable()
        batch = worker.run_episodes(replies, planner.train_assignments(step, 1), step)
        if profiler:
            profiler.disable()
        total = time.perf_counter() - start
        rows.append(
            {
                "step": step,
                "rows": len(batch),
                "rounds": batch.meta_info["rounds"],
                "total_s": total,
                "stand_in_s": replies.seconds,
                "env_side_s": total - replies.seconds,
                "prompt_tokens": int(
                    batch.batch["attention_mask"][:, : batch.batch["prompts"].shape[1]].sum()
                ),
            }
        )
        log(f"step {step}: env side {total - replies.seconds:.2f} s of {total:.2f} s")
    notes = [
        f"job {args.config} {' '.join(args.overrides)}: replies of {cfg.rollout.max_new_tokens} random ids "
        f"of {vocab}; prompts cut to {cfg.model.max_prompt_tokens} tokens; one env worker, one process",
        "env_side_s = the env worker's run_episodes less the stand-in's generate (decoding the replies)",
    ]
    extra: dict[str, Any] = {}
    if profiler:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(20)
        extra["profile"] = text.getvalue()
        print(text.getvalue())
    summary = {"env_side_s": median([r["env_side_s"] for r in rows]), "rows": rows[-1]["rows"]}
    return report("env_side", args, environment("cpu"), list(rows[0]), rows, summary, notes, extra)


if __name__ == "__main__":
    main()
