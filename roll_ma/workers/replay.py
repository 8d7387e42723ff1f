"""Replaying known moves through the env workers: another model's episodes as this run's rows.

A teacher (its own model, maybe its own tokenizer) plays episodes; its rows are in ITS tokens.
``ScriptedRollout`` stands in for the rollout cluster and answers every request row with the text
that was played there (looked up by the row's ``sample_seed``, i.e. its episode and turn), in this
run's tokens. The env workers replay the episodes with it (an env given the same texts plays the
same episode), so the student gets rows whose prompts are rendered and tokenized exactly as its own
rollouts are.
"""

from __future__ import annotations

from typing import Any

from roll_ma.config.schema import ModelConfig
from roll_ma.inference.rollout_common import RowResult, pack_generation, request_rows
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import GenerateRequest
from roll_ma.workers.env_worker import sample_seed


def scripted_texts(batch: DataProto) -> dict[int, str]:
    """sample_seed(episode, turn) -> the text played at that turn, for every row of ``batch``."""
    return {
        sample_seed(str(e), int(t)): str(x)
        for e, t, x in zip(
            batch.non_tensor["episode_id"],
            batch.non_tensor["turn"],
            batch.non_tensor["response_text"],
            strict=True,
        )
    }


class ScriptedRollout:
    """A rollout that answers each row with its scripted text (+ the end-of-turn token); picklable, so the
    env workers receive it in place of the rollout cluster. Rows report adapter version -1."""

    def __init__(self, model_cfg: ModelConfig, texts: dict[int, str]):
        self.model_cfg, self.texts = model_cfg, dict(texts)
        self._tokenizer: Any = None

    def generate(self, data: DataProto, request: GenerateRequest) -> DataProto:
        """Each row's scripted text; ``request`` changes nothing (the texts were played already)."""
        from roll_ma.models.loading import load_tokenizer

        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.model_cfg)
        tok = self._tokenizer
        prompts, _ = request_rows(data, [])
        rows = []
        for seed in data.non_tensor["sample_seed"]:
            if int(seed) not in self.texts:
                raise KeyError(
                    f"no scripted text for sample_seed {int(seed)}: the replay does not follow the "
                    "episodes it was given"
                )
            text = self.texts[int(seed)]
            ids = list(tok(text, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
            rows.append(RowResult(ids, [0.0] * len(ids), text, "stop", -1))
        return pack_generation(data, prompts, rows, tok.pad_token_id)
