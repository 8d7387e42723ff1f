"""PettingLLMs' AT-GRPO relay rollout as a verl 0.9.1 agent loop (ported; single-policy ``prompt`` regime).

One dataset row is one game (atgrpo_game.GAME_KEY in its extra_info); verl's v1 trainer runs it
``rollout.n`` = group_size times (its sessions: independent copies, PettingLLMs' ``no_tree``). A session
plays every seat in turn, each turn's prompt SeatGame's relay prompt (the earlier replies carried), each turn
on the one shared policy, and returns one row per turn. GRPO then compares the group_size rows of one seat
at one turn of one game: uid = (game, turn, seat).

How this sits on verl 0.9.1 without patching it (paths under verl/, lines of the 0.9.1 wheel):

- An agent loop's ``run`` may return a list of AgentLoopOutput under the v1 trainer: its worker
  (trainer/ppo/v1/agent_loop_tq.py:150 ``AgentLoopWorkerTQ._agent_loop_postprocess``) stores each output as
  its own row, key ``{uid}_{session}_{index}`` (l. 193). The v0 trainer cannot: its worker keeps one output
  per call (experimental/agent_loop/agent_loop.py:694).
- That worker gives every row of a session the dataset row's uid (``field.update(kwargs)``, l. 195) and
  copies the LAST output's reward onto the earlier ones (l. 173): verl's multi-output sessions are one
  trajectory with one outcome. ``RelayAgentLoopWorker`` keeps verl's storing as it is, then writes each turn
  row's own uid (game, turn, seat) and own reward (SeatGame's, gamma 0) over those fields, before the game's
  status turns ``finished`` (l. 143), so the trainer never samples the rows in between.
- verl's ``grpo`` under v1 uses only each session's last output and broadcasts its advantage to the session
  (trainer/ppo/v1/utils.py:148-167); any other estimator sees every row with its uid
  (trainer/ppo/ray_trainer.py:248-257). run_atgrpo.py therefore sets ``algorithm.adv_estimator=
  grpo_vectorized``: verl's own GRPO (trainer/ppo/core_algos.py:334, same mean and unbiased std per uid as
  ``grpo``), grouped here by AT-GRPO's uids.
- The manager is verl's documented hook ``actor_rollout_ref.rollout.agent.agent_loop_manager_class``
  (trainer/main_ppo.py:118-124, workers/config/rollout.py:79); it only swaps in the worker class.
- Each turn's prompt ids are roll_ma's (``ct_build_initial_tokens`` returns roll_ma.envs.prompts'
  encode_chat's), the rest of a turn is verl's single-turn loop
  (experimental/agent_loop/single_turn_agent_loop.py).

PettingLLMs' ``lora`` regime (one LoRA per agent) is this loop with each turn's request on its seat's LoRA
(``turn_sampling_params``; atgrpo_multilora_verl.py) and verl's actor, server and sync extended for N adapters
(docs/studies/issue60_plan.md, items 1-2). Its rows carry their agent (the seat) in an ``agent_id`` column,
written by ``RelayAgentLoopWorker`` beside uid and reward when ``model.lora.agents`` is set: verl's actor
worker fetches every stored field of its rows (trainer/ppo/v1/replay_buffer.py:406 leaves the batch's fields
unnamed; utils/transferqueue_utils.py:311 then selects none), so the column reaches compute_log_prob and
update_actor as a (B,) tensor, and verl's padding rows copy it from the batch's first row
(trainer/ppo/padding_utils.py:88).
"""

from __future__ import annotations

from typing import Any

import ray
import torch
import transfer_queue as tq
from atgrpo_adapters import AGENT_COLUMN
from atgrpo_game import GAME_KEY, SEAT_KEY, TURN_KEY, group_id, play
from atgrpo_multilora_rollout import AGENTS_KEY
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from roll_ma.envs.prompts import encode_chat

AGENT_LOOP = "atgrpo_relay"  # actor_rollout_ref.rollout.agent.default_agent_loop
MANAGER = f"{__name__}.RelayAgentLoopManager"  # actor_rollout_ref.rollout.agent.agent_loop_manager_class


