"""verl 0.9.1 on the side-by-side job: ``python -m verl.trainer.main_ppo`` with Hydra overrides, as verl's
LoRA page (docs/advance/ppo_lora.rst: FSDP/FSDP2 + vLLM, load_format=safetensors) and its one-GPU LoRA
examples (examples/tuning/*/qwen2-*_grpo-lora_1_h100_fsdp_vllm.sh, examples/grpo_trainer/
run_qwen2_5-3b_gsm8k_grpo_lora.sh) set it up: GRPO advantages, a LoRA actor on FSDP2 (actor.strategy=
fsdp2; the page allows fsdp or fsdp2) with its weights loaded in bf16 (fsdp_config.model_dtype, as verl's
bf16 examples set it; the default fp32 keeps fp32 master weights, which a frozen base does not need),
whose reference is the same model with the adapter off, vLLM rollout, everything on ONE GPU
(n_gpus_per_node=1, rollout TP 1). verl trains one policy per run: run_all.py runs it once per agent, on
that agent's prompts (job.agent_prompts), or, for a row with ``adapters: shared``, once on every seat's
prompts (one adapter for all seats).

One verl step = train_batch_size prompts x rollout.n samples = one mini-batch = one optimizer step. The
data is a parquet file in verl's RL format (data_source, prompt = chat messages, reward_model), the reward
rewards.py's ``verl_compute_score`` (custom_reward_function). Step times are the one clock of job.py: the
arrival of verl's per-step console line (``step:N - ...``, its console logger); verl's own phase timers
(``timing_s/*``, its file logger) are reported beside as ``phases_s``.

    python benchmarks/peers/run_verl.py --agents 3 --agent 0 --model /path/to/random-qwen2.5-7b
    python benchmarks/peers/run_verl.py --agents 3 --row ROW --model M   # ROW has adapters: shared
    python benchmarks/peers/run_verl.py --agents 3 --agent 0 --model M --print-command   # no run
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from job import (  # noqa: E402
    LOSS_AGG_MODE,
    Job,
    Row,
    agent_prompts,
    exit_code,
    flash_attn_installed,
    gpu_identity,
    longest_prompt_tokens,
    measure_and_emit,
    parse_runner_args,
    phase_medians,
    plain_sleep,
    refuse_update_rows,
    rows_of_run,
    run_logged,
    runner_parser,
    step_summary_from_ends,
    versions,
)

KL_LOSS = {"k3": "low_var_kl", "k1": "kl"}  # verl's low_var_kl is k3 clamped to [-10, 10]
ATTN_KEY = "+actor_rollout_ref.model.override_config.attn_implementation"  # a padded row: sdpa
# packed rows through torch's varlen flash kernel (verl_varlen.py registers it in every verl process)
VARLEN = "roll_ma_varlen"
VARLEN_MODULE = "verl_varlen"
# verl's fused log-probs on an untied LM head (verl_fused_head.py: the head in FSDP2's root unit, verl #7427)
FUSED_KEY = "actor_rollout_ref.model.use_fused_kernels"
FUSED_HEAD_MODULE = "verl_fused_head"
EXTERNAL_MODULES_VAR = "VERL_USE_EXTERNAL_MODULES"  # verl/__init__.py:49 imports these on verl's import
REPO = HERE.parent.parent

# verl's console logger (verl/utils/logger/aggregate_logger.py, concat_dict_to_str) prints one line per
# logged step, "step:N - key:value - ...", from the TaskRunner actor (Ray prefixes "(TaskRunnerV1 pid=..)").
# Only a training step's line carries timing_s/step (no validation runs: test_freq=-1,
# val_before_train=False), so the pattern matches once per step.
STEP_LINE = re.compile(r"(?:^|[\s)])step:\d+ - .*\btiming_s/step:")

# the table's phases -> verl 0.9.1's timers (trainer/ppo/v1/trainer_base.py _step_once, trainer_sync.py):
# gen = sampling a batch (vLLM generation; the rule-based reward is computed inside it, in the reward loop
# workers), old_log_prob + ref = the two scoring forwards (SCORING, summed here), update_actor = the PPO
# update, update_weights = the LoRA adapter pushed to vLLM (the sync trainer's on_step_end)
SCORING = "timing_s/old_log_prob+ref"
PHASES = {
    "rollout": "timing_s/gen",
    "scoring": SCORING,
    "old_log_prob": "timing_s/old_log_prob",
    "ref": "timing_s/ref",
    "update": "timing_s/update_actor",
    "sync": "timing_s/update_weights",
    "verl_step": "timing_s/step",
}


def hydra_list(values: Any) -> str:
    return "[" + ",".join(str(v) for v in values) + "]"


def verl_overrides(
    job: Job,
    row: Row,
    n_agents: int,
    model: str,
    train_file: str,
    out_dir: str,
    legacy_trainer: bool = False,
    agent: int | None = 0,
    longest_prompt: int | None = None,
) -> list[str]:
    """``verl_settings`` as Hydra's ``key=value`` lines (``legacy_trainer``: the deprecated trainer, if the v1
    one (TransferQueue) cannot start)."""
    settings = verl_settings(job, row, n_agents, model, train_file, out_dir, agent, longest_prompt)
    lines = [f"{key}={value}" for key, value in settings.items()]
    if legacy_trainer:
        lines.append("trainer.use_v1=False")
    return lines


def verl_settings(
    job: Job,
    row: Row,
    n_agents: int,
    model: str,
    train_file: str,
    out_dir: str,
    agent: int | None = 0,
    longest_prompt: int | None = None,
    taken_elsewhere: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The Hydra overrides of one agent's run (agent None: the shared run, every seat's prompts) at
    ``row``'s settings, keys of verl/trainer/config/ppo_trainer.yaml; the row's native keys are added as
    they are (``data.max_prompt_length: longest`` = ``longest_prompt``, the run's longest prompt in tokens).

    attention ``padded``: transformers' sdpa attention (verl defaults to flash_attention_2) and no padding
    removal; ``packed``: use_remove_padding (verl 0.9.1 packs a micro-batch's rows into one sequence, its
    padding helpers fall back to torch without flash-attn), with flash-attn's varlen kernel, or with the
    attention the row's native ``+actor_rollout_ref.model.override_config.attn_implementation`` names
    (sdpa: transformers builds the block-diagonal causal mask from the packed position ids, quadratic in
    the packed length; roll_ma_varlen: torch's varlen flash kernel, registered by ``verl_env``).

    pi_old: with ``algorithm.rollout_correction.bypass_mode: true`` (verl's documented way to skip "the
    expensive actor forward pass for old_log_prob") vLLM's log-probs of the sampled tokens are pi_old;
    false is verl's default (decoupled mode), one more forward over every row.

    ``taken_elsewhere``: keys a runner built on this one (run_atgrpo.py) sets itself, which the row's native
    keys may not set either."""
    g, gpu, s = job.grpo, job.gpu, row.settings
    prompts = rows_of_run(job, n_agents, agent) // job.episodes.group_size
    arr = "actor_rollout_ref"
    packed = s.attention == "packed"
    out = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": g.norm_std,
        "algorithm.use_kl_in_reward": False,
        "data.train_files": train_file,
        "data.val_files": train_file,
        "data.prompt_key": "prompt",
        "data.train_batch_size": prompts,
        "data.max_response_length": job.generation.max_new_tokens,
        "data.filter_overlong_prompts": True,
        "data.truncation": "error",
        "data.shuffle": False,
        f"{arr}.model.path": model,
        f"{arr}.model.lora_rank": job.lora.rank,
        f"{arr}.model.lora_alpha": f"{job.lora.alpha:g}",
        f"{arr}.model.target_modules": hydra_list(job.lora.target_modules),
        f"{arr}.model.use_remove_padding": packed,
        f"{arr}.model.enable_gradient_checkpointing": s.gradient_checkpointing,
        f"{arr}.model.use_liger": s.liger_kernel,
        f"{arr}.actor.strategy": "fsdp2",  # ppo_lora.rst: fsdp or fsdp2; FSDPActorConfig passes it on
        f"{arr}.ref.strategy": "fsdp2",  # (LoRA: the reference is the actor with its adapter off)
        f"{arr}.actor.fsdp_config.model_dtype": job.dtype,  # default fp32; bf16 base as the rollout's
        f"{arr}.ref.fsdp_config.model_dtype": job.dtype,
        f"{arr}.actor.optim.lr": job.train.lr,
        f"{arr}.actor.ppo_mini_batch_size": prompts,  # in prompts: x rollout.n rows, one optimizer step
        f"{arr}.actor.use_dynamic_bsz": True,  # token-budget micro-batches, as roll_ma's
        f"{arr}.actor.ppo_max_token_len_per_gpu": s.update_tokens,
        f"{arr}.actor.clip_ratio_low": g.clip_low,
        f"{arr}.actor.clip_ratio_high": g.clip_high,
        f"{arr}.actor.loss_agg_mode": LOSS_AGG_MODE[g.loss_agg],
        f"{arr}.actor.use_kl_loss": g.kl_coef > 0,
        f"{arr}.actor.kl_loss_coef": g.kl_coef,
        f"{arr}.actor.kl_loss_type": KL_LOSS[g.kl_estimator],
        f"{arr}.actor.entropy_coeff": 0,
        f"{arr}.actor.fsdp_config.param_offload": False,
        f"{arr}.actor.fsdp_config.optimizer_offload": False,
        f"{arr}.rollout.name": "vllm",
        f"{arr}.rollout.dtype": job.dtype,
        f"{arr}.rollout.tensor_model_parallel_size": 1,
        f"{arr}.rollout.gpu_memory_utilization": gpu.rollout_memory_fraction,
        f"{arr}.rollout.free_cache_engine": plain_sleep(row),
        f"{arr}.rollout.n": job.episodes.group_size,
        f"{arr}.rollout.temperature": job.generation.temperature,
        f"{arr}.rollout.load_format": "safetensors",  # required with LoRA (ppo_lora.rst)
        f"{arr}.rollout.log_prob_max_token_len_per_gpu": s.scoring_tokens,
        f"{arr}.ref.log_prob_max_token_len_per_gpu": s.scoring_tokens,
        "reward.custom_reward_function.path": str(HERE / "rewards.py"),
        "reward.custom_reward_function.name": "verl_compute_score",
        "trainer.critic_warmup": 0,
        "trainer.logger": "[console,file]",
        "trainer.project_name": "roll_ma_peers",
        "trainer.experiment_name": f"verl_{row.name}_{n_agents}agents" + ("_shared" if agent is None else ""),
        "trainer.n_gpus_per_node": 1,
        "trainer.nnodes": 1,
        "trainer.total_training_steps": job.steps,
        "trainer.total_epochs": 1,
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
        "trainer.resume_mode": "disable",
        "trainer.default_local_dir": f"{out_dir}/checkpoints",
    }
    if not packed:
        out[ATTN_KEY] = "sdpa"
    taken = sorted(set(row.native) & (set(out) | set(taken_elsewhere)))
    if taken:  # one source for each setting: the job's work or the row's settings, not both
        raise ValueError(f"{job.source}: rows.{row.name}.native sets {', '.join(taken)}, which the job sets")
    for key, value in row.native.items():
        if key == "data.max_prompt_length" and value == "longest":
            if longest_prompt is None:
                raise ValueError("data.max_prompt_length: longest needs the run's prompts (longest_prompt)")
            value = longest_prompt
        out[key] = value
    return out


