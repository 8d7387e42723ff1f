"""Workflow worker: a Ray actor that runs many workflow episodes at once against the rollout cluster.

The env worker of runs whose config names ``env.workflow`` (``roll_ma.workflows``). Its episodes are
asyncio tasks on one loop; their ``generate`` calls are gathered by a ``TickScheduler`` into ONE
rollout ``generate`` per tick, with each row's agent_id and a sampling seed from (episode, call).
It returns what ``EnvWorker.run_episodes`` returns: every call as a row (``collate_turns``) and one
summary per episode in ``meta_info["episodes"]``, so the pipeline, trainer and metrics are shared.

A workflow that raises: with ``env.on_workflow_error=raise`` the step stops at once with
``WorkflowError`` naming the workflow's file and line; with ``skip`` the episode's rows are dropped,
its summary says ``workflow_failed = 1`` (``rollout/env/workflow_failed`` is the failure rate) and
the others go on.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from roll_ma.data.turn_samples import collate_turns
from roll_ma.distributed.progress import progress_bar
from roll_ma.distributed.worker import Dispatch, Worker, register, share_of
from roll_ma.envs.prompts import encode_chat
from roll_ma.errors import UserCodeError
from roll_ma.inference.infer_backend import Generator
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import GenerateRequest
from roll_ma.workers.env_worker import EpisodeSpec, sample_seed
from roll_ma.workers.worker_specs import WorkflowWorkerSpec, expect_spec

logger = logging.getLogger(__name__)


class WorkflowError(UserCodeError):
    """A workflow raised (env.on_workflow_error=raise); the message names its file and line, ``details``
    holds its traceback."""


class WorkflowWorker(Worker):
    """Plays workflow episodes; the same ``run_episodes`` as ``EnvWorker``.

    Built from one ``WorkflowWorkerSpec`` (``spec``: the env block naming the workflow, the model, the agents,
    the seed; every setting named, the driver makes it).
    """

    def __init__(self, role: str, rank: int = 0, world_size: int = 1, env_vars: dict[str, str] | None = None,
                 *, spec: WorkflowWorkerSpec):
        expect_spec(spec, WorkflowWorkerSpec)
        super().__init__(role, rank, world_size, env_vars)
        from roll_ma.models.loading import load_tokenizer
        from roll_ma.workflows.lookup import load_workflow
        from roll_ma.workflows.tools import build_tools

        self.spec = spec
        self.env_cfg, self.seed = spec.env, spec.seed
        self.workflow = load_workflow(spec.env.workflow)
        self.tools = build_tools(spec.env.tools)  # why once per worker: a tool may hold costly state
        self.agents = [a.name for a in spec.agents]
        self.system_prompts = {a.name: a.system_prompt for a in spec.agents}
        self.tokenizer = load_tokenizer(spec.model)
        self.max_prompt_tokens = spec.model.max_prompt_tokens

    @register(Dispatch.ONE_TO_ALL)
    def run_episodes(
        self,
        rollout: Any,
        assignments: list[list[EpisodeSpec]],
        step: int,
        greedy: bool = False,
        seats: list[str] | None = None,
    ) -> DataProto:
        """Run this rank's episodes (``assignments[rank]``); returns every agent call as a row.

        ``seats`` (an evaluation opponent of turn-based games) does not apply to workflows.
        """
        started_at = time.time()  # wall clock: the benchmarks' timeline of rollouts and updates
        from roll_ma.workflows.episode import EpisodeRecord
        from roll_ma.workflows.scheduler import TickScheduler, run_coroutine

        specs = assignments[self.rank] if self.rank < len(assignments) else []
        engines: Generator = share_of(rollout, self.rank, self.world_size)  # env worker i drives engine i
        episodes = [
            EpisodeRecord(i, s.episode_id, s.group_id, s.seed, dict(s.problem or {}))
            for i, s in enumerate(specs)
        ]
        bar = progress_bar(
            f"{'eval' if greedy else 'rollout'} step {step}, workflow worker {self.rank}",
            len(episodes),
            "episode",
        )
        shown = [0]

        def on_tick() -> None:
            done = sum(ep.result is not None or ep.failure is not None or ep.truncated for ep in episodes)
            bar.update(done - shown[0])
            shown[0] = done

        def generate(calls: list) -> list[dict]:
            return self._generate(engines, calls, greedy, step)

        scheduler = TickScheduler(generate, on_tick)
        # why an executor of its own, dropped without waiting: a tool thread that never returns (its
        # call already gave a time-limit observation) must not keep this step from ending
        tool_threads = ThreadPoolExecutor(max_workers=min(32, 4 + len(episodes)), thread_name_prefix="tool")
        try:
            run_coroutine(scheduler.run([self._episode(ep, scheduler, tool_threads) for ep in episodes]))
        finally:
            tool_threads.shutdown(wait=False, cancel_futures=True)
        on_tick()
        bar.close()
        failures = [ep.failure for ep in episodes if ep.failure is not None]
        if failures and self.env_cfg.on_workflow_error == "raise":
            first = failures[0]
            error = WorkflowError(
                f"workflow {self.workflow.spec} (env.workflow) raised {first.error}",
                f"{first.location} (episode {first.episode_id})",
                "correct the workflow at that line (the log file has the full traceback), or set "
                "env.on_workflow_error=skip to count such episodes as failed and go on",
            )
            error.details = first.traceback
            raise error
        for failure in failures:
            logger.warning(
                "workflow episode %s failed at %s: %s", failure.episode_id, failure.location, failure.error
            )
        samples = [s for ep in episodes if ep.failure is None for s in ep.samples]
        meta = {
            "episodes": [self._summary(ep) for ep in episodes],
            "rounds": scheduler.ticks,
            "step": step,
            "pad_id": self.tokenizer.pad_token_id,
            "started_at": started_at,
            "finished_at": time.time(),
        }
        return collate_turns(samples, self.tokenizer.pad_token_id, meta)

    def _episode(self, ep: Any, scheduler: Any, tool_threads: ThreadPoolExecutor) -> Any:
        """The coroutine of one episode (a plain method: an async one would make Ray run this actor's
        methods on an event loop)."""
        from roll_ma.workflows.episode import AgentHandle, AgentMap, episode_rng, play_episode
        from roll_ma.workflows.tools import ToolBox

        def encode(messages: list[dict]) -> tuple[list[int], bool]:
            return encode_chat(self.tokenizer, messages, self.max_prompt_tokens)

        handles = AgentMap()
        for i, name in enumerate(self.agents):
            handles[name] = AgentHandle(
                name,
                i,
                ep,
                scheduler.submit,
                encode,
                self.system_prompts[name],
                self.env_cfg.max_turns,
                self._env_name,
                sample_seed,
            )
        toolbox = ToolBox(self.tools, lambda: scheduler.activity(ep.index), tool_threads)
        ep.tool_stats = toolbox.stats  # why the same dict: it fills while the episode runs
        extras = {"tools": toolbox, "rng": episode_rng(self.seed, ep.episode_id)}
        extras = {k: v for k, v in extras.items() if k in self.workflow.takes}
        stop = scheduler.stop if self.env_cfg.on_workflow_error == "raise" else None
        return play_episode(
            ep,
            lambda: self.workflow.instance(dict(self.env_cfg.kwargs)),
            handles,
            extras,
            self.agents,
            self.workflow.file,
            on_failure=stop,
        )

    @property
    def _env_name(self) -> str:
        return f"workflow:{self.workflow.spec.rsplit('/', 1)[-1]}"

    def _generate(self, rollout: Generator, calls: list, greedy: bool, step: int) -> list[dict]:
        """One rollout call for every queued call of this tick; one answer dict per call."""
        request = DataProto.from_dict(
            non_tensors={
                "prompt_ids": [c.prompt_ids for c in calls],
                "agent_id": [c.agent_id for c in calls],
                "sample_seed": [c.sample_seed for c in calls],
            },
        )
        out = rollout.generate(request, GenerateRequest(greedy=greedy, seed=self.seed * 1_000_003 + step))
        lengths = out.batch["response_mask"].bool().sum(-1).tolist()
        return [
            {
                "response_ids": out.batch["responses"][row, :n].tolist(),
                "rollout_log_probs": out.batch["rollout_log_probs"][row, :n].tolist(),
                "agent_id": int(out.non_tensor["agent_id"][row]),
                "adapter_version": int(out.non_tensor["adapter_version"][row]),
                "response_text": str(out.non_tensor["response_text"][row]),
            }
            for row, n in enumerate(lengths)
        ]

    def _summary(self, ep: Any) -> dict[str, Any]:
        returns = [0.0] * len(self.agents)
        ok = ep.result is not None and ep.failure is None
        if ok:
            for agent, reward in ep.result.rewards.items():
                returns[self.agents.index(agent)] += sum(reward) if isinstance(reward, list) else reward
        metrics = dict(ep.result.metrics) if ok else {}
        metrics.update({k: float(v) for k, v in ep.tool_stats.items()})
        metrics.update(workflow_failed=float(ep.failure is not None), calls=float(ep.calls))
        model_turns: dict[str, int] = {}
        for sample in ep.samples:
            model_turns[self.agents[sample.player]] = model_turns.get(self.agents[sample.player], 0) + 1
        return {
            "episode_id": ep.episode_id,
            "group_id": ep.group_id,
            "seed": ep.seed,
            "seat_agents": list(self.agents),
            "returns": returns,
            "metrics": metrics,
            "turns": ep.calls,
            "truncated": ep.truncated,
            "model_turns": model_turns,
            "format_errors": {},
            "error": str(ep.failure) if ep.failure is not None else None,
        }
