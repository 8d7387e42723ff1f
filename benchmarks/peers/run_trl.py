"""TRL 1.16 on the side-by-side job: ``GRPOTrainer`` with a PEFT LoRA and vLLM in colocate mode, as TRL's
GRPO docs show it (a model path, ``reward_funcs``, a conversational ``prompt`` dataset, ``peft_config``,
``GRPOConfig(use_vllm=True, vllm_mode="colocate")``). TRL trains one policy per run: run_all.py runs it
once per agent, each on that agent's prompts of the same episodes (job.agent_prompts), or, for a row with
``adapters: shared``, once on every seat's prompts (one adapter for all seats, the seat named in the prompt).

One TRL step = one generation batch = one optimizer step: the run's prompts of one job step, each
sampled group_size times (per_device_train_batch_size x gradient_accumulation_steps rows). The GRPO
settings are the ones that make TRL's loss roll_ma's (tests/training/test_trl_grpo_parity.py): loss_type
"dapo" for token_mean ("grpo" for seq_mean), beta = kl_coef, use_bias_correction_kl=False.

The forward passes of a step are roll_ma's: generation, reference log-probs (beta > 0: TRL runs the
policy with the adapter disabled), the training micro-batches. TRL's default
vllm_importance_sampling_correction=True adds one more: the policy's log-probs of every row before the
update, to reweight by pi / pi_vLLM; the job's rows say whether it is on (its trl_is row: on). With it off and
one generation per optimizer step (steps_per_generation = gradient_accumulation_steps, num_iterations=1)
TRL skips the old log-probs and takes the ratio against the detached current ones.

Micro-batches are sized by tokens, as the others' token budgets: TRL splits a step by rows and pads each
micro-batch to its longest prompt and longest completion, so per_device_train_batch_size is the largest
divisor of the step's rows whose rows x (longest prompt of the run with the chat template + max_new_tokens)
fit the row's settings.update_tokens (micro_batch_rows); a row that gives settings.update_rows (issue 60's
micro-batch search) sets it in rows, which must divide the run's rows. Every setting comes from the job's
row (--row); the runner checks the row before TRL starts (validate_row: one line naming the key).

Step time is the wall time between consecutive ``on_step_end`` callbacks (job.step_summary_from_ends).

    python benchmarks/peers/run_trl.py --agents 3 --agent 0 --model /path/to/random-qwen2.5-7b
    python benchmarks/peers/run_trl.py --agents 3 --agent 0 --model /path/to/tiny --device cpu --no-vllm \
        --smoke
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from job import (  # noqa: E402
    Job,
    Row,
    agent_prompts,
    exit_code,
    gpu_identity,
    longest_prompt_tokens,
    measure_and_emit,
    micro_batch_rows,
    parse_runner_args,
    phase_medians,
    plain_sleep,
    rows_of_run,
    runner_parser,
    shrink_for_smoke,
    step_summary_from_ends,
    versions,
)
from rewards import trl_reward  # noqa: E402

LOSS_TYPE = {"token_mean": "dapo", "seq_mean": "grpo"}  # roll_ma loss_agg -> TRL loss_type (same objective)
PHASES_NOTE = (
    "TRL 1.16 logs no per-phase timers: its profiling timers (vLLM.generate, sync_weights, each reward) "
    "go only to wandb / mlflow / trackio. Its log has one per step, step_time (trl_step_time_s): the time "
    "inside training_step summed over the step's micro-batches (generation and scoring included, the "
    "optimizer step not)."
)


def micro_rows(row: Row, rows: int, row_tokens: int) -> int:
    """The run's micro-batch in rows: the row's settings.update_rows, which must divide the step's ``rows``
    (TRL splits a step into equal micro-batches), else the token budget's (micro_batch_rows)."""
    want = row.settings.update_rows
    if want is None:
        return micro_batch_rows(rows, row_tokens, row.settings.update_tokens)
    if rows % want:
        fits = [d for d in range(1, rows + 1) if rows % d == 0]
        raise ValueError(f"rows.{row.name}.settings.update_rows={want} does not divide this run's {rows} "
                         f"rows a step ({', '.join(map(str, fits))} do); run it at another N")
    return want


