"""Which episodes each step plays: GRPO groups of seeds (games) or problems (math), and eval sets.

Everything is derived from (seed, step) or from the dataset cursor, so a resumed run plays
exactly the episodes the uninterrupted run would have played.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any

from roll_ma.config.schema import EnvConfig
from roll_ma.envs.env_registry import env_uses_problems
from roll_ma.workers.env_worker import EpisodeSpec

if TYPE_CHECKING:
    from roll_ma.data import MathDataset


def _seed(*parts: Any) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode()) & 0x7FFFFFFF


class EpisodePlanner:
    """Plans training groups per step and the fixed evaluation set."""

    def __init__(self, env_cfg: EnvConfig, seed: int):
        self.cfg, self.seed = env_cfg, seed
        self.is_workflow = bool(env_cfg.workflow)  # why: a workflow's episodes always start from a task
        self.uses_problems = self.is_workflow or env_uses_problems(env_cfg.name)
        # set when the episodes start from problems (math envs, workflows)
        self.train_data: MathDataset | None = None
        self.eval_problems: list[dict] | None = None
        if self.uses_problems:
            self._load_data()

    def _load_data(self) -> None:
        from roll_ma.data import MathDataset, generate_arithmetic, is_heldout

        data = self.cfg.data
        n_eval = data.num_eval_problems
        if data.eval_source:
            self.eval_problems = self._read(data.eval_source)[:n_eval]
        if data.source.startswith("builtin:"):
            from roll_ma.data.code_tasks import load_task_set

            train, held = load_task_set(data.source.split(":", 1)[1])
            self.eval_problems = self.eval_problems or held[:n_eval]
            self.train_data = MathDataset(train, seed=self.seed)
        elif data.source == "synthetic":
            level = self.cfg.kwargs.get("synthetic_level", data.difficulty)
            # the fixed held-out split: never in training, never in the built-in model's pre-training
            pool = generate_arithmetic(data.num_problems * 2 + n_eval * 40, level=level, seed=self.seed)
            if self.eval_problems is None:
                by_problem = {p["problem"]: p for p in pool if is_heldout(p["problem"])}
                self.eval_problems = list(by_problem.values())[:n_eval]
            held_out = {p["problem"] for p in self.eval_problems}
            train = [p for p in pool if not is_heldout(p["problem"]) and p["problem"] not in held_out]
            self.train_data = MathDataset(train[: data.num_problems], seed=self.seed)
        else:
            records = self._read(data.source)
            self.train_data = MathDataset(records, seed=self.seed)
            if self.eval_problems is None:
                self.eval_problems = records[:n_eval]

    def _read(self, path: str) -> list[dict]:
        """Math records ({problem, answer}); a workflow without a preset or keys gets each record whole."""
        from roll_ma.data import load_math_records, read_rows

        data = self.cfg.data
        plain = data.preset in ("auto", "custom") and not (data.problem_key or data.answer_key)
        if self.is_workflow and plain:
            return read_rows(path)
        return load_math_records(path, **self._file_kwargs())

    def _file_kwargs(self) -> dict[str, Any]:
        data = self.cfg.data
        kwargs: dict[str, Any] = {}
        if data.preset not in ("auto", "custom"):
            kwargs["preset"] = data.preset
        if data.problem_key:
            kwargs["problem_key"] = data.problem_key
        if data.answer_key:
            kwargs["answer_key"] = data.answer_key
        return kwargs

    def train_assignments(self, step: int, num_workers: int) -> list[list[EpisodeSpec]]:
        """groups_per_step groups of group_size episodes, split evenly over the env workers."""
        groups = []
        problems: list[dict] | None = None
        if self.uses_problems:
            assert self.train_data is not None  # loaded in __init__
            problems = self.train_data.next_batch(self.cfg.groups_per_step)
        for g in range(self.cfg.groups_per_step):
            group_id = f"s{step}-g{g}"
            env_seed = _seed(self.seed, "train", step, g)
            groups.append(
                [
                    EpisodeSpec(f"{group_id}-e{k}", group_id, env_seed, problems[g] if problems else None)
                    for k in range(self.cfg.group_size)
                ]
            )
        per_worker = len(groups) // num_workers
        return [sum(groups[w * per_worker : (w + 1) * per_worker], []) for w in range(num_workers)]

    def eval_assignments(self, num_workers: int, tag: str = "eval") -> list[list[EpisodeSpec]]:
        """The fixed evaluation episodes (one per problem, or eval_episodes seeds), round-robin."""
        if self.uses_problems:
            assert self.eval_problems is not None  # loaded in __init__
            specs = [
                EpisodeSpec(f"{tag}-{i}", f"{tag}-{i}", _seed(self.seed, "eval", i), p)
                for i, p in enumerate(self.eval_problems)
            ]
        else:
            specs = [
                EpisodeSpec(f"{tag}-{i}", f"{tag}-{i}", _seed(self.seed, "eval", i))
                for i in range(self.cfg.eval_episodes)
            ]
        return [specs[w::num_workers] for w in range(num_workers)]

    def state_dict(self) -> dict[str, Any]:
        return {"data": self.train_data.state_dict() if self.train_data is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.train_data is not None and state.get("data") is not None:
            self.train_data.load_state_dict(state["data"])
