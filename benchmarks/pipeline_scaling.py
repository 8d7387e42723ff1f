"""Pipeline scaling: step time and its breakdown as the number of agents and the batch grow, by running
the real pipeline; and the memory of N agents as adapters on one base against N separate models.

    python benchmarks/pipeline_scaling.py                                     # CPU, hf, tiny model, ~2 min
    # GPU (H100), vllm rollout (eager engine), colocated with training on one GPU; ~1.5 min per run, most
    # of it actor + engine start; chunks appended to the same --out:
    python benchmarks/pipeline_scaling.py --device cuda --shape qwen2.5-0.5b --agents 1,2 --out ps.json
        # ~3.5 min incl. ~30 s of memory measurement
    python benchmarks/pipeline_scaling.py --device cuda --shape qwen2.5-0.5b --agents 4,8 --skip-memory \
        --out ps.json                                                         # ~3.5 min
    python benchmarks/pipeline_scaling.py --device cuda --shape qwen2.5-0.5b --agents 2 --batches 64 \
        --skip-memory --out ps.json                                           # ~1.5 min
    (without --agents: 1,2,4,8 in one call, ~6 min)

Every run is ``roll_ma.pipelines.run_pipeline`` on a config built here (nothing else is mocked): the
env is ``SeatGame`` below, an N-seat game where every seat is its own agent (own LoRA adapter) and
an episode is ``--turns`` turns, seat t mod N acting at turn t. The turns per episode stay the same
as N grows, so every run trains on the same rows and tokens; only how they split over agents changes.
``--agents`` sweeps N at the first of ``--batches``; the other batch sizes (episodes per step) run
at ``--batch-agents`` agents. Numbers are medians of ``timing/*`` in metrics.jsonl over the steps after
the first. ``update`` is all agents' sequential updates (``update/agent`` = update / N); ``sync`` is
pushing every adapter into the rollout engine (``sync/adapter`` = the engine's own per-adapter time).
Results of several invocations with the same ``--out`` are merged (runs keyed by agents x batch).

Memory (weights only, no optimizer state): N adapters on one base against N copies of the base,
from parameter counts, and on GPU measured as ``torch.cuda.max_memory_allocated`` while loading
the base + N PeftModel adapters vs N copies of the base (in a child process).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from roll_ma.envs.base import MultiAgentEnv, StepResult, Turn

FILLER = "the quick brown fox jumps over the lazy dog".split()


class SeatGame(MultiAgentEnv):
    """N seats, each its own agent, acting in turn for ``turns`` turns; a turn's reward is the share of
    digits in the reply (varies for any model, so every agent gets a nonzero advantage).

    Args:
        seat_agents: agent name per seat.
        players: seats N.
        turns: turns per episode (seat t mod N acts at turn t).
        prompt_words: filler words in each prompt (sets the prompt length).
    """

    def __init__(self, *, seat_agents=None, players: int = 2, turns: int = 8, prompt_words: int = 16):
        self.num_players = players
        self.seat_agents = list(seat_agents) if seat_agents else [f"agent{i}" for i in range(players)]
        self.turns = turns
        self.prompt_words = prompt_words

    def reset(self, seed: int) -> Turn:
        self.seed, self.t, self.returns = seed, 0, [0.0] * self.num_players
        return self._turn()

    def _turn(self) -> Turn:
        p = self.t % self.num_players
        words = " ".join(FILLER[(self.seed + i) % len(FILLER)] for i in range(self.prompt_words))
        msgs = [
            {"role": "system", "content": f"You are seat {p} of {self.num_players}. Say digits."},
            {"role": "user", "content": f"Game {self.seed}, turn {self.t}: {words}"},
        ]
        return Turn(player=p, agent=self.seat_agents[p], messages=msgs)

    def step(self, action_text: str) -> StepResult:
        p = self.t % self.num_players
        text = action_text or ""
        rewards = [0.0] * self.num_players
        rewards[p] = sum(c.isdigit() for c in text) / max(1, len(text))
        self.returns[p] += rewards[p]
        self.t += 1
        done = self.t >= self.turns
        info = {"format_error": False, "action": text, "fallback": False}
        return StepResult(rewards, done, info, None if done else self._turn())

    def episode_returns(self) -> list[float]:
        return list(self.returns)

    def episode_metrics(self) -> dict[str, float]:
        return {"digit_share": sum(self.returns) / self.turns}

    def builtin_action(self, policy: str, rng: random.Random) -> str:
        return str(rng.randint(0, 9))


# ---------------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from common import base_parser, int_list

    p = base_parser(__doc__)
    p.add_argument(
        "--backend", default=None, choices=["hf", "vllm"], help="rollout (default: hf cpu, vllm cuda)"
    )
    p.add_argument(
        "--agents", type=int_list, default=None, help="agent counts (default: 1,2,4 cpu; 1,2,4,8 cuda)"
    )
    p.add_argument(
        "--batches", type=int_list, default=None, help="episodes per step (default: 4,8 cpu; 32 cuda)"
    )
    p.add_argument("--batch-agents", type=int, default=2, help="agents of the batch sweep")
    p.add_argument("--turns", type=int, default=None, help="turns per episode (default: 4 cpu, 8 cuda)")
    p.add_argument("--group-size", type=int, default=4, help="episodes per GRPO group")
    p.add_argument("--steps", type=int, default=3, help="pipeline steps per run (the first is not counted)")
    p.add_argument("--new-tokens", type=int, default=None, help="max new tokens (default: 8 cpu, 32 cuda)")
    p.add_argument("--prompt-words", type=int, default=None, help="filler words per prompt (16 cpu, 64 cuda)")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--cuda-graphs", dest="eager", action="store_false", help="vLLM with CUDA graphs")
    p.add_argument("--skip-memory", action="store_true", help="skip the memory comparison")
    p.add_argument(
        "--memory-agents",
        type=int_list,
        default=None,
        help="agent counts of the memory comparison (default: 1,2,4,8 cuda; --agents cpu)",
    )
    p.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    args.backend = args.backend or ("vllm" if cuda else "hf")
    args.agents = args.agents or ([1, 2, 4, 8] if cuda else [1, 2, 4])
    args.memory_agents = args.memory_agents or ([1, 2, 4, 8] if cuda else args.agents)
    args.batches = args.batches or ([32] if cuda else [4, 8])
    args.turns = args.turns or (8 if cuda else 4)
    args.new_tokens = args.new_tokens or (32 if cuda else 8)
    args.prompt_words = args.prompt_words if args.prompt_words is not None else (64 if cuda else 16)
    bad = [b for b in args.batches if b % args.group_size]
    if bad:
        p.error(f"--batches {bad} must be multiples of --group-size {args.group_size}")
    if args.steps < 2:
        p.error("--steps must be >= 2 (the first step is warm-up)")
    return args


def planned_runs(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(agents, episodes per step) of every run: the agent sweep, then the batch sweep."""
    runs = [(n, args.batches[0]) for n in args.agents] + [(args.batch_agents, b) for b in args.batches[1:]]
    return list(dict.fromkeys(runs))