def verl_config_keys() -> dict[str, Any] | None:
    """The installed verl's flattened trainer config (its _generated_ppo_trainer.yaml), None where verl is
    not installed (located, not imported)."""
    import importlib.util

    import yaml

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    return yaml.safe_load(path.read_text()) if path.exists() else None


def _has_key(cfg: dict[str, Any], dotted: str) -> bool:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def check_row(job: Job, row: Row, n_agents: int | None = None, config: dict[str, Any] | None = None) -> None:
    """Refuse, before verl starts, what cannot run here, naming the row's key: a native key that is not in
    the installed verl's config (a ``+key``: its parent must be), update_rows (verl's micro-batches are
    token budgets, use_dynamic_bsz), sleep_rollout kv_cache, packed rows with flash-attn's kernel absent and
    no other attention named. ``config``: verl's flattened config (default: the installed verl's; none
    installed: the key check is skipped, the run would fail at its import anyway)."""
    where = f"{job.source}: rows.{row.name}"
    plain_sleep(row)
    refuse_update_rows(job, row,
                       "verl's micro-batches are token budgets (use_dynamic_bsz, settings.update_tokens)")
    config = config if config is not None else verl_config_keys()
    if config is not None:
        unknown = [k for k in row.native
                   if not _has_key(config, k[1:].rpartition(".")[0] if k.startswith("+") else k)]  # fmt: skip
        if unknown:
            raise ValueError(f"{where}.native: {', '.join(unknown)} not in verl {versions('verl')['verl']}'s "
                             "config (verl/trainer/config/_generated_ppo_trainer.yaml; a new key: +key)")
    named = str(row.native.get(ATTN_KEY, "flash_attention_2"))
    flash = named.startswith("flash_attention")
    if row.settings.attention == "packed" and flash and not flash_attn_installed():
        raise ValueError(
            f"{where}.settings.attention=packed: verl's default attention for packed rows is flash-attn's "
            "varlen kernel, and flash-attn is not installed (no wheel for this torch / CUDA); name another "
            f"in native {ATTN_KEY}: {VARLEN} (torch's varlen flash kernel) or sdpa, or use padded"
        )


