"""The value critic: one more adapter + value head on the shared base; shared or per agent; checkpointed."""

from __future__ import annotations

import pytest
import torch
from train_helpers import make_batch, on_policy

from roll_ma.config.schema import AlgorithmConfig, CriticConfig
from roll_ma.protocol.requests import UpdateRequest

AGENTS = ["reasoner", "actor"]


def _strategy(make_strategy, share: bool, zero_stage: int = 0):
    return make_strategy(AGENTS, algo=AlgorithmConfig(advantage="gae"), zero_stage=zero_stage,
                         critic=CriticConfig(share=share, lr=1e-2))


WARMUP = UpdateRequest(step=1, critic_only=True)  # critic.warmup_steps: only the critic trains
BOTH = UpdateRequest(step=1)


def _batch(s, agent_ids, seed=0):
    """Rows with old log-probs and the critic's values; every response token's target is 1."""
    batch = on_policy(s, make_batch(agent_ids, seed=seed))
    batch.batch["values"] = s.compute_values(batch).batch["values"]
    batch.batch["returns"] = batch.batch["response_mask"].clone()  # (B, R) target 1 on real tokens
    return batch


def _critic_state(s, name):
    """The critic's adapter tensors and head, CPU copies."""
    state = {f"lora/{k}": v for k, v in s.adapter_tensors([name])[name].items()}
    head = s.critic.model.head(name)
    state.update({"head/weight": head.weight.detach().clone(), "head/bias": head.bias.detach().clone()})
    return state


def _equal(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def _all_moved(a, b):
    """The head and every lora_B tensor moved (lora_A gets no gradient while its lora_B is still 0)."""
    keys = [k for k in a if k.startswith("head/") or "lora_B" in k]
    return all(not torch.equal(a[k], b[k]) for k in keys)


def test_values_are_per_response_token_and_not_exported(make_strategy):
    s = _strategy(make_strategy, share=True)
    batch = on_policy(s, make_batch([0, 1, 0], seed=3))
    values = s.compute_values(batch).batch["values"]  # (B, R)
    assert values.shape == batch.batch["responses"].shape
    assert torch.all(values[batch.batch["response_mask"] == 0] == 0)
    assert values[batch.batch["response_mask"] > 0].abs().sum() > 0
    assert set(s.adapter_tensors()) == set(AGENTS)  # the rollout engines never get the critic
    # value of response token t = the head on the hidden state of the token before it, from a plain
    # one-row forward of the real tokens only (no padding to drop, no batching)
    critic = s.critic
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    with torch.no_grad(), critic.weights.scoring("value_critic"):
        for row in range(len(ids)):
            n_resp = int(batch.batch["response_mask"][row].sum())
            out = critic.model.backbone(input_ids=ids[row][mask[row].bool()][None], output_hidden_states=True,
                                        use_cache=False)
            hidden = out.hidden_states[-1][0, -n_resp - 1:-1].float()  # (n_resp, H)
            expected = critic.model.head("value_critic")(hidden).squeeze(-1)
            torch.testing.assert_close(values[row, :n_resp], expected, atol=1e-5, rtol=1e-4)


def test_shared_critic_learns_from_both_agents_rows_and_agents_wait_in_warmup(make_strategy):
    s = _strategy(make_strategy, share=True)
    assert s.critic.names == ["value_critic"]
    for step, agent in enumerate([0, 1]):  # rows of the reasoner only, then of the actor only
        batch = _batch(s, [agent] * 4, seed=step)
        before, agents_before = _critic_state(s, "value_critic"), s.adapter_tensors()
        metrics = s.train_step(batch, WARMUP).metrics
        after = _critic_state(s, "value_critic")
        assert _all_moved(before, after), f"the shared critic did not move on {AGENTS[agent]}'s rows"
        assert metrics["critic/value_critic/updated"] == 1.0
        assert metrics["critic/value_critic/value_loss"] > 0
        # critic_only (critic.warmup_steps): no agent's adapter moved
        assert all(_equal(agents_before[a], s.adapter_tensors()[a]) for a in AGENTS)
        assert all(metrics[f"agent/{a}/updated"] == 0.0 for a in AGENTS)
    # the critic learned toward the targets (1 on every token)
    batch = _batch(s, [0, 1, 0, 1], seed=9)
    first = (batch.batch["values"] - 1).pow(2)[batch.batch["response_mask"] > 0].mean()
    for _ in range(3):
        s.train_step(_batch(s, [0, 1, 0, 1], seed=9), WARMUP)
    later = (s.compute_values(batch).batch["values"] - 1).pow(2)[batch.batch["response_mask"] > 0].mean()
    assert later < first


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_per_agent_critics_move_only_on_their_agents_rows(make_strategy, zero_stage):
    s = _strategy(make_strategy, share=False, zero_stage=zero_stage)
    names = {a: f"value_critic-{a}" for a in AGENTS}
    assert s.critic.names == list(names.values())
    for step, agent in enumerate([0, 1, 0]):
        trained, other = AGENTS[agent], AGENTS[1 - agent]
        batch = _batch(s, [agent] * 4, seed=step)
        before = {a: _critic_state(s, n) for a, n in names.items()}
        opt_before = s.optimizer_state(names[other])
        metrics = s.train_step(batch, BOTH).metrics
        assert _all_moved(before[trained], _critic_state(s, names[trained]))
        assert _equal(before[other], _critic_state(s, names[other])), \
            f"{other}'s critic moved on {trained}'s rows"
        opt_after = s.optimizer_state(names[other])
        assert opt_after["global_steps"] == opt_before["global_steps"]
        pairs = zip(opt_before["exp_avg"], opt_after["exp_avg"], strict=True)
        assert all(torch.equal(x, y) for x, y in pairs)
        assert f"critic/{names[other]}/value_loss" not in metrics
        assert metrics[f"agent/{trained}/updated"] == 1.0  # not in warm-up: the agent trained too


def test_checkpoint_restores_critic(make_strategy, tmp_path):
    s = _strategy(make_strategy, share=True)
    s.train_step(_batch(s, [0, 1, 0, 1], seed=1), WARMUP)
    s.save_checkpoint(tmp_path)
    saved_state, saved_opt = _critic_state(s, "value_critic"), s.optimizer_state("value_critic")
    probe = on_policy(s, make_batch([0, 1], seed=5))
    saved_values = s.compute_values(probe).batch["values"]
    assert (tmp_path / "adapters" / "value_critic" / "adapter_model.safetensors").exists()
    assert (tmp_path / "critic" / "heads.pt").exists()

    fresh = _strategy(make_strategy, share=True)
    assert not _equal(saved_state, _critic_state(fresh, "value_critic"))
    fresh.load_checkpoint(tmp_path)
    assert _equal(saved_state, _critic_state(fresh, "value_critic"))
    opt = fresh.optimizer_state("value_critic")
    assert opt["global_steps"] == saved_opt["global_steps"] == 1
    assert all(torch.equal(x, y) for x, y in zip(opt["exp_avg"], saved_opt["exp_avg"], strict=True))
    assert torch.equal(fresh.compute_values(probe).batch["values"], saved_values)