# ---------------------------------------------------------------------------- one pipeline run
def run_config(args: argparse.Namespace, agents: int, batch: int, out_dir: str) -> Any:
    """The typed, validated RunConfig of one run."""
    from roll_ma.config import ConfigError, RunConfig, to_dataclass
    from roll_ma.config.validate import validate

    raw = {
        "name": f"scaling_{agents}agents_{batch}episodes",
        "seed": args.seed,
        "model": {"path": args.model, "dtype": args.dtype, "max_prompt_tokens": 512},
        "lora": {"rank": args.lora_rank, "alpha": 2.0 * args.lora_rank},
        "agents": [{"name": f"agent{i}"} for i in range(agents)],
        "env": {
            "name": "pipeline_scaling:SeatGame",
            "kwargs": {"players": agents, "turns": args.turns, "prompt_words": args.prompt_words},
            "groups_per_step": batch // args.group_size,
            "group_size": args.group_size,
            "max_turns": args.turns,
        },
        "rollout": {
            "backend": args.backend,
            "max_new_tokens": args.new_tokens,
            "temperature": 1.0,
            "micro_batch_size": 64,
            "enforce_eager": args.eager,
        },
        "train": {"lr": 1e-4, "micro_batch_size": 32, "zero_stage": 0},
        "reference": {"mode": "none"},
        "trainer": {
            "max_steps": args.steps,
            "output_dir": out_dir,
            "resume": "never",
            "progress_bars": False,
        },
        "resources": {"num_gpus": 1 if args.device == "cuda" else 0},
    }
    cfg, problems = to_dataclass(RunConfig, raw)
    problems += validate(cfg, check_env=True)
    if problems:
        raise ConfigError(problems)
    return cfg


