"""Shared episode mechanics of every OpenSpiel game env.

A subclass names the game and renders it as text (rules, observation, action labels) and
gives a scripted policy; this class does the rest: chance nodes (sampled with the episode
rng), seats -> agents, parsing with the format penalty and fallback, turn-level rewards
(each step's reward is the change of each player's `state.returns()`), and metrics.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from roll_ma.envs.base import MultiAgentEnv, StepResult, Turn, check_seat_agents
from roll_ma.envs.parsing import ActionParser, check_fallback, fallback_rng

if TYPE_CHECKING:
    from roll_ma.algorithms.game_tree import GameTree, InfoSet


class OpenSpielEnv(MultiAgentEnv):
    """Base class of the OpenSpiel game envs (turn-based, sequential games only).

    Args:
        seat_agents: Agent name per seat ("random" / "scripted" for built-in opponents).
        system_prompts: Optional system prompt per agent name, replacing the rules prompt.
        fallback: "random" (apply a random legal action, reproducible from the episode seed
            and turn) or "end" (end the episode) when an output does not parse. Either way
            `info["fallback"]` is True and `info["format_error_kind"]` says "no_answer" or
            "illegal_action".
        format_penalty: Added to the offender's reward on a format error.
        answer_tags, answer_pattern, answer_template: Answer format, see `ActionParser`.
    """

    game_name: str = ""
    has_action_choices = True

    def __init__(
        self,
        *,
        seat_agents: list[str] | None = None,
        system_prompts: dict[str, str] | None = None,
        fallback: str = "random",
        format_penalty: float = -1.0,
        answer_tags: tuple[str, str] | list[str] = ("<answer>", "</answer>"),
        answer_pattern: str | None = None,
        answer_template: str | None = None,
    ):
        import pyspiel  # why: imported here so `roll_ma.envs` loads without OpenSpiel

        self.game = pyspiel.load_game(self.game_name, self.game_params())
        if self.game.get_type().dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
            raise ValueError(f"{self.game_name} is not a turn-based game")
        self.num_players = self.game.num_players()
        self.seat_agents = check_seat_agents(seat_agents, self.num_players, self.game_name)
        self.system_prompts = dict(system_prompts or {})
        self.fallback = check_fallback(fallback)
        self.format_penalty = float(format_penalty)
        self.parser = ActionParser(answer_tags, answer_pattern, answer_template)
        self.min_utility = self.game.min_utility()
        self.max_utility = self.game.max_utility()
        self._state: Any = None  # the pyspiel state of the episode (pyspiel has no types); None before reset
        self._rules_text: str | None = None

    # ---- hooks for subclasses -------------------------------------------------------
    def game_params(self) -> dict:
        """Parameters passed to `pyspiel.load_game`."""
        return {}

    def rules_prompt(self) -> str:
        """Default system prompt: a short rules summary and the answer format."""
        return f"You play {self.game_name}. Answer with {self.parser.wrap('ACTION')}."

    def render_observation(self, state, player: int) -> str:
        """What `player` sees, as text."""
        return state.observation_string(player)

    def action_label(self, state, player: int, action: int) -> str:
        """The string shown to (and expected from) the model for `action`."""
        return state.action_to_string(player, action)

    def scripted_action(self, state, player: int, rng: random.Random) -> int:
        """The action id a simple heuristic picks; default: uniformly random."""
        return rng.choice(state.legal_actions())

    def extra_metrics(self, state) -> dict[str, float]:
        """Game-specific episode metrics."""
        return {}

    # ---- the protocol ---------------------------------------------------------------
    def reset(self, seed: int) -> Turn:
        self._seed = int(seed)
        self._rng = random.Random(self._seed)
        self._state = self.game.new_initial_state()
        self._turn_index = 0
        self._returns = [0.0] * self.num_players
        self._format_errors = [0] * self.num_players
        self._fallbacks = 0
        self._ended_by_format_error = False
        self._done = False
        self.history: list[tuple[int, str]] = []  # (player, applied action label)
        # why: SAD shows the other players each move's greedy label next to the sampled one;
        # None where no greedy answer was given or it did not parse
        self.greedy_history: list[str | None] = []
        self._resolve_chance()
        return self._make_turn()

    def step(self, action_text: str, greedy_text: str | None = None) -> StepResult:
        if self._state is None or self._done:
            raise RuntimeError("step() called on a finished episode; call reset(seed) first")
        state = self._state
        player = state.current_player()
        labels = list(self._legal)
        parsed = self.parser.parse(action_text, labels)
        format_error = parsed.error is not None
        action, used_fallback = parsed.action, False
        if format_error:
            self._format_errors[player] += 1
            used_fallback = True
            self._fallbacks += 1
            if self.fallback == "random":
                action = fallback_rng(self._seed, self._turn_index).choice(labels)
        before = state.returns()
        if action is not None:
            greedy = self.parser.parse(greedy_text, labels).action if greedy_text is not None else None
            state.apply_action(self._legal[action])
            self.history.append((player, action))
            self.greedy_history.append(greedy)
            self._resolve_chance()
        after = state.returns()
        rewards = [float(a - b) for a, b in zip(after, before, strict=True)]
        if format_error:
            rewards[player] += self.format_penalty
        for i, r in enumerate(rewards):
            self._returns[i] += r
        self._turn_index += 1
        self._ended_by_format_error = format_error and action is None
        self._done = state.is_terminal() or self._ended_by_format_error
        info = {
            "format_error": format_error,
            "format_error_kind": parsed.error,
            "action": action,
            "fallback": used_fallback,
            "answer_text": parsed.answer_text,
            "player": player,
        }
        return StepResult(rewards, self._done, info, None if self._done else self._make_turn())

    def episode_returns(self) -> list[float]:
        return list(self._returns)

    def episode_metrics(self) -> dict[str, float]:
        game_returns = self._state.returns()
        metrics = {
            "turns": float(self._turn_index),
            "format_errors": float(sum(self._format_errors)),
            "fallbacks": float(self._fallbacks),
            "ended_by_format_error": float(self._ended_by_format_error),
            "finished": float(self._state.is_terminal()),
        }
        pairs = [(g, a) for g, (_, a) in zip(self.greedy_history, self.history, strict=True) if g is not None]
        if pairs:  # how often the sampled move was the greedy one (1.0 once a policy is settled)
            metrics["greedy_agreement"] = sum(g == a for g, a in pairs) / len(pairs)
        for i in range(self.num_players):
            metrics[f"game_return_p{i}"] = float(game_returns[i])
            metrics[f"format_errors_p{i}"] = float(self._format_errors[i])
        metrics.update(self.extra_metrics(self._state))
        return metrics

    def builtin_action(self, policy: str, rng: random.Random) -> str:
        state = self._state
        player = state.current_player()
        if policy == "random":
            label = rng.choice(list(self._legal))
        elif policy == "scripted":
            label = self.action_label(state, player, self.scripted_action(state, player, rng))
        else:
            raise ValueError(f"Unknown built-in policy {policy!r}; use 'random' or 'scripted'")
        return self.parser.wrap(label)

    # ---- helpers ----------------------------------------------------------------------
    @property
    def state(self):
        """The current OpenSpiel state (read it, do not change it)."""
        return self._state

    @property
    def current_action_ids(self) -> dict[str, int]:
        """Legal action label -> OpenSpiel action id for the current turn."""
        return dict(self._legal)

    def _resolve_chance(self) -> None:
        state = self._state
        while state.is_chance_node():
            outcomes = state.chance_outcomes()
            ids = [a for a, _ in outcomes]
            probs = [p for _, p in outcomes]
            state.apply_action(self._rng.choices(ids, probs)[0])

    def _make_turn(self) -> Turn:
        turn = self.turn_at(self._state)
        self._legal = dict(zip(turn.legal_actions, self._state.legal_actions(), strict=True))
        assert len(self._legal) == len(turn.legal_actions), "action labels must be unique"
        return turn

    def game_tree(self, max_paths: int = 20_000) -> tuple[GameTree, dict[InfoSet, Turn]]:
        """The whole tree for joint policy search: terminal paths and the turn of every information set.

        An information set is what the acting seat is shown: (player, its prompt). That is all a
        model conditions on, so two histories with the same prompt are one decision for it.

        Raises:
            ValueError: the game is not common-payoff, its observation quotes the episode
                (greedy moves shown), or it has more than ``max_paths`` terminal histories.
        """
        import pyspiel

        from roll_ma.algorithms.game_tree import GameTree, TerminalPath

        game = self.game
        if game.get_type().utility != pyspiel.GameType.Utility.IDENTICAL:
            raise ValueError(f"joint search needs a common-payoff game; {self.game_name} is "
                             f"{game.get_type().utility.name.lower().replace('_', '-')}")
        bound = max(game.num_distinct_actions(), game.max_chance_outcomes()) ** game.max_game_length()
        if bound > max_paths:
            raise ValueError(f"{self.game_name} may have up to {bound:.3g} terminal histories (more than "
                             f"{max_paths}); joint search enumerates the whole tree and is for small games")
        if getattr(self, "show_greedy_moves", False):
            raise ValueError("joint search needs prompts that depend on the game state alone; "
                             "env.show_greedy_moves adds the episode's greedy moves")
        paths: list[TerminalPath] = []
        turns: dict[InfoSet, Turn] = {}
        # (state, chance probability, moves so far: (information set, action index) each)
        stack: list[tuple[Any, float, tuple[tuple[tuple, int], ...]]] = [(game.new_initial_state(), 1.0, ())]
        while stack:
            state, chance, moves = stack.pop()
            if state.is_terminal():
                paths.append(TerminalPath(chance, moves, float(state.returns()[0])))
                if len(paths) > max_paths:
                    raise ValueError(f"{self.game_name} has more than {max_paths} terminal histories; "
                                     "joint search enumerates the whole tree and is for small games")
            elif state.is_chance_node():
                for action, prob in reversed(state.chance_outcomes()):
                    stack.append((state.child(action), chance * prob, moves))
            else:
                turn = self.turn_at(state)
                key = (turn.player, tuple(m["content"] for m in turn.messages))
                turns.setdefault(key, turn)
                for index, action in reversed(list(enumerate(state.legal_actions()))):
                    stack.append((state.child(action), chance, (*moves, (key, index))))
        tree = GameTree(paths, {k: t.player for k, t in turns.items()},
                        {k: len(t.legal_actions) for k, t in turns.items()})
        return tree, turns

    def turn_at(self, state) -> Turn:
        """The turn the acting player sees at ``state`` (any state of this game; the episode is untouched).

        For inspection (e.g. scoring a trained policy at every information set). Games whose
        observation text quotes the episode's recent moves (Hanabi) quote the current episode's.
        """
        player = state.current_player()
        agent = self.seat_agents[player]
        system = self.system_prompts.get(agent)
        if system is None:
            if self._rules_text is None:  # why: fixed per env; built once
                self._rules_text = self.rules_prompt()
            system = self._rules_text
        legal = [self.action_label(state, player, a) for a in state.legal_actions()]
        user = self.render_observation(state, player) + "\nLegal actions: " + ", ".join(legal)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return Turn(player=player, agent=agent, messages=messages, legal_actions=legal,
                    action_responses=[self.parser.wrap(label) for label in legal])
