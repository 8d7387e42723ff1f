"""roll_ma's GRPO loss and its adapter gradient equal TRL's on the same batch (issue 32's cross-check).

One fixed batch (the tiny model, left-padded prompts, right-padded responses of different lengths, one
advantage per row, old log-probs shifted off the current ones so that both clip sides are active,
reference log-probs of the base with the adapter off) goes through roll_ma's real micro-batch loss
(``PPOLoss.micro_loss`` on a DeepSpeed engine) and through TRL 1.16's ``GRPOTrainer.compute_loss``
on a PEFT model holding the same adapter. The settings where the two are one objective:

| roll_ma (algorithm.*)                         | TRL (GRPOConfig)                                   |
|-----------------------------------------------|----------------------------------------------------|
| loss_agg=token_mean (one mini-batch per step) | loss_type="dapo" (tokens of the generation batch)  |
|                                               | loss_type="bnpo" (same when a step is 1 micro-batch)|
| loss_agg=seq_mean                             | loss_type="grpo"                                   |
| clip_ratio_low / clip_ratio_high              | epsilon / epsilon_high (delta=None)                |
| kl_coef, kl_estimator=k3, kl_mode=loss        | beta, use_bias_correction_kl=False                 |

TRL's default use_bias_correction_kl=True multiplies the KL term by the (differentiable) ratio: the loss
value stays the same on these rows, the gradient does not (last test). TRL's dr_grpo, cispo, sapo, luspo
and vespo have no roll_ma counterpart. TRL is a test dependency only: without it these tests skip.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from train_helpers import LORA, make_batch

pytest.importorskip("datasets", reason="TRL's GRPOTrainer needs datasets (test dependency, like trl)")
trl = pytest.importorskip("trl")

from roll_ma.config.schema import AlgorithmConfig, StudyConfig  # noqa: E402
from roll_ma.training.agent_sums import AgentSums  # noqa: E402
from roll_ma.training.objective_ppo import PPOLoss  # noqa: E402
from roll_ma.training.update_loop import UpdateContext  # noqa: E402

ROWS = 6
TOL = dict(rtol=1e-4, atol=1e-6)


def fixed_batch(strategy: Any) -> Any:
    """Rows with old log-probs off-policy by up to +-0.5 nats and reference log-probs of the base."""
    rows = make_batch([0] * ROWS, seed=11, prompt_len=7, response_len=6)
    current = strategy.compute_log_probs(rows).batch["old_log_probs"]  # (B, R)
    gen = torch.Generator().manual_seed(5)
    mask = rows.batch["response_mask"]
    rows.batch["old_log_probs"] = (current + (torch.rand(current.shape, generator=gen) - 0.5)) * mask
    rows.batch["ref_log_probs"] = strategy.compute_log_probs(rows, adapters_enabled=False).batch[
        "ref_log_probs"
    ]
    return rows


def adapter_grads(model: Any, adapter: str) -> dict[str, torch.Tensor]:
    """{PEFT name without the adapter name: grad} of one adapter's LoRA tensors."""
    return {
        n.replace(f".{adapter}.", "."): p.grad.detach().clone()
        for n, p in model.named_parameters()
        if "lora_" in n and f".{adapter}." in n
    }


def roll_ma_loss(strategy: Any, rows: Any, algo: AlgorithmConfig) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss of the whole batch as ONE micro-batch of one mini-batch, and its adapter gradient."""
    updater = strategy.updaters["a0"]
    n = len(rows)
    ppo = PPOLoss(updater, rows, torch.zeros(n, dtype=torch.long).numpy(), [0],
                  UpdateContext(step=1, temperature=1.0, algo_cfg=algo, study_cfg=StudyConfig()))
    local_denoms = ppo.counts.sum(0)  # (tokens, loss units, choice rows) of the one mini-batch, 1 rank
    updater.activate()
    updater.engine.train()
    strategy.model.zero_grad(set_to_none=True)
    loss = ppo.micro_loss(torch.arange(n), torch.ones(n), local_denoms, AgentSums(ppo.sum_fields, 1))
    loss.backward()
    return float(loss), adapter_grads(strategy.model, "a0")


def trl_loss(
    model_dir: str, adapter_dir: str, rows: Any, tmp_path: Any, **config: Any
) -> tuple[float, dict[str, torch.Tensor]]:
    """TRL's GRPO loss of the same rows (one micro-batch, one accumulation step) and its adapter gradient."""
    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter_dir, is_trainable=True)  # adapter "default"
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=ROWS,
        num_generations=ROWS,
        max_completion_length=rows.batch["responses"].shape[1],
        temperature=1.0,
        use_cpu=True,
        bf16=False,
        report_to="none",
        **config,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["x"] * ROWS}),
        processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1  # what Trainer sets inside a step of one micro-batch
    prompt_len = rows.batch["prompts"].shape[1]
    attention = rows.batch["attention_mask"].long()
    completion_mask = rows.batch["response_mask"].long()
    inputs = {
        "prompt_ids": rows.batch["prompts"],
        "prompt_mask": attention[:, :prompt_len],
        "completion_ids": rows.batch["responses"],
        "completion_mask": completion_mask,
        "advantages": rows.batch["advantages"][:, 0],  # GRPO: one advantage per row (B,)
        "old_per_token_logps": rows.batch["old_log_probs"],
        "ref_per_token_logps": rows.batch["ref_log_probs"],
        "num_items_in_batch": completion_mask.sum(),
    }
    trainer.model.train()
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return float(loss), adapter_grads(trainer.model, "default")