def validate_row(job: Job, row: Row, n_agents: int) -> None:
    """The runner's check of its row before anything starts (job.parse_runner_args): what TRL 1.16's GRPO
    cannot do, native keys that are no GRPOConfig field, a micro-batch in rows that does not divide the
    run's rows at this N."""
    check_row(job, row)
    plain_sleep(row)
    if row.settings.update_rows is not None:
        micro_rows(row, rows_of_run(job, n_agents, None if row.shared else 0), 1)


def check_row(job: Job, row: Row) -> None:
    """Refuse what TRL 1.16's GRPO cannot do, naming the row's key."""
    import dataclasses

    from trl import GRPOConfig

    s, where = row.settings, f"{job.source}: rows.{row.name}"
    if job.grpo.kl_estimator != "k3":
        raise ValueError(
            f"{job.source}: TRL's KL term is k3 only; grpo.kl_estimator={job.grpo.kl_estimator!r}"
        )
    if s.attention != "padded":
        raise ValueError(f"{where}.settings.attention: TRL 1.16's GRPO pads its micro-batches; use padded")
    if s.scoring_tokens != s.update_tokens:
        raise ValueError(
            f"{where}.settings.scoring_tokens={s.scoring_tokens}: TRL scores in the update's micro-batches, "
            f"so it must equal update_tokens={s.update_tokens}"
        )
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    unknown = sorted(set(row.native) - fields)
    if unknown:
        raise ValueError(f"{where}.native: {', '.join(unknown)} are not GRPOConfig fields of TRL 1.16")


def grpo_config(job: Job, row: Row, rows: int, micro: int, device: str, use_vllm: bool, out_dir: str) -> Any:
    """The GRPOConfig of one run: ``rows`` per step in micro-batches of ``micro`` rows, at ``row``'s
    settings (its native keys are GRPOConfig fields, passed as they are)."""
    from trl import GRPOConfig

    check_row(job, row)
    cuda, s = device == "cuda", row.settings
    kwargs = dict(
        output_dir=out_dir,
        seed=job.seed,
        max_steps=job.steps,
        learning_rate=job.train.lr,
        lr_scheduler_type="constant",
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows // micro,  # steps_per_generation follows: one generation per step
        num_generations=job.episodes.group_size,
        max_completion_length=job.generation.max_new_tokens,
        temperature=job.generation.temperature,
        beta=job.grpo.kl_coef,
        epsilon=job.grpo.clip_low,
        epsilon_high=job.grpo.clip_high,
        loss_type=LOSS_TYPE[job.grpo.loss_agg],
        use_bias_correction_kl=False,
        scale_rewards="group" if job.grpo.norm_std else "none",
        shuffle_dataset=False,
        gradient_checkpointing=cuda and s.gradient_checkpointing,
        use_liger_kernel=cuda and s.liger_kernel,
        bf16=cuda and job.dtype == "bfloat16",
        model_init_kwargs={"dtype": job.dtype if cuda else "float32"},
        use_cpu=not cuda,
        use_vllm=use_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=job.gpu.rollout_memory_fraction,
        vllm_enable_sleep_mode=plain_sleep(row),
        vllm_max_model_length=job.prompt.max_prompt_tokens + job.generation.max_new_tokens,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    taken = sorted(set(row.native) & set(kwargs))
    if taken:  # one source for each setting: the job's work or the row's settings, not both
        raise ValueError(f"{job.source}: rows.{row.name}.native sets {', '.join(taken)}, which the job sets")
    return GRPOConfig(**kwargs, **row.native)


def trl_passes(cfg: Any) -> str:
    """The passes TRL 1.16 runs per step under ``cfg`` (GRPOTrainer._generate_and_score_completions)."""
    is_correction = cfg.use_vllm and cfg.vllm_importance_sampling_correction
    misaligned = cfg.gradient_accumulation_steps % (cfg.steps_per_generation * cfg.num_iterations) != 0
    passes = ["vLLM generation" if cfg.use_vllm else "transformers generation"]
    if is_correction:
        passes.append("old log-probs (for the vLLM importance-sampling correction)")
    elif misaligned:
        passes.append("old log-probs (generation and optimizer steps misaligned)")
    else:
        passes.append("no old log-probs (one generation per optimizer step: ratio to the detached current)")
    if cfg.beta != 0.0:
        passes.append("reference log-probs (adapter disabled)")
    passes.append(f"vLLM importance-sampling correction {'on' if is_correction else 'off'}")
    passes.append(f"{cfg.gradient_accumulation_steps} training micro-batches (forward + backward)")
    return "; ".join(passes)


def peft_config(job: Job) -> Any:
    from peft import LoraConfig

    lora = job.lora
    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )


