"""TRL 1.16 on the side-by-side job: ``GRPOTrainer`` with a PEFT LoRA and vLLM in colocate mode, as TRL's
GRPO docs show it (a model path, ``reward_funcs``, a conversational ``prompt`` dataset, ``peft_config``,
``GRPOConfig(use_vllm=True, vllm_mode="colocate")``). TRL trains one policy per run: run_all.py runs it
once per agent, each on that agent's prompts of the same episodes (job.agent_prompts).

One TRL step = one generation batch = one optimizer step: the agent's prompts of one job step, each
sampled group_size times (per_device_train_batch_size x gradient_accumulation_steps rows). The GRPO
settings are the ones that make TRL's loss roll_ma's (tests/train/test_trl_grpo_parity.py): loss_type
"dapo" for token_mean ("grpo" for seq_mean), beta = kl_coef, use_bias_correction_kl=False.

    python benchmarks/peers/run_trl.py --agents 3 --agent 0 --model /path/to/random-qwen2.5-7b
    python benchmarks/peers/run_trl.py --agents 3 --agent 0 --model /path/to/tiny --device cpu --smoke
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from job import (  # noqa: E402
    Job,
    agent_prompts,
    measure_and_emit,
    parse_runner_args,
    runner_parser,
    shrink_for_smoke,
    step_summary,
    versions,
)
from rewards import trl_reward  # noqa: E402

LOSS_TYPE = {"token_mean": "dapo", "seq_mean": "grpo"}  # roll_ma loss_agg -> TRL loss_type (same objective)


def grpo_config(job: Job, n_agents: int, device: str, use_vllm: bool, out_dir: str) -> Any:
    """The GRPOConfig of one agent's run."""
    from trl import GRPOConfig

    if job.grpo.kl_estimator != "k3":
        raise ValueError(
            f"{job.source}: TRL's KL term is k3 only; grpo.kl_estimator={job.grpo.kl_estimator!r}"
        )
    rows = job.rows_per_step(n_agents)
    micro = math.gcd(rows, job.train.micro_batch_rows)  # TRL splits a step by rows: a divisor of the step
    cuda = device == "cuda"
    return GRPOConfig(
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
        gradient_checkpointing=cuda and job.train.gradient_checkpointing,
        bf16=cuda and job.dtype == "bfloat16",
        model_init_kwargs={"dtype": job.dtype if cuda else "float32"},
        use_cpu=not cuda,
        use_vllm=use_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=job.gpu.rollout_memory_fraction,
        vllm_enable_sleep_mode=job.gpu.sleep_rollout,
        vllm_max_model_length=job.prompt.max_prompt_tokens + job.generation.max_new_tokens,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )


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
    """A TrainerCallback that keeps each optimizer step's wall time and each logged completion length."""
    from transformers import TrainerCallback

    class StepRecorder(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.lengths: list[float] = []
            self._last = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            self._last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            # generation (and the weight push to vLLM) happens inside the step's first micro-batch
            now = time.perf_counter()
            self.times.append(now - self._last)
            self._last = now

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                self.lengths.append(float(logs["completions/mean_length"]))

    return StepRecorder()


def measure(job: Job, n_agents: int, agent: int, model: str, device: str, use_vllm: bool) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    rows = [{"prompt": messages} for step in agent_prompts(job, n_agents, agent) for messages in step]
    recorder = step_recorder()
    with tempfile.TemporaryDirectory(prefix="peers_trl_") as out_dir:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=trl_reward,
            args=grpo_config(job, n_agents, device, use_vllm, out_dir),
            train_dataset=Dataset.from_list(rows),
            peft_config=peft_config(job),
            callbacks=[recorder],
        )
        trainer.train()
    steps = step_summary(recorder.times, job.warmup_steps)
    lengths = sorted(recorder.lengths[job.warmup_steps :])
    mean_len = lengths[len(lengths) // 2] if lengths else None
    cuda = torch.cuda.is_available()
    return {
        **steps,
        "rows_per_step": job.rows_per_step(n_agents),
        "response_tokens_per_step": mean_len * job.rows_per_step(n_agents) if mean_len else None,
        "framework_peak_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = runner_parser(__doc__)
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument(
        "--no-vllm", dest="vllm", action="store_false", help="generate with transformers (CPU smoke)"
    )
    p.add_argument("--smoke", action="store_true", help="the job shrunk to a CPU-sized check")
    args, job = parse_runner_args(p, argv)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    job = shrink_for_smoke(job) if args.smoke else job
    result: dict[str, Any] = {
        "framework": "trl",
        "agents": args.agents,
        "agent": args.agent,
        "rollout": "vllm colocate" if args.vllm else "transformers generate",
        "versions": versions("trl", "torch", "transformers", "peft", "accelerate", "vllm", "datasets"),
    }
    return measure_and_emit(
        result, lambda: measure(job, args.agents, args.agent, args.model, args.device, args.vllm))

if __name__ == "__main__":
    main()
