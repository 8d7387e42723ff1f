"""Env worker: a Ray actor that owns many env instances and plays them against the rollout cluster.

Each round it gathers the prompt of every episode waiting for a model move (whichever agent
is to act), sends them to the rollout cluster in ONE generate call with each row's
agent_id, feeds the answers back to the envs, and repeats until all its episodes are done.
An env whose prompts never depend on a reply plans its turns (`planned_turns`): a round then
decodes each episode's remaining turns at once (env.decode_ahead), and stepping checks each.
Built-in opponents ("random", "scripted") move locally and produce no training rows.
"""

from __future__ import annotations

import dataclasses
import inspect
import random
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from roll_ma.config.schema import AgentConfig, EnvConfig, ModelConfig
from roll_ma.data.turn_samples import TurnSample, collate_turns
from roll_ma.distributed import activity
from roll_ma.distributed.progress import progress_bar
from roll_ma.distributed.worker import Dispatch, Worker, register, share_of
from roll_ma.envs.base import BUILTIN_POLICIES
from roll_ma.envs.prompts import chat_prompt_ids, encode_chat, encode_chats
from roll_ma.inference.infer_backend import Generator
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import GenerateRequest
from roll_ma.workers.worker_specs import EnvWorkerSpec, expect_spec

if TYPE_CHECKING:
    from roll_ma.envs.base import Turn


def env_kwargs(env_cfg: EnvConfig, agents: list[AgentConfig], seats: list[str] | None) -> dict[str, Any]:
    """The env constructor's arguments: env.kwargs plus seats, per-agent prompts and role kinds."""
    from roll_ma.envs.env_registry import resolve_env_class

    params = inspect.signature(resolve_env_class(env_cfg.name).__init__).parameters
    kwargs = dict(env_cfg.kwargs)
    kwargs["seat_agents"] = list(seats) if seats is not None else None
    prompts = {a.name: a.system_prompt for a in agents if a.system_prompt}
    if prompts and "system_prompts" in params:
        kwargs["system_prompts"] = {**prompts, **kwargs.get("system_prompts", {})}
    kinds = {a.name: a.kind for a in agents if a.kind}
    if kinds and "role_kinds" in params:
        kwargs["role_kinds"] = {**kinds, **kwargs.get("role_kinds", {})}
    if env_cfg.show_greedy_moves:
        kwargs["show_greedy_moves"] = True
    if "max_rounds" in params:  # reflection envs: env.max_rounds (validation refuses env.kwargs.max_rounds)
        kwargs["max_rounds"] = env_cfg.max_rounds
    if "agent_configs" in params:  # team envs (marft): each agent's hooks, the task, the turn budget
        kwargs.update(agent_configs=list(agents), task_path=env_cfg.path,
                      max_assistant_turns=env_cfg.max_assistant_turns)
    return kwargs


def model_vocab_size(model_cfg: ModelConfig) -> int | None:
    """The model's vocabulary size (its embedding rows: a larger id fails deep in torch); None when its
    config cannot be read here."""
    from transformers import AutoConfig

    from roll_ma.models.loading import resolve_model_path

    try:
        config = AutoConfig.from_pretrained(resolve_model_path(model_cfg.path),
                                            trust_remote_code=model_cfg.trust_remote_code)
        return int(config.get_text_config().vocab_size)
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return None


def sample_seed(episode_id: str, turn: int) -> int:
    """A per-row sampling seed that does not depend on how rows are batched or split."""
    return zlib.crc32(f"{episode_id}/{turn}".encode()) & 0x7FFFFFFF


@dataclass
class EpisodeSpec:
    """One episode to play: its ids, the env seed and (math) the problem."""

    episode_id: str
    group_id: str
    seed: int
    problem: dict | None = None


@dataclass
class _Episode:
    spec: EpisodeSpec
    env: Any
    turn: Any
    rng: random.Random
    turns_played: int = 0
    last_sample: dict[int, int] = field(default_factory=dict)  # player -> index of its latest sample
    carry: dict[int, float] = field(default_factory=lambda: defaultdict(float))  # rewards before a first turn
    format_errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    model_turns: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    truncated: bool = False


