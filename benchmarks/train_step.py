"""Cost of per-agent LoRA updates: one train step of N agents (each its own adapter, updated one after
another) against one agent trained on the same total number of tokens.

    python benchmarks/train_step.py                                   # CPU, tiny model
    python benchmarks/train_step.py --shape qwen2.5-0.5b --device cuda --rows-per-agent 32 \
        --prompt-len 256 --response-len 256

Builds a random-weight model of the named shape (nothing is downloaded), times the median of
``--repeats`` train steps after one warm-up step, and prints the numbers. It never asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

from common import machine  # benchmarks/common.py (the script's folder is on sys.path)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="tiny", help="model shape from roll_ma.models.tiny.SHAPES")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default=None, help="weights dtype (default: float32 on cpu, bfloat16 on cuda)")
    p.add_argument("--agents", type=int, default=3, help="agents (adapters) updated one after another")
    p.add_argument("--rows-per-agent", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--response-len", type=int, default=32)
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--zero-stage", type=int, default=0, choices=[0, 1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model-dir", default=None, help="reuse a model dir (default: build one in a temp dir)")
    return p.parse_args()


def random_batch(agent_ids: list[int], prompt_len: int, response_len: int, vocab: int, seed: int) -> Any:
    """Full-length rows (every prompt and response token real), random tokens and advantages."""
    import torch

    from roll_ma.protocol import DataProto

    gen = torch.Generator().manual_seed(seed)
    n = len(agent_ids)
    prompts = torch.randint(3, vocab, (n, prompt_len), generator=gen)
    responses = torch.randint(3, vocab, (n, response_len), generator=gen)
    mask = torch.ones(n, prompt_len + response_len, dtype=torch.long)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": mask,
        "response_mask": torch.ones(n, response_len),
        "advantages": torch.randn(n, 1, generator=gen).expand(n, response_len).clone(),
        "old_log_probs": torch.zeros(n, response_len),
    }
    return DataProto.from_dict(tensors, {"agent_id": agent_ids}, {"step": 0, "temperature": 1.0})


class UpdateTimer:
    """A strategy with ``num_agents`` adapters and a batch of ``agent_ids`` rows, ready to time steps."""

    def __init__(self, args: argparse.Namespace, model_dir: str, num_agents: int, agent_ids: list[int]):
        from roll_ma.config.schema import AgentConfig, AlgorithmConfig, LoraConfig, ModelConfig, TrainConfig
        from roll_ma.models.adapters import plan_adapters
        from roll_ma.training.multi_agent_deepspeed import MultiAgentDeepSpeedStrategy

        agents = [AgentConfig(name=f"agent{i}") for i in range(num_agents)]
        lora = LoraConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank)
        agent_specs, adapter_specs = plan_adapters(lora, agents)
        train_cfg = TrainConfig(zero_stage=args.zero_stage, micro_batch_size=args.micro_batch_size, lr=1e-5)
        model_cfg = ModelConfig(path=model_dir, dtype=args.dtype)
        self.strategy = MultiAgentDeepSpeedStrategy(
            model_cfg, agent_specs, adapter_specs, train_cfg, AlgorithmConfig()
        )
        self.strategy.initialize()
        vocab = min(self.strategy.model.config.vocab_size, 512)
        self.batch = random_batch(agent_ids, args.prompt_len, args.response_len, vocab, seed=0)
        self.batch.batch["old_log_probs"] = self.strategy.compute_log_probs(self.batch).batch["old_log_probs"]
        self.step = 0

    def __call__(self) -> float:
        """Seconds of one train step."""
        import torch

        from roll_ma.protocol.requests import UpdateRequest

        request = UpdateRequest(step=self.step)
        self.step += 1
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        self.strategy.train_step(self.batch, request)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter() - start


def main() -> None:
    args = parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch loads: the strategy uses any GPU it sees
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no GPU is visible")
    from roll_ma.models.tiny import build_tiny_model

    model_dir = args.model_dir or build_tiny_model(
        tempfile.mkdtemp(prefix="roll_ma_bench_"), shape=args.shape, dtype=args.dtype
    )
    n, rows = args.agents, args.rows_per_agent
    multi = UpdateTimer(args, model_dir, n, [i for i in range(n) for _ in range(rows)])
    single = UpdateTimer(args, model_dir, 1, [0] * (n * rows))  # same rows, same tokens, one adapter
    multi(), single()  # warm-up: allocators, kernels, optimizer state
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    # alternate the two so that a busy machine slows both alike
    times = [(multi(), single()) for _ in range(args.repeats)]
    t_multi = statistics.median(t for t, _ in times)
    t_single = statistics.median(t for _, t in times)
    ratio = statistics.median(a / b for a, b in times)
    peak = (
        f", peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB (both)"
        if torch.cuda.is_available()
        else ""
    )
    tokens = n * rows * (args.prompt_len + args.response_len)

    print(f"machine   {machine()}")
    print(f"device    {args.device}, dtype {args.dtype}, ZeRO-{args.zero_stage}, torch {torch.__version__}")
    print(f"model     {args.shape} ({model_dir}), LoRA rank {args.lora_rank} on all linear layers")
    print(
        f"batch     {n} agents x {rows} rows x ({args.prompt_len} prompt + {args.response_len} response) "
        f"= {tokens} tokens, micro-batch {args.micro_batch_size}, median of {args.repeats}"
    )
    print(f"{n} agents sequentially  {t_multi * 1e3:9.1f} ms/step  {tokens / t_multi:10.0f} tok/s")
    print(f"1 agent, same tokens    {t_single * 1e3:9.1f} ms/step  {tokens / t_single:10.0f} tok/s{peak}")
    print(f"ratio ({n} agents / 1 agent), median over rounds  {ratio:.3f}")


if __name__ == "__main__":
    main()