def write_train_file(job: Job, n_agents: int, agent: int | None, path: Path) -> Path:
    """The agent's prompts of every step (agent None: every seat's), in step order, as verl's RL parquet
    rows."""
    import pandas as pd

    prompts = [m for step in agent_prompts(job, n_agents, agent) for m in step]
    rows = [
        {
            "data_source": "seat_game",
            "prompt": messages,
            "ability": "game",
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {"index": i},
        }
        for i, messages in enumerate(prompts)
    ]
    pd.DataFrame(rows).to_parquet(path)
    return path


def verl_passes(job: Job, row: Row) -> str:
    """What verl 0.9.1's sync v1 trainer runs per step with these overrides (trainer/ppo/v1/trainer_base.py
    _step_once; the config defaults named are verl's)."""
    return "; ".join(verl_pass_list(job, row))


def verl_pass_list(job: Job, row: Row) -> list[str]:
    """``verl_passes`` one pass an item, the rollout first."""
    passes = [
        "vLLM generation (async server; rollout.calculate_log_probs=True: vLLM returns the sampled tokens' "
        "log-probs) with the rule-based reward computed in the reward loop during generation",
        "old log-probs: a separate forward of the actor over the step's rows (algorithm.rollout_correction."
        "bypass_mode=False, verl's default: recomputed even on-policy with one mini-batch)"
        if not row.native.get("algorithm.rollout_correction.bypass_mode", False)
        else "old log-probs: none (rollout_correction.bypass_mode=True: pi_old = vLLM's log-probs)",
    ]
    if job.grpo.kl_coef > 0:
        passes.append("reference log-probs: a forward of the same actor with the LoRA adapter off")
    passes += [
        "rollout importance-sampling correction off (rollout_correction.rollout_is=None: its metrics only)",
        "update: one mini-batch, one optimizer step, token-budget micro-batches (forward + backward)",
        "weight sync: the LoRA adapter to vLLM (update_weights)",
    ]
    return passes


