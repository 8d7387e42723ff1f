"""The joint-search step: the synchronous RL step with a joint policy search between its update and its sync.

`study.joint_search_every` = k: every k steps, after the update, the train worker scores every
legal answer of every information set of the game under the acting seat's adapter; the greedy
joint policy is searched for a better one (`joint_policy_search.py`); when one beats it
by more than `joint_search_min_gain`, every information set's answer in it is taught to the
acting seat's adapter by supervised steps (each adapter from its own rows, with its own
optimizer) before the sync, so the next rollout plays it and RL goes on from there.

It is a step kind of its own (``JointSearchStep``), registered with the RL loop when ``roll_ma.studies``
is imported and chosen once by the loop (``RunPlan.step_kind`` "joint_search"); its passes over the policies
(``joint_search_train.py``) go to the train worker with each call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from roll_ma.algorithms.game_tree import InfoSet
from roll_ma.config.schema import RunConfig
from roll_ma.pipelines.rl.rl_run import RLRun
from roll_ma.pipelines.rl.stages import record
from roll_ma.pipelines.rl.step import push_and_evaluate, roll_out_and_update
from roll_ma.pipelines.step_timer import StepTimer
from roll_ma.protocol import DataProto
from roll_ma.studies.joint_policy_search import joint_policy_search
from roll_ma.studies.joint_search_train import distill_choices, score_choices
from roll_ma.workers.clients import TrainClient


class JointSearchStep:
    """The synchronous step, plus every ``study.joint_search_every`` steps the joint search after the update
    (``search``: the game's tree and prompt rows, built once per run)."""

    def __init__(self, search: JointSearch):
        self.search = search

    def __call__(self, run: RLRun, step: int) -> dict[str, Any]:
        timer = StepTimer()
        with timer("step"):
            metrics, flops, trained = roll_out_and_update(run, step, timer)
            changed = set(trained.updated_adapters)  # only these took an optimizer step
            if step % run.cfg.study.joint_search_every == 0:
                with timer("joint_search"):
                    metrics.update(self.search.improve(run.workers.train, step))
                changed = run.trainable  # the search distills into every adapter
            push_and_evaluate(run, changed, step, metrics, timer)
        return record(run, step, metrics, timer, flops, rollout_s=timer.times["timing/rollout"])


class JointSearch:
    """The game's tree and its information sets as prompt rows, built once per run."""

    def __init__(self, cfg: RunConfig, seats: list[str]):
        from roll_ma.envs.base import GameTreeEnv
        from roll_ma.envs.env_registry import resolve_env_class
        from roll_ma.models.loading import load_tokenizer
        from roll_ma.workers.env_worker import chat_prompt_ids, env_kwargs

        self.study = cfg.study
        env = resolve_env_class(cfg.env.name)(**env_kwargs(cfg.env, cfg.agents, seats))
        if not isinstance(env, GameTreeEnv):  # config validation refuses this first
            raise ValueError(f"study.joint_search_every: env {cfg.env.name!r} has no game_tree() to search")
        self.tree, turns = env.game_tree()
        self.keys = list(self.tree.info_sets)
        tokenizer = load_tokenizer(cfg.model)
        agent_id = {a.name: i for i, a in enumerate(cfg.agents)}
        prompts, choices = [], []
        for key in self.keys:
            turn = turns[key]
            ids = chat_prompt_ids(tokenizer, turn.messages)  # the env worker's: the rollout's prompt
            if len(ids) > cfg.model.max_prompt_tokens:
                raise ValueError(f"an information set's prompt takes {len(ids)} tokens > "
                                 f"model.max_prompt_tokens={cfg.model.max_prompt_tokens}; raise it")
            prompts.append(ids)
            choices.append([list(tokenizer(text, add_special_tokens=False)["input_ids"])
                            for text in turn.action_responses])
        width = max(len(p) for p in prompts)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # (S, P) left-padded
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # (S, P)
        self._tensors = {"input_ids": input_ids, "attention_mask": attention_mask}
        self._columns: dict[str, list[Any]] = {
            "agent_id": [agent_id[turns[k].agent] for k in self.keys], "action_choices": choices
        }
        self.rows = DataProto.from_dict(self._tensors, self._columns)
        # for the console line: (player, first line of what it sees, its legal actions)
        self.labels = {k: (t.player, t.messages[-1]["content"].split("\n")[0], t.legal_actions)
                       for k, t in turns.items()}

    def policy(self, train: TrainClient) -> dict[InfoSet, np.ndarray]:
        """Information set -> the acting adapter's probabilities over the legal answers (renormalised)."""
        # (S, K), -inf past the answers
        log_probs = train.score_with(score_choices, self.rows).batch["choice_log_probs"]
        probs = torch.softmax(log_probs, dim=-1).numpy()
        return {k: probs[i, : self.tree.num_actions[k]] for i, k in enumerate(self.keys)}

    def improve(self, train: TrainClient, step: int) -> dict[str, float]:
        """Search from the greedy joint policy and distill what gains; returns ``search/...`` metrics."""
        policy = self.policy(train)
        greedy = {k: int(np.argmax(p)) for k, p in policy.items()}
        result = joint_policy_search(self.tree, greedy, depth=self.study.joint_search_depth)
        metrics = {
            "search/value_policy": self.tree.value(policy),  # the sampled policy's exact return
            "search/value_greedy": result.value_before,
            "search/value_found": result.value_after,
            "search/changed_info_sets": float(len(result.changed)),
            "search/distilled": 0.0,
        }
        if result.value_after <= result.value_before + self.study.joint_search_min_gain:
            return metrics
        targets = [result.policy[k] for k in self.keys]
        rows = DataProto.from_dict(self._tensors, {**self._columns, "target_action": targets})
        distill = train.train_with(distill_choices, rows, self.study.joint_search_distill_steps,
                                   self.study.joint_search_stop_prob)
        metrics.update({f"search/distill/{k}": v for k, v in distill.items()})
        after = self.policy(train)
        metrics["search/distilled"] = 1.0
        metrics["search/value_policy_after"] = self.tree.value(after)
        moves = "; ".join(f"player {p} '{seen}' -> {legal[result.policy[k]]}"
                          for k in result.changed for p, seen, legal in [self.labels[k]])
        print(f"[roll_ma] step {step}: joint search {result.value_before:.2f} -> {result.value_after:.2f} "
              f"({moves}); distilled, the policy's exact return {metrics['search/value_policy']:.2f} -> "
              f"{metrics['search/value_policy_after']:.2f}", flush=True)
        return metrics


def joint_search_step(run: RLRun) -> JointSearchStep:
    """The RL loop's step of kind "joint_search" (the game's tree built here, once)."""
    return JointSearchStep(JointSearch(run.cfg, run.session.seats))