@register(AGENT_LOOP)
class RelayAgentLoop(SingleTurnAgentLoop):
    """Plays one relay game, one verl single-turn generation a turn (each relay prompt is a fresh
    [system, user] chat, as SeatGame builds it), and returns its turns' outputs in turn order."""

    async def run(
        self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any
    ) -> list[AgentLoopOutput]:
        spec = dict(kwargs["extra_info"][GAME_KEY])
        single_turn = super().run

        async def generate(messages: list[dict[str, str]], seat: int) -> tuple[AgentLoopOutput, str]:
            params = self.turn_sampling_params(sampling_params, seat)
            output = await single_turn(params, priority=priority, raw_prompt=messages)
            # the reply the next prompts carry, decoded as roll_ma's rollout decodes it (special tokens off)
            return output, self.tokenizer.decode(output.response_ids, skip_special_tokens=True)

        rows = await play(spec, generate)
        for row in rows:
            # the turn's own reward: verl then skips its reward loop for the session (agent_loop.py:972)
            row.output.reward_score = row.reward
            # reward_extra_info: verl copies the last output's onto the others (agent_loop_tq.py:175)
            row.output.extra_fields.update({TURN_KEY: row.turn, SEAT_KEY: row.seat, "reward_extra_info": {}})
        return [row.output for row in rows]

    def turn_sampling_params(self, sampling_params: dict[str, Any], seat: int) -> dict[str, Any]:
        """The sampling params of the turn ``seat`` plays: the session's, every seat on the one shared
        policy. atgrpo_multilora_verl.MultiLoraRelayAgentLoop names the seat's own LoRA here."""
        return sampling_params

    async def ct_build_initial_tokens(self, messages: list[dict], **_: Any) -> list[int]:
        """A turn's prompt ids as roll_ma's env worker encodes them (roll_ma.envs.prompts.encode_chat: the
        chat template with the generation prompt; a prompt over rollout.prompt_length, the job's
        prompt.max_prompt_tokens, cut from the left of its text, the system message kept), so that both
        runs feed the model the same ids. verl's own builder renders the template its own way per model
        family and keeps the last prompt_length ids of a long prompt (the system message lost)."""
        limit = self.rollout_config.prompt_length
        ids, _cut = await self.loop.run_in_executor(None, encode_chat, self.tokenizer, messages, limit)
        return ids


def reward_tokens(response_length: int, reward: float) -> torch.Tensor:
    """A row's rm_scores as verl writes them (AgentLoopOutput.as_dict): the reward on the last response
    token, zeros elsewhere."""
    scores = torch.zeros(response_length, dtype=torch.float32)
    scores[-1] = reward
    return scores


def turn_fields(
    prompt_uid: str, outputs: list[AgentLoopOutput], rewards: list[float], agents: int | None = None
) -> list[dict[str, Any]]:
    """The fields each turn row gets over verl's: its AT-GRPO uid and its own reward; with one LoRA per agent
    (``agents`` set), its agent too (agent = seat), the (B,) column the multi-LoRA actor splits rows by."""
    fields = []
    for o, r in zip(outputs, rewards, strict=True):
        turn, seat = o.extra_fields[TURN_KEY], o.extra_fields[SEAT_KEY]
        row = {"uid": group_id(prompt_uid, turn, seat), "rm_scores": reward_tokens(len(o.response_ids), r)}
        if agents is not None:
            if not 0 <= seat < agents:
                raise ValueError(f"seat {seat} has no adapter: model.lora.{AGENTS_KEY}={agents}")
            row[AGENT_COLUMN] = torch.tensor(seat, dtype=torch.int64)  # stacked to (B,) by verl's put
        fields.append(row)
    return fields


# An actor class at module level, as verl's AgentLoopWorkerTQ is: ray.remote(...) called at run time instead
# ships the class to the actor by value, and AgentLoopWorkerTQ.__init__'s super() then meets a copy of its
# own class and fails ("super(type, obj): obj must be an instance or subtype of type"; seen on CPU, Ray 2.60).
# The base is the plain class: Ray forbids subclassing an actor class.
@ray.remote
class RelayAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):
    """verl's v1 agent-loop worker, with each relay turn row's uid and reward made the turn's own, and its
    agent written where the actor holds one LoRA per agent (``model.lora.agents``, the key the multi-LoRA
    actor and server read: one switch for all three)."""

    async def _agent_loop_postprocess(self, output: Any, validate: bool, **kwargs: Any) -> None:
        outputs = output if isinstance(output, list) else [output]
        rewards = [o.reward_score for o in outputs]  # before verl copies the last one onto all
        await super()._agent_loop_postprocess(outputs, validate, **kwargs)
        if not outputs or TURN_KEY not in outputs[0].extra_fields:  # another loop's rows: as verl wrote them
            return
        uid, session = kwargs["uid"], kwargs["session_id"]
        # the keys verl just wrote (agent_loop_tq.py:193; replay_buffer.py's "Trajectories storage format")
        keys = [f"{uid}_{session}_{i}" for i in range(len(outputs))]
        await tq.async_kv_batch_put(
            keys=keys,
            partition_id="val" if validate else "train",
            fields=list_of_dict_to_tensordict(turn_fields(uid, outputs, rewards, self.lora_agents())),
        )

    def lora_agents(self) -> int | None:
        """The number of per-agent LoRAs (None: one shared policy, no agent column)."""
        agents = (self.model_config.lora or {}).get(AGENTS_KEY)
        return None if agents is None else int(agents)


class RelayAgentLoopManager(AgentLoopManagerTQ):
    """verl's v1 agent-loop manager running RelayAgentLoopWorker actors (created after __init__, in
    ``create``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = RelayAgentLoopWorker