class EnvWorker(Worker):
    """Plays episodes of one env against the rollout cluster and returns their turns as a DataProto."""

    def __init__(self, role: str, rank: int = 0, world_size: int = 1, env_vars: dict[str, str] | None = None,
                 *, spec: EnvWorkerSpec):
        expect_spec(spec, EnvWorkerSpec)
        super().__init__(role, rank, world_size, env_vars)
        from roll_ma.envs.env_registry import resolve_env_class
        from roll_ma.models.loading import load_tokenizer

        self.spec = spec
        self.env_cfg, self.seed = spec.env, spec.seed
        self.env_cls = resolve_env_class(spec.env.name)
        self.agents = list(spec.agents)
        self.agent_ids = {a.name: i for i, a in enumerate(spec.agents)}
        self.seats = list(spec.seats)
        self.tokenizer = load_tokenizer(spec.model)
        self.max_prompt_tokens = spec.model.max_prompt_tokens
        self._reset_takes_problem = "problem" in inspect.signature(self.env_cls.reset).parameters
        # team envs build their prompts as token ids, with the model's tokenizer
        self._env_takes_tokenizer = "tokenizer" in inspect.signature(self.env_cls.__init__).parameters
        takes_vocab = "vocab_size" in inspect.signature(self.env_cls.__init__).parameters
        self._vocab_size = model_vocab_size(spec.model) if takes_vocab else None
        # why opt-in: tokenizing every legal action of every turn costs time that only the
        # action entropy bonus (study.action_entropy_coef) needs
        self.action_choices = spec.action_choices
        self._choice_ids: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ prompts
    def _encode(self, messages: list[dict]) -> tuple[list[int], bool]:
        """Chat-templated prompt ids; an over-long history is cut from the left, system message kept."""
        return encode_chat(self.tokenizer, messages, self.max_prompt_tokens)

    def _encode_round(self, turns: list[Turn]) -> list[tuple[list[int], bool]]:
        """Each turn's prompt ids and whether they were cut: its env's own ids cut to the budget, else its
        chat encoded (env.batch_encode: the round's chats together, the same ids)."""
        if not self.env_cfg.batch_encode:
            return [self._encode(turn.messages) if turn.prompt_ids is None else self._cut(turn.prompt_ids)
                    for turn in turns]
        chats = [turn.messages for turn in turns if turn.prompt_ids is None]
        encoded = iter(encode_chats(self.tokenizer, chats, self.max_prompt_tokens, threads=True))
        return [next(encoded) if turn.prompt_ids is None else self._cut(turn.prompt_ids) for turn in turns]

    def _cut(self, prompt_ids: list[int]) -> tuple[list[int], bool]:
        """An env's own prompt ids, cut from the left to model.max_prompt_tokens."""
        if len(prompt_ids) <= self.max_prompt_tokens:
            return list(prompt_ids), False
        return list(prompt_ids[-self.max_prompt_tokens:]), True

    def _encode_choices(self, responses: list[str]) -> list[list[int]]:
        """Token ids of each legal action's answer (cached: games repeat their labels), or [] when off."""
        if not self.action_choices:
            return []
        for text in responses:
            if text not in self._choice_ids:
                self._choice_ids[text] = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return [self._choice_ids[text] for text in responses]

    def _template(self, messages: list[dict]) -> list[int]:
        return chat_prompt_ids(self.tokenizer, messages)

    # ------------------------------------------------------------------ rollout
    @register(Dispatch.ONE_TO_ALL)
    def run_episodes(
        self,
        rollout: Any,
        assignments: list[list[EpisodeSpec]],
        step: int,
        greedy: bool = False,
        seats: list[str] | None = None,
    ) -> DataProto:
        """Play this rank's episodes (``assignments[rank]``); returns every model turn as a row.

        ``rollout``: the rollout workers' Cluster (this rank calls its share) or a stand-in ``Generator``.
        ``greedy``: decode greedily (evaluation); else sampled with seeds from (run seed, step, row).
        ``seats`` overrides the seat map (evaluation against a built-in opponent).
        ``meta_info["episodes"]`` holds one summary per episode (returns, env metrics, errors).
        """
        started_at = time.time()  # wall clock: the benchmarks' timeline of rollouts and updates
        specs = assignments[self.rank] if self.rank < len(assignments) else []
        engines: Generator = share_of(rollout, self.rank, self.world_size)  # env worker i drives engine i
        episodes = self._start_episodes(specs, list(seats or self.seats))
        samples: list[TurnSample] = []
        sample_rounds: list[int] = []  # per sample: its round if every round decoded one turn (the row order)
        round_idx = 0
        bar = progress_bar(f"{'eval' if greedy else 'rollout'} step {step}, env worker {self.rank}",
                           len(episodes), "episode")
        finished = 0
        while True:
            for ep in episodes:
                self._play_builtin_turns(ep)
            waiting = [ep for ep in episodes if ep.turn is not None]
            bar.update(len(episodes) - len(waiting) - finished)
            finished = len(episodes) - len(waiting)
            if not waiting:
                break
            self._play_round(engines, waiting, step, greedy, round_idx, samples, sample_rounds)
            round_idx += 1
        # rows in the order of one round per turn, however many turns a round decoded
        samples = [s for _, s in sorted(zip(sample_rounds, samples), key=lambda pair: pair[0])]
        bar.close()
        meta = {
            "episodes": [self._summary(ep) for ep in episodes],
            "rounds": round_idx,
            "step": step,
            "pad_id": self.tokenizer.pad_token_id,
            "started_at": started_at,
            "finished_at": time.time(),
        }
        return collate_turns(samples, self.tokenizer.pad_token_id, meta)

    def _start_episodes(self, specs: list[EpisodeSpec], seat_map: list[str]) -> list[_Episode]:
        """A fresh env per episode, reset to its seed (and problem), in ``seat_map``'s seats."""
        from roll_ma.envs.env_registry import make_env

        kwargs = env_kwargs(self.env_cfg, self.agents, seat_map)
        if self._env_takes_tokenizer:
            kwargs["tokenizer"] = self.tokenizer
        if self._vocab_size is not None:
            kwargs["vocab_size"] = self._vocab_size
        episodes = []
        for spec in specs:
            env = make_env(self.env_cfg.name, **kwargs)
            # why Callable[..., Turn]: envs that play problems (math, workflows) add problem= to reset
            reset: Callable[..., Turn] = env.reset
            turn = reset(spec.seed, problem=spec.problem) if self._reset_takes_problem else reset(spec.seed)
            episodes.append(_Episode(spec, env, turn, random.Random(spec.seed)))
        return episodes

    def _play_round(self, rollout: Generator, waiting: list[_Episode], step: int, greedy: bool,
                    round_idx: int, samples: list[TurnSample], sample_rounds: list[int]) -> None:
        """One round: the rollout workers decode every waiting episode's turn (and the turns it plans), then
        each env steps with its answer; the turns join ``samples``, their rounds ``sample_rounds``."""
        # (episode, its turns to decode now): the current turn, then any it plans (decode_ahead)
        turns = [(ep, k, turn) for ep in waiting
                 for k, turn in enumerate([ep.turn, *self._turns_ahead(ep)])]
        prompts = self._encode_round([turn for _, _, turn in turns])
        request = DataProto.from_dict(
            non_tensors={
                "prompt_ids": [p for p, _ in prompts],
                "agent_id": [self.agent_ids[turn.agent] for _, _, turn in turns],
                "sample_seed": [sample_seed(ep.spec.episode_id, ep.turns_played + k)
                                for ep, k, _ in turns],
            },
        )
        sampling = GenerateRequest(greedy=greedy, seed=self.seed * 1_000_003 + step)
        activity.note(f"{'eval' if greedy else 'rollout'} step {step}: round {round_idx}, "
                      f"asking the rollout workers for {len(turns)} turns of {len(waiting)} episodes")
        out = rollout.generate(request, sampling)
        greedy_texts = self._greedy_texts(rollout, request, sampling)
        activity.note(f"{'eval' if greedy else 'rollout'} step {step}: round {round_idx}, "
                      f"stepping {len(waiting)} envs with the answers")
        mask = out.batch["response_mask"].bool()
        for row, ((ep, k, turn), (prompt_ids, truncated)) in enumerate(zip(turns, prompts)):
            if k > 0 and ep.turn != turn:  # the env planned a turn that its step did not give
                self._refuse_unplanned(ep, turn)
            sample = self._sample(out, row, int(mask[row].sum()), ep, prompt_ids, truncated)
            self._step(ep, sample.response_text, samples, sample,
                       greedy_texts[row] if greedy_texts is not None else None,
                       sample.response_ids if ep.env.takes_response_ids else None)
            sample_rounds.append(round_idx + k)

    def _refuse_unplanned(self, ep: _Episode, turn: Any) -> NoReturn:
        gave = "ended the episode" if ep.turn is None else f"gave {ep.turn}"
        raise RuntimeError(
            f"env {self.env_cfg.name!r} planned turn {ep.turns_played} of episode "
            f"{ep.spec.episode_id} (planned_turns) as {turn}, but step() {gave}: an env may "
            "plan only turns that no reply changes; fix planned_turns or set "
            "env.decode_ahead=false"
        )

    def _sample(self, out: DataProto, row: int, n: int, ep: _Episode, prompt_ids: list[int],
                truncated: bool) -> TurnSample:
        """Row ``row`` of the rollout's answers (its ``n`` response tokens) as episode ``ep``'s turn."""
        return TurnSample(
            prompt_ids=prompt_ids,
            response_ids=out.batch["responses"][row, :n].tolist(),
            rollout_log_probs=out.batch["rollout_log_probs"][row, :n].tolist(),
            agent_id=int(out.non_tensor["agent_id"][row]),
            adapter_version=int(out.non_tensor["adapter_version"][row]),
            episode_id=ep.spec.episode_id,
            group_id=ep.spec.group_id,
            turn=ep.turns_played,
            player=ep.turn.player,
            env_name=self.env_cfg.name,
            response_text=str(out.non_tensor["response_text"][row]),
            prompt_truncated=truncated,
            action_choices=self._encode_choices(ep.turn.action_responses),
        )

    def _turns_ahead(self, ep: _Episode) -> list[Any]:
        """The turns after ``ep.turn`` that its env plans (env.decode_ahead; none when the env shows
        greedy moves, whose turns depend on replies), cut at the turn cap and at a built-in seat."""
        if not self.env_cfg.decode_ahead or self.env_cfg.show_greedy_moves:
            return []
        planned = ep.env.planned_turns() or []
        room = self.env_cfg.max_turns - ep.turns_played - 1  # turns left under env.max_turns
        ahead = []
        for turn in planned[: max(room, 0)]:
            if turn.agent in BUILTIN_POLICIES:  # played locally, in order, between model turns
                break
            ahead.append(turn)
        return ahead

    def _greedy_texts(self, rollout: Generator, request: DataProto,
                      sampling: GenerateRequest) -> list[str] | None:
        """SAD: each row's greedy answer, which the envs show the other players.

        None when off, and for a greedy rollout (evaluation), whose moves are their own greedy
        answers: the envs then show the chosen move, with no second generate call.
        """
        if not self.env_cfg.show_greedy_moves or sampling.greedy:
            return None
        greedy = dataclasses.replace(sampling, greedy=True)
        return [str(t) for t in rollout.generate(request, greedy).non_tensor["response_text"]]

    def _play_builtin_turns(self, ep: _Episode) -> None:
        while ep.turn is not None and ep.turn.agent in BUILTIN_POLICIES:
            self._step(ep, ep.env.builtin_action(ep.turn.agent, ep.rng), None, None)

    def _step(
        self,
        ep: _Episode,
        text: str,
        samples: list[TurnSample] | None,
        sample: TurnSample | None,
        greedy_text: str | None = None,
        response_ids: list[int] | None = None,
    ) -> None:
        player, agent = ep.turn.player, ep.turn.agent
        # why: given only under env.show_greedy_moves, which validation allows only for envs taking it
        extra: dict[str, Any] = {"greedy_text": greedy_text} if greedy_text is not None else {}
        if response_ids is not None:  # team envs: post_process hooks work on token ids
            extra["response_ids"] = response_ids
        result = ep.env.step(text, **extra)
        if sample is not None and samples is not None:
            sample.format_error = bool(result.info.get("format_error", False))
            sample.reward_class = str(result.info.get("reward_class", ""))
            sample.reward += ep.carry.pop(player, 0.0)
            ep.last_sample[player] = len(samples)
            samples.append(sample)
            ep.model_turns[agent] += 1
            ep.format_errors[agent] += int(sample.format_error)
        # a reward reaches the player's latest turn: turn-level credit, discounted later per agent
        for p, r in enumerate(result.rewards):
            if r:
                if p in ep.last_sample and samples is not None:
                    samples[ep.last_sample[p]].reward += float(r)
                else:
                    ep.carry[p] += float(r)
        ep.turns_played += 1
        ep.turn = result.next_turn
        if not result.done and ep.turns_played >= self.env_cfg.max_turns:
            ep.turn, ep.truncated = None, True
        if ep.turn is None and samples is not None and ep.last_sample:
            samples[max(ep.last_sample.values())].done = True

    def _summary(self, ep: _Episode) -> dict[str, Any]:
        return {
            "episode_id": ep.spec.episode_id,
            "group_id": ep.spec.group_id,
            "seed": ep.spec.seed,
            "seat_agents": list(ep.env.seat_agents),
            "returns": list(ep.env.episode_returns()),
            "metrics": dict(ep.env.episode_metrics()),
            "turns": ep.turns_played,
            "truncated": ep.truncated,
            "model_turns": dict(ep.model_turns),
            "format_errors": dict(ep.format_errors),
        }
