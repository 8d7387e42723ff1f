"""Helpers of the workflow tests: a scripted rollout (fixed answers per agent, no model) and workers."""

from __future__ import annotations

from collections.abc import Callable

import torch

from roll_ma.config.schema import AgentConfig, EnvConfig, ModelConfig
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import GenerateRequest
from roll_ma.workers.env_worker import EpisodeSpec
from roll_ma.workers.worker_specs import WorkflowWorkerSpec
from roll_ma.workers.workflow_worker import WorkflowWorker

MODEL = ModelConfig(path="builtin:tiny", max_prompt_tokens=512)


class ScriptedRollout:
    """Stands in for the rollout cluster: ``answer(agent_id, prompt_text) -> text`` decides each reply.

    Records every generate call (its rows' agent ids, its sampling request, its rows' meta_info), reports
    ``version`` as the adapter version and log-prob -0.5 for every token.
    """

    def __init__(self, tokenizer, answer: Callable[[int, str], str], version: int = 0):
        self.tokenizer, self.answer, self.version = tokenizer, answer, version
        self.calls: list[list[int]] = []
        self.prompts: list[str] = []
        self.seeds: list[int] = []
        self.sampling: list[GenerateRequest] = []
        self.metas: list[dict] = []

    def generate(self, request: DataProto, sampling: GenerateRequest) -> DataProto:
        agent_ids = [int(a) for a in request.non_tensor["agent_id"]]
        self.calls.append(agent_ids)
        self.sampling.append(sampling)
        self.metas.append(dict(request.meta_info))
        self.seeds += [int(x) for x in request.non_tensor["sample_seed"]]
        texts, ids = [], []
        for aid, prompt in zip(agent_ids, request.non_tensor["prompt_ids"]):
            prompt_text = self.tokenizer.decode(list(prompt))
            self.prompts.append(prompt_text)
            text = self.answer(aid, prompt_text)
            texts.append(text)
            ids.append(
                self.tokenizer(text, add_special_tokens=False)["input_ids"] or [self.tokenizer.pad_token_id]
            )
        width = max(len(x) for x in ids)
        pad = self.tokenizer.pad_token_id
        responses = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
        mask = torch.tensor([[1.0] * len(x) + [0.0] * (width - len(x)) for x in ids])
        return DataProto.from_dict(
            {"responses": responses, "response_mask": mask, "rollout_log_probs": -0.5 * mask},
            {"agent_id": agent_ids, "adapter_version": [self.version] * len(ids), "response_text": texts},
        )


def make_worker(workflow: str, agents: list[str], **env) -> WorkflowWorker:
    spec = WorkflowWorkerSpec(env=EnvConfig(workflow=workflow, **env), model=MODEL,
                              agents=tuple(AgentConfig(name=a) for a in agents), seed=0)
    return WorkflowWorker("env", spec=spec)


def specs(tasks: list[dict], group: str = "g") -> list[list[EpisodeSpec]]:
    return [[EpisodeSpec(f"{group}-e{i}", group, i, task) for i, task in enumerate(tasks)]]