def read_metrics(path: Path, warmup: int) -> dict[str, Any]:
    """verl's own numbers from its file logger's JSONL: phase timers (median of the timed steps), the
    mean response length and verl's peak memory."""
    steps = [json.loads(line)["data"] for line in path.read_text().splitlines() if line.strip()]
    steps = [s for s in steps if "timing_s/step" in s]
    for s in steps:  # the two scoring forwards as one phase
        parts = [float(s[k]) for k in ("timing_s/old_log_prob", "timing_s/ref") if s.get(k) is not None]
        s[SCORING] = sum(parts) if parts else None
    mean_len = sorted(float(s["response_length/mean"]) for s in steps[warmup:] if "response_length/mean" in s)
    peaks = [float(s[k]) for s in steps for k in ("perf/max_memory_allocated_gb",) if k in s]
    return {
        "phases_s": phase_medians(steps, PHASES, warmup),
        "verl_steps_logged": len(steps),
        "response_length_mean": mean_len[len(mean_len) // 2] if mean_len else None,
        "framework_peak_gb": max(peaks) if peaks else None,
    }


def external_modules(row: Row) -> list[str]:
    """The modules every verl process of ``row``'s run imports beside verl (``VERL_USE_EXTERNAL_MODULES``):
    the attention ``roll_ma_varlen``'s registration where the row names it, and where the row takes verl's
    fused log-probs the wrapping that lets them read an untied LM head."""
    modules = [VARLEN_MODULE] if row.native.get(ATTN_KEY) == VARLEN else []
    return modules + ([FUSED_HEAD_MODULE] if fused_kernels(row) else [])


def fused_kernels(row: Row) -> bool:
    """Whether ``row`` takes verl's fused log-probs (a YAML boolean, or the string a command line writes)."""
    return str(row.native.get(FUSED_KEY, False)).lower() == "true"


def verl_env(modules: list[str] | tuple[str, ...] = (), with_paths: bool = False) -> dict[str, str]:
    """The verl process's environment: the caller's, with ``modules`` added to VERL_USE_EXTERNAL_MODULES after
    the caller's (every process importing verl imports them), and where there are any (or ``with_paths``)
    this folder, benchmarks/ and the repository added last to PYTHONPATH, which verl's Ray actors inherit:
    those modules import, and no module of these folders shadows a package verl imports."""
    env = {
        **os.environ,
        "HYDRA_FULL_ERROR": "1",
        "PYTHONUNBUFFERED": "1",  # each step line reaches the pipe when printed (the step clock)
        "RAY_DEDUP_LOGS": "0",  # Ray forwards the TaskRunner's lines as they come, never folded
    }
    if modules:
        known = [m for m in os.environ.get(EXTERNAL_MODULES_VAR, "").split(",") if m]
        env[EXTERNAL_MODULES_VAR] = ",".join(dict.fromkeys([*known, *modules]))  # once, caller's first
    if modules or with_paths:
        paths = [str(HERE), str(HERE.parent), str(REPO)]
        env["PYTHONPATH"] = os.pathsep.join([*filter(None, [os.environ.get("PYTHONPATH")]), *paths])
    return env


def run(
    job: Job, row: Row, n_agents: int, agent: int | None, model: str, legacy: bool, work: Path
) -> dict[str, Any]:
    train_file = write_train_file(job, n_agents, agent, work / "train.parquet")
    metrics_file = work / "verl_metrics.jsonl"
    prompts = [m for step in agent_prompts(job, n_agents, agent) for m in step]
    longest = longest_prompt_tokens(model, prompts)
    overrides = verl_overrides(job, row, n_agents, model, str(train_file), str(work), legacy, agent, longest)
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
    env = {**verl_env(external_modules(row)), "VERL_FILE_LOGGER_PATH": str(metrics_file)}
    _, out, step_ends = run_logged(cmd, env, "run_verl", STEP_LINE)
    out.update(step_summary_from_ends(step_ends, job.warmup_steps, started_at=0.0))  # ends: s since launch
    if metrics_file.exists():
        out.update(read_metrics(metrics_file, job.warmup_steps))
    out["rows_per_step"] = rows_of_run(job, n_agents, agent)
    out["prompt_tokens_max"] = longest
    if out.get("response_length_mean"):
        out["response_tokens_per_step"] = out["response_length_mean"] * out["rows_per_step"]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = runner_parser(__doc__)
    p.add_argument("--legacy-trainer", action="store_true", help="trainer.use_v1=False (no TransferQueue)")
    p.add_argument("--print-command", action="store_true", help="print the overrides and exit")
    args, job, row = parse_runner_args(p, argv, "verl", check_row)
    if args.print_command:  # data.max_prompt_length: longest is measured with the model's tokenizer
        prompts = [m for step in agent_prompts(job, args.agents, args.agent) for m in step]
        longest = longest_prompt_tokens(args.model, prompts) if Path(args.model).is_dir() else None
        overrides = verl_overrides(
            job, row, args.agents, args.model, "TRAIN.parquet", "OUT", args.legacy_trainer, args.agent,
            longest,
        )  # fmt: skip
        print("\n".join(overrides))
        return {}
    result: dict[str, Any] = {
        "framework": "verl",
        "row": row.name,
        "agents": args.agents,
        "agent": args.agent,
        "shared": args.shared,
        "trainer": "legacy (main_ppo_v0)" if args.legacy_trainer else "v1 (sync)",
        "strategy": "fsdp2",
        "settings": f"{row.name}: {row.describe()}",
        "attention": f"{row.native.get(ATTN_KEY, 'flash_attention_2')}, packed rows (use_remove_padding)"
        if row.settings.attention == "packed"
        else "sdpa, padded",
        "fused_kernels": fused_kernels(row),
        "external_modules": external_modules(row),  # imported into verl (VERL_USE_EXTERNAL_MODULES)
        "passes": verl_passes(job, row),
        "versions": versions(
            "verl", "torch", "transformers", "peft", "vllm", "ray", "tensordict", "liger-kernel"
        ),
        **gpu_identity(),
    }

    def measure() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="peers_verl_") as work:
            return run(job, row, args.agents, args.agent, args.model, args.legacy_trainer, Path(work))

    return measure_and_emit(result, measure)


if __name__ == "__main__":
    sys.exit(exit_code(main()))
