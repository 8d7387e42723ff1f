"""The value critic of PPO with GAE: a value head plus its own LoRA adapter on the shared base model.

No second model: a critic is one more adapter injected into the train strategy's PeftModel
(``value_critic``, or ``value_critic-<agent>`` per agent with ``critic.share: false``) and a
``Linear(hidden, 1)`` head on the decoder's last hidden states. Each critic has its own DeepSpeed
engine and optimizer over exactly its adapter and head (``PolicyEngine``), so a critic's update
touches no agent's adapter and no other critic. Its loss (``objective_value.ValueLoss``) runs through the
one update loop (``update_loop.run_update``) as the policies' do.

V(s_t) sits at response position t: the value of the prefix that token t is sampled from (the
hidden state at t - 1, as the log-prob of token t), so ``values`` is (B, R) like ``old_log_probs``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from roll_ma.config.run_plan import needs_critic
from roll_ma.config.schema import CriticConfig, TrainConfig
from roll_ma.models.adapters import AdapterSpec, AgentSpec
from roll_ma.models.logprobs import drop_padding_columns, split_lm
from roll_ma.packing import position_ids_from_mask
from roll_ma.protocol import DataProto
from roll_ma.training.micro_batches import MicroBatching, real_lengths
from roll_ma.training.objective_value import CRITIC_KEYS, ValueLoss
from roll_ma.training.policy_engine import PolicyEngine
from roll_ma.training.update_loop import UpdatePlan, run_update

SHARED_CRITIC = "value_critic"


def critic_of_agents(agents: Sequence[AgentSpec], share: bool,
                     groups: Sequence[Sequence[str]] = ()) -> dict[int, str]:
    """agent_id -> the adapter name of the critic that values its rows: ``value_critic`` for all (share),
    ``value_critic-group<i>`` per group of ``groups`` (share), else ``value_critic-<agent>``."""
    group_of = {name: i for i, group in enumerate(groups) for name in group}
    out = {}
    for a in agents:
        if share and not groups:
            out[a.agent_id] = SHARED_CRITIC
        elif share and a.name in group_of:
            out[a.agent_id] = f"{SHARED_CRITIC}-group{group_of[a.name]}"
        else:
            out[a.agent_id] = f"{SHARED_CRITIC}-{a.name}"
    return out


def critic_adapter_specs(template: AdapterSpec, names: Sequence[str], cfg: CriticConfig) -> list[AdapterSpec]:
    """One LoRA adapter per critic, shaped like ``template`` (the first agent's) but for critic.rank/alpha."""
    rank, alpha = cfg.adapter_shape(template.rank, template.alpha)
    return [dataclasses.replace(template, name=name, init_dir=None, rank=rank, alpha=alpha)
            for name in dict.fromkeys(names)]


def _head_key(name: str) -> str:
    return name.replace("-", "_")


class ValueModel(torch.nn.Module):
    """The shared PeftModel plus one value head (Linear hidden -> 1, fp32) per critic.

    Each head starts small (std 0.1 / sqrt(hidden), bias 0, seeded per critic name): values near 0, and
    a nonzero weight, so the critic's adapter gets gradients from the first step.
    """

    def __init__(self, backbone: Any, names: Sequence[str], hidden_size: int, seed: int = 0):
        super().__init__()
        self.backbone = backbone
        self.heads = torch.nn.ModuleDict()
        for name in names:
            gen = torch.Generator().manual_seed(seed + zlib.crc32(name.encode()))
            head = torch.nn.Linear(hidden_size, 1)
            with torch.no_grad():
                head.weight.copy_(torch.randn(1, hidden_size, generator=gen) * 0.1 / math.sqrt(hidden_size))
                head.bias.zero_()
            self.heads[_head_key(name)] = head

    def head(self, name: str) -> torch.nn.Linear:
        head = self.heads[_head_key(name)]
        assert isinstance(head, torch.nn.Linear)  # only Linear heads are put in
        return head

    def values(self, name: str, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               response_len: int) -> torch.Tensor:
        """(B, R) V(prefix before each response token) with critic ``name``'s head; 0 off the response.

        The caller makes critic ``name``'s adapter the active one (scoring or training).
        """
        full_len = response_len
        input_ids, attention_mask, response_len = drop_padding_columns(input_ids, attention_mask, full_len)
        positions = position_ids_from_mask(attention_mask)  # (B, T')
        parts = split_lm(self.backbone)
        if parts is not None:
            hidden = parts[0](input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                              use_cache=False).last_hidden_state  # (B, T, H)
        else:
            hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                                   use_cache=False, output_hidden_states=True).hidden_states[-1]
        states = hidden[:, -response_len - 1:-1].float()  # (B, R, H) the prefix of each response token
        values = self.head(name)(states).squeeze(-1)  # (B, r)
        values = values * attention_mask[:, -response_len:].to(values.dtype)
        return torch.nn.functional.pad(values, (0, full_len - response_len))  # (B, R)


