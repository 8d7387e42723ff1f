"""Helpers of the rollout tests (imported by the test modules; fixtures live in conftest.py)."""

from __future__ import annotations

from roll_ma.config.schema import AgentConfig, AgentLoraOverride, LoraConfig, RolloutConfig
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import GenerateRequest

SEED = 0
GREEDY = GenerateRequest(greedy=True)
# not every linear layer, and a different subset per adapter: vLLM then wraps only the union
# (lora_target_modules), and its tokens must still equal HF + PEFT's
LORA = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"])
# agents 0 and 2 share adapter "a0": rows of both must use the same weights and versions
AGENTS = [
    AgentConfig(name="solver", adapter="a0"),
    AgentConfig(name="critic", adapter="a1", lora=AgentLoraOverride(target_modules=["q_proj", "v_proj"])),
    AgentConfig(name="solver2", adapter="a0"),
]


def rollout_cfg(**overrides) -> RolloutConfig:
    cfg = RolloutConfig(max_new_tokens=12, micro_batch_size=4, temperature=1.0)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def make_request(
    tokenizer, texts: list[str], agent_ids: list[int], sample_seeds: list[int] | None = None
) -> DataProto:
    """Chat-templated prompts, one per (text, agent_id), plus a pass-through column; how to sample them
    is the ``GenerateRequest`` passed beside it to ``generate``."""
    prompts = [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        for t in texts
    ]
    cols = {"prompt_ids": prompts, "agent_id": agent_ids, "tag": [f"row{i}" for i in range(len(texts))]}
    if sample_seeds is not None:
        cols["sample_seed"] = sample_seeds
    return DataProto.from_dict(non_tensors=cols)


def responses_of(out: DataProto) -> list[list[int]]:
    """Each row's generated tokens (the response mask is a prefix)."""
    n = out.batch["response_mask"].sum(-1).long().tolist()
    return [out.batch["responses"][i, : n[i]].tolist() for i in range(len(out))]


TEXTS = [
    "What is 37+48?",
    "Play a card.",
    "Is 12 prime? Answer Correct or Incorrect.",
    "The quick brown fox",
    "Legal actions: (Play 0), (Discard 1)",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15",
]