def step_recorder() -> Any:
    """A TrainerCallback that keeps each optimizer step's end (time.monotonic()) and each step's log."""
    from transformers import TrainerCallback

    class StepRecorder(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.logs: list[dict[str, float]] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.monotonic())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:  # a step's log (not the run's summary)
                self.logs.append(dict(logs))

    return StepRecorder()


def measure(
    job: Job, row: Row, n_agents: int, agent: int | None, model: str, device: str, use_vllm: bool
) -> dict[str, Any]:
    started = time.monotonic()  # start-up counts from here, TRL's imports included (first_step_end_s)
    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    prompts = [messages for step in agent_prompts(job, n_agents, agent) for messages in step]
    rows = rows_of_run(job, n_agents, agent)
    prompt_tokens = longest_prompt_tokens(model, prompts)
    row_tokens = prompt_tokens + job.generation.max_new_tokens  # a padded row: longest prompt + completion
    micro = micro_rows(row, rows, row_tokens)
    recorder = step_recorder()
    with tempfile.TemporaryDirectory(prefix="peers_trl_") as out_dir:
        args = grpo_config(job, row, rows, micro, device, use_vllm, out_dir)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=trl_reward,
            args=args,
            train_dataset=Dataset.from_list([{"prompt": messages} for messages in prompts]),
            peft_config=peft_config(job),
            callbacks=[recorder],
        )
        trainer.train()
    timed = recorder.logs[job.warmup_steps :]
    lengths = [float(s["completions/mean_length"]) for s in timed]
    mean_len = statistics.median(lengths) if lengths else None
    trl_timers = phase_medians(recorder.logs, {"step_time": "step_time"}, job.warmup_steps)
    cuda = torch.cuda.is_available()
    return {
        **step_summary_from_ends(recorder.ends, job.warmup_steps, started_at=started),
        "phases_s": None,
        "phases_note": PHASES_NOTE,
        "trl_step_time_s": trl_timers["step_time"],
        "passes": trl_passes(args),
        "rows_per_step": rows,
        "micro_batch_rows": micro,
        "prompt_tokens_max": prompt_tokens,
        "response_tokens_per_step": mean_len * rows if mean_len else None,
        # torch's own books: they keep a sleeping colocated engine's memory as allocated (vLLM unmaps it
        # under torch's pool), so this can exceed the GPU's peak; the tables compare gpu_peak_gb (nvidia-smi)
        "framework_peak_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = runner_parser(__doc__)
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument(
        "--no-vllm", dest="vllm", action="store_false", help="generate with transformers (CPU smoke)"
    )
    p.add_argument("--smoke", action="store_true", help="the job shrunk to a CPU-sized check")
    args, job, row = parse_runner_args(p, argv, "trl", validate_row)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    job = shrink_for_smoke(job, args.agents) if args.smoke else job
    cuda = args.device == "cuda"
    result: dict[str, Any] = {
        "framework": "trl",
        "row": row.name,
        "agents": args.agents,
        "agent": args.agent,
        "shared": args.shared,
        "rollout": "vllm colocate" if args.vllm else "transformers generate",
        "settings": f"{row.name}: {row.describe()}" if cuda else "CPU smoke: no liger, no checkpointing",
        "versions": versions(
            "trl", "torch", "transformers", "peft", "accelerate", "vllm", "datasets", "liger-kernel"
        ),
        **gpu_identity(),
    }
    return measure_and_emit(
        result, lambda: measure(job, row, args.agents, args.agent, args.model, args.device, args.vllm)
    )


if __name__ == "__main__":
    sys.exit(exit_code(main()))