class CriticSet:
    """Every critic of a run: its value head, adapter, engine; values (forward only), update, save, load.

    Args:
        weights: the strategy's ``LoraWeights`` (the critics' adapters already injected).
        agents: every agent (index = agent_id).
        critic_cfg, train_cfg: the critic's settings; batch shapes.
    """

    def __init__(self, weights: Any, agents: Sequence[AgentSpec], critic_cfg: CriticConfig,
                 train_cfg: TrainConfig, seed: int, rank: int, world_size: int,
                 device: torch.device, total_steps: int | None = None):
        self.weights, self.cfg = weights, critic_cfg
        self.rank, self.world_size, self.device = rank, world_size, device
        self.critic_of = critic_of_agents(agents, critic_cfg.share, critic_cfg.groups)
        self.names = list(dict.fromkeys(self.critic_of.values()))
        hidden = int(weights.model.get_base_model().config.hidden_size)
        self.model = ValueModel(weights.model, self.names, hidden, seed).to(device)
        critic_train = dataclasses.replace(train_cfg, grad_clip=critic_cfg.grad_clip,
                                           ppo_epochs=critic_cfg.ppo_epochs)
        self.train_cfg = critic_train
        self.scoring = MicroBatching.for_scoring(train_cfg)
        self.updaters: dict[str, PolicyEngine] = {}
        for index, name in enumerate(self.names):
            params = weights.params(name) + list(self.model.head(name).parameters())
            self.updaters[name] = PolicyEngine(
                name, 1000 + index, self.model, params, functools.partial(weights.activate, name),
                critic_cfg.lr, critic_train, seed, rank, world_size, device, total_steps)
        weights.activate(None)

    def _groups(self, agent_ids: np.ndarray) -> dict[str, np.ndarray]:
        names = np.asarray([self.critic_of[int(a)] for a in agent_ids], dtype=object)
        return {n: np.nonzero(names == n)[0] for n in self.names if (names == n).any()}

    @torch.no_grad()
    def compute_values(self, data: DataProto, agent_ids: np.ndarray) -> torch.Tensor:
        """(B, R) float32 values of every row under its agent's critic (eval mode, no grad)."""
        n, resp_len = data.batch["responses"].shape
        out = torch.zeros(n, resp_len, dtype=torch.float32)  # (B, R)
        self.model.eval()
        prompt_lens, response_lens = real_lengths(data.batch["attention_mask"], resp_len)
        for name, idx in self._groups(agent_ids).items():
            idx = idx[np.argsort(prompt_lens[idx], kind="stable")]  # similar widths share a micro-batch
            with self.weights.scoring(name):
                for rows in self.scoring.split(idx, prompt_lens, response_lens):
                    sel = torch.from_numpy(rows)
                    ids = data.batch["input_ids"][sel].to(self.device)  # (b, T)
                    mask = data.batch["attention_mask"][sel].to(self.device)  # (b, T)
                    out[sel] = self.model.values(name, ids, mask, resp_len).float().cpu()
        self.weights.activate(None)
        return out

    def update(self, data: DataProto, agent_ids: np.ndarray, step: int) -> dict[str, float]:
        """Clipped value-loss epochs over each critic's rows; ``critic/<name>/{value_loss, value_clip_frac,
        grad_norm, lr}`` per critic (every rank returns the same numbers)."""
        missing = [k for k in CRITIC_KEYS if k not in data.batch.keys()]
        if missing:
            raise ValueError(f"the critic's update needs {missing} in the batch (values before advantages)")
        cols = {k: data.batch[k] for k in CRITIC_KEYS}
        prompt_lens, response_lens = real_lengths(cols["attention_mask"], cols["responses"].shape[1])
        metrics: dict[str, float] = {}
        for name, idx in self._groups(agent_ids).items():
            # similar prompt widths share a micro-batch (a shared critic mixes every agent's prompts);
            # the order within one optimizer step changes nothing else
            idx = idx[np.argsort(prompt_lens[idx], kind="stable")]
            metrics.update({f"critic/{name}/{k}": v
                            for k, v in self._update_one(name, idx, cols, prompt_lens, response_lens,
                                                         step).items()})
        self.weights.activate(None)
        return metrics

    def _update_one(self, name: str, rows: np.ndarray, cols: dict[str, torch.Tensor], prompt_lens: np.ndarray,
                    response_lens: np.ndarray, step: int) -> dict[str, float]:
        engine = self.updaters[name]
        loss = ValueLoss(self.model, name, cols, self.cfg.cliprange_value, self.cfg.value_loss_coef,
                         self.device)
        plan = UpdatePlan(rows, prompt_lens, response_lens, slots=1, epochs=self.train_cfg.ppo_epochs,
                          shuffle=True)
        result, sums = run_update(engine, loss, plan, step)
        t = sums.row(0)
        toks = t["tokens"]
        stepped = result.optimizer_steps + result.skipped_nonfinite > 0
        return {"value_loss": t["value_loss"] / toks if toks else 0.0,
                "value_clip_frac": t["clipped"] / toks if toks else 0.0,
                "grad_norm": result.grad_norm, "lr": result.lr,
                "rows": float(len(rows)), "updated": float(stepped and math.isfinite(result.last_grad_norm))}

    # ------------------------------------------------------------------ checkpoint
    def save_heads(self, root: Path) -> None:
        """``critic/heads.pt``: every value head (the adapters are saved with the other adapters)."""
        path = root / "critic" / "heads.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().cpu() for k, v in self.model.heads.state_dict().items()}, path)

    def load_heads(self, root: Path) -> None:
        path = root / "critic" / "heads.pt"
        if not path.exists():
            raise FileNotFoundError(f"checkpoint {root} holds no critic/heads.pt (the value heads); it was "
                                    "written by a run without algorithm.advantage=gae")
        self.model.heads.load_state_dict(torch.load(path, map_location="cpu"))


def critic_specs(agents: Sequence[AgentSpec], adapters: Sequence[AdapterSpec], advantage: str,
                 cfg: CriticConfig) -> list[AdapterSpec]:
    """The critics' adapters a trainer injects (``algorithm.advantage=gae``; none otherwise), shaped like
    the first agent's adapter."""
    if not needs_critic(advantage):
        return []
    names = list(critic_of_agents(agents, cfg.share, cfg.groups).values())
    return critic_adapter_specs(adapters[0], names, cfg)