def summarize_run(metrics: list[dict[str, Any]], agents: int) -> dict[str, Any]:
    """Medians over the steps after the first of the timing/* metrics (and what they derive)."""
    from common import median

    steps = metrics[1:]

    def med(key: str) -> float | None:
        vals = [m[key] for m in steps if key in m]
        return median(vals) if vals else None

    per_adapter = [v for m in steps for k, v in m.items() if k.startswith("timing/sync/")]
    out = {
        "step_s": med("timing/step"),
        "rollout_s": med("timing/rollout"),
        "old_log_probs_s": med("timing/old_log_probs"),
        "update_s": med("timing/update"),
        "sync_s": med("timing/sync"),
        "sync_adapter_ms": 1e3 * median(per_adapter) if per_adapter else None,
        "sync_export_s": med("timing/sync_export"),  # train worker -> object store
        "sync_install_s": med("timing/sync_install"),  # object store -> engines, all adapters installed
        "rows": med("rollout/turns"),
        "rollout_tok_s": med("system/rollout_tokens_per_s"),
    }
    out["update_agent_s"] = out["update_s"] / agents if out["update_s"] is not None else None
    parts = ("rollout_s", "old_log_probs_s", "update_s", "sync_s")
    if out["step_s"] is not None:
        out["other_s"] = out["step_s"] - sum(out[k] or 0.0 for k in parts)
    return out


def run_one(args: argparse.Namespace, agents: int, batch: int) -> dict[str, Any]:
    from common import log

    from roll_ma.pipelines import run_pipeline
    from roll_ma.tracking import read_metrics

    with tempfile.TemporaryDirectory(prefix="roll_ma_scaling_") as out_dir:
        cfg = run_config(args, agents, batch, out_dir)
        start = time.perf_counter()
        run_pipeline(cfg)
        wall = time.perf_counter() - start
        metrics = read_metrics(Path(out_dir) / "metrics.jsonl")
    res = {"agents": agents, "episodes": batch, **summarize_run(metrics, agents), "run_wall_s": wall}
    log(f"{agents} agents, {batch} episodes/step: step {res['step_s']:.3f} s (run {wall:.0f} s)")
    return res