CASES = {
    "token_mean=dapo": (AlgorithmConfig(), dict(loss_type="dapo", beta=0.0)),
    "token_mean=bnpo": (AlgorithmConfig(), dict(loss_type="bnpo", beta=0.0)),
    "seq_mean=grpo": (AlgorithmConfig(loss_agg="seq_mean"), dict(loss_type="grpo", beta=0.0)),
    "k3_kl_loss=beta": (
        AlgorithmConfig(kl_coef=0.05, kl_estimator="k3", kl_mode="loss"),
        dict(loss_type="dapo", beta=0.05, use_bias_correction_kl=False),
    ),
    "seq_mean_kl_asymmetric_clip": (
        AlgorithmConfig(loss_agg="seq_mean", kl_coef=0.05, clip_ratio_low=0.1, clip_ratio_high=0.28),
        dict(loss_type="grpo", beta=0.05, epsilon=0.1, epsilon_high=0.28, use_bias_correction_kl=False),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_grpo_loss_and_adapter_gradient_equal_trls(
    case, make_strategy, adapter_init_dir, tiny_model_dir, tmp_path
):
    algo, trl_config = CASES[case]
    strategy = make_strategy(["a0"], algo=algo)
    rows = fixed_batch(strategy)
    old, new = rows.batch["old_log_probs"], strategy.compute_log_probs(rows).batch["old_log_probs"]
    ratio = torch.exp(new - old)[rows.batch["response_mask"] > 0]
    assert (ratio < 1 - algo.clip_ratio_low).any() and (
        ratio > 1 + algo.clip_ratio_high
    ).any()  # both clips act

    ours, our_grads = roll_ma_loss(strategy, rows, algo)
    theirs, their_grads = trl_loss(tiny_model_dir, adapter_init_dir("a0"), rows, tmp_path, **trl_config)

    assert ours == pytest.approx(theirs, rel=1e-4, abs=1e-6)
    assert sorted(our_grads) == sorted(their_grads) and len(our_grads) == 2 * len(LORA.target_modules) * 2
    for name, grad in our_grads.items():
        assert grad.abs().sum() > 0, f"{name}: no gradient reached the adapter"
        torch.testing.assert_close(grad, their_grads[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")


def test_trls_default_bias_corrected_kl_is_another_gradient(
    make_strategy, adapter_init_dir, tiny_model_dir, tmp_path
):
    # TRL 1.16's default multiplies the k3 term by the ratio pi / pi_old: same loss value on these rows
    # (ratio 1 where old = current), a different gradient; the mapping above turns it off
    algo = AlgorithmConfig(kl_coef=0.5)
    strategy = make_strategy(["a0"], algo=algo)
    rows = fixed_batch(strategy)
    rows.batch["old_log_probs"] = strategy.compute_log_probs(rows).batch["old_log_probs"]  # on-policy
    ours, our_grads = roll_ma_loss(strategy, rows, algo)
    theirs, their_grads = trl_loss(
        tiny_model_dir, adapter_init_dir("a0"), rows, tmp_path, loss_type="dapo", beta=0.5
    )
    assert ours == pytest.approx(theirs, rel=1e-4, abs=1e-6)
    assert any(not torch.allclose(g, their_grads[n], **TOL) for n, g in our_grads.items())