# ---------------------------------------------------------------------------- memory
def parameter_counts(model_path: str, rank: int, targets: list[str]) -> tuple[int, int]:
    """(base parameters, LoRA parameters of one adapter): r x (in + out) for every targeted Linear."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    base = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    lora = sum(
        rank * (m.in_features + m.out_features)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name.split(".")[-1] in targets
    )
    return base, lora


def measure_memory_child(args: argparse.Namespace) -> None:
    """GPU bytes (max_memory_allocated) of base + N adapters and of N base copies, for each N."""
    import gc

    import torch
    from common import write_json

    from roll_ma.config.schema import AgentConfig, LoraConfig, ModelConfig
    from roll_ma.models.adapters import inject_adapters, plan_adapters
    from roll_ma.models.loading import load_base_model

    model_cfg = ModelConfig(path=args.model, dtype=args.dtype)

    def peak(load) -> int:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        held = load()
        torch.cuda.synchronize()
        used = torch.cuda.max_memory_allocated() - before
        del held
        return int(used)

    out = {}
    for n in args.memory_agents:
        lora = LoraConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank)
        _, specs = plan_adapters(lora, [AgentConfig(name=f"agent{i}") for i in range(n)])
        adapters = peak(lambda s=specs: inject_adapters(load_base_model(model_cfg, "cuda"), s, args.seed))
        copies = peak(lambda k=n: [load_base_model(model_cfg, "cuda") for _ in range(k)])
        out[str(n)] = {"adapters_bytes": adapters, "copies_bytes": copies}
    write_json(args.child_out, out)


def memory_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    from common import log, run_child

    from roll_ma.config.schema import ALL_LINEAR

    base, lora = parameter_counts(args.model, args.lora_rank, ALL_LINEAR)
    width = {"float32": 4, "bfloat16": 2, "float16": 2}[args.dtype]
    measured = {}
    if args.device == "cuda":
        agents = ",".join(str(n) for n in args.memory_agents)
        argv = [
            "--device",
            "cuda",
            "--model",
            args.model,
            "--dtype",
            args.dtype,
            "--lora-rank",
            str(args.lora_rank),
        ]
        # --memory-child: without it the child would run main() again and spawn a child of its own
        measured = run_child(__file__, [*argv, "--memory-child", "--memory-agents", agents])
        log(f"measured GPU memory: {json.dumps(measured)}")
    rows = []
    for n in args.memory_agents:
        shared, separate = (base + n * lora) * width, n * base * width
        m = measured.get(str(n), {})
        rows.append(
            {
                "agents": n,
                "base_params_M": base / 1e6,
                "lora_params_M_per_agent": lora / 1e6,
                "adapters_on_one_base_GiB": shared / 2**30,
                "separate_models_GiB": separate / 2**30,
                "separate_over_shared": separate / shared,
                "measured_adapters_GiB": m["adapters_bytes"] / 2**30 if m else None,
                "measured_separate_GiB": m["copies_bytes"] / 2**30 if m else None,
            }
        )
    return rows


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    # SeatGame is imported by import path in every Ray actor: they must find this folder
    here = str(Path(__file__).resolve().parent)
    sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])])
    from common import environment, markdown_table, merge_previous, prepare_model, report, setup_device

    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    setup_device(args)
    if args.memory_child:
        measure_memory_child(args)
        return {}
    if args.child_out:
        raise SystemExit("pipeline_scaling: --child-out is only for the memory child (--memory-child)")
    model_label = args.model or f"random {args.shape}"
    args.model = prepare_model(args)
    previous = json.loads(Path(args.out).read_text()) if args.out and Path(args.out).exists() else {}
    previous = previous if previous.get("benchmark") == "pipeline_scaling" else {}

    mem = previous.get("memory", []) if args.skip_memory else memory_rows(args)
    from roll_ma.distributed.ray_env import init_ray

    init_ray(env_vars={"PYTHONPATH": os.environ["PYTHONPATH"]})
    new = [run_one(args, n, batch) for n, batch in planned_runs(args)]
    runs = merge_previous("pipeline_scaling", args.out, new, ("agents", "episodes"))
    rows = sorted(runs, key=lambda r: (r["episodes"], r["agents"]))
    for r in rows:  # relative to the fewest agents at the same batch
        ref = min((b for b in rows if b["episodes"] == r["episodes"]), key=lambda b: b["agents"])
        r["step_vs_fewest_agents"] = r["step_s"] / ref["step_s"]
    summary = {f"step_s_{r['agents']}agents_{r['episodes']}ep": round(r["step_s"], 4) for r in rows}
    mem_cols = list(mem[0]) if mem else []
    notes = [
        f"model {model_label}, {args.dtype}, rollout {args.backend}"
        f"{' (eager)' if args.backend == 'vllm' and args.eager else ''}, LoRA rank {args.lora_rank} on all "
        f"linear layers; {args.turns} turns per episode, <= {args.new_tokens} new tokens, "
        f"{args.steps} steps per run (median over steps 2..{args.steps})",
        "update/agent = update / agents; other = step - (rollout + old_log_probs + update + sync); "
        "sync = wake-up + export (train worker -> object store) + install (-> every engine); "
        "sync_adapter_ms = the engine's own install of one adapter",
        "memory (weights only):\n\n" + (markdown_table(mem_cols, mem) if mem else "skipped"),
    ]
    columns = [
        "agents",
        "episodes",
        "rows",
        "step_s",
        "rollout_s",
        "old_log_probs_s",
        "update_s",
        "update_agent_s",
        "sync_s",
        "sync_export_s",
        "sync_install_s",
        "sync_adapter_ms",
        "other_s",
        "step_vs_fewest_agents",
        "run_wall_s",
    ]
    return report(
        "pipeline_scaling",
        args,
        environment(args.device),
        columns,
        rows,
        summary,
        notes,
        extra={"memory": mem},
    )


if __name__ == "__main__":
    main()
