"""Which rows go into which micro-batch: by row count, or by a token budget that follows memory.

A micro-batch's activation memory grows with the tokens it runs: rows x padded width when rows
are padded to a common width (prompt left-padded to its longest, response right-padded to its
longest), or the sum of the rows' lengths when they are packed without padding. With a token
budget, rows are sorted by length and packed first-fit, so long rows go a few at a time and
short rows many at a time, and similar lengths share a micro-batch (little padding).

With ``train.share_prompt_prefix`` (decided by the run plan: ``config/run_plan.py:prompt_sharing``; by
default wherever rows are packed) the rows of one group (same agent, and the same prompt or, samples of
one history, a common prompt prefix: ``packing.prompt_groups``) run their shared prompt once
(``models/shared_prefix.py``): a budget counts it once (the caller gives each row's shared prefix and its
rest: ``packing.shared_lengths``), and a group goes into one micro-batch whole when it fits (else into
pieces that each carry it).

Data parallel: every rank plans the same mini-batch the same way (it is a pure function of the
rows), takes every ``world_size``-th micro-batch, and all ranks run the same number of
micro-batches (ZeRO-2 reduces gradients inside every backward); a rank short of one runs an
empty micro-batch (a placeholder row with no weight).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from roll_ma.config.schema import TrainConfig
from roll_ma.packing import balanced_shares, shared_prompt_tokens


@dataclass(frozen=True)
class MicroBatching:
    """How rows are split into micro-batches and run.

    Args:
        max_rows: rows per micro-batch when there is no token budget.
        max_tokens: token budget of one micro-batch (None: ``max_rows`` rows).
        remove_padding: rows are packed into one sequence (the budget counts real tokens).
        chunk_tokens: response tokens per LM-head chunk (``models.logprobs.head_log_probs``).
        share_prefix: rows of one prompt group run the prompt once (needs ``remove_padding``; only
            where the caller passes the rows' groups).
    """

    max_rows: int
    max_tokens: int | None = None
    remove_padding: bool = False
    chunk_tokens: int = 1024
    share_prefix: bool = False

    @classmethod
    def for_training(cls, cfg: TrainConfig) -> MicroBatching:
        """The update's batching (``cfg``: as the workers run it, ``share_prompt_prefix`` true or false:
        ``RunPlan.worker_train_config``)."""
        return cls(cfg.micro_batch_size, cfg.max_tokens_per_micro_batch, cfg.remove_padding,
                   cfg.logits_chunk_tokens, _shares(cfg))

    @classmethod
    def for_scoring(cls, cfg: TrainConfig) -> MicroBatching:
        """Forward-only scoring (old and reference log-probs): its own, usually larger, budget."""
        budget = cfg.score_max_tokens_per_micro_batch or cfg.max_tokens_per_micro_batch
        return cls(cfg.micro_batch_size, budget, cfg.remove_padding, cfg.logits_chunk_tokens, _shares(cfg))

    def sharing(self, groups: np.ndarray | None) -> bool:
        """Whether rows with these groups share their prompts (the switch on, packed rows, groups known)."""
        return groups is not None and self.share_prefix and self.remove_padding

    def cost(self, prompt_lens: np.ndarray, response_lens: np.ndarray,
             groups: np.ndarray | None = None) -> int:
        """Tokens a micro-batch of these rows runs: packed length (each group's prompt once when they
        share), or rows x padded width. groups: (n,) the rows' prompt groups, or None. With shared prompts
        the caller gives each row's shared prefix as its prompt and the rest as its response
        (``packing.shared_lengths``: a group of rows that branch from one history shares its prefix)."""
        if len(prompt_lens) == 0:
            return 0
        if self.remove_padding:
            shared = groups is not None and self.sharing(groups)
            saved = shared_prompt_tokens(prompt_lens, groups) if shared and groups is not None else 0
            return int(prompt_lens.sum() + response_lens.sum()) - saved
        return len(prompt_lens) * int(prompt_lens.max() + response_lens.max())

    def split(self, rows: np.ndarray, prompt_lens: np.ndarray, response_lens: np.ndarray,
              groups: np.ndarray | None = None) -> list[np.ndarray]:
        """Micro-batches (arrays of row indices) covering ``rows`` once each.

        rows: (n,) row indices; prompt_lens, response_lens: real tokens of EVERY row (indexed by
        row index); groups: the prompt group of EVERY row, or None. Without a budget: consecutive
        chunks of ``max_rows``. With one: longest items first, each into the first micro-batch it
        fits (an item longer than the budget runs alone). An item is a row, or with shared prompts a
        prompt group (``_items``).
        """
        rows = np.asarray(rows, dtype=np.int64)
        if self.max_tokens is None:
            return [rows[i : i + self.max_rows] for i in range(0, len(rows), self.max_rows)]
        items = self._items(rows, prompt_lens, response_lens, groups)
        costs = [self._cost_of(item, prompt_lens, response_lens, groups) for item in items]
        bins: list[np.ndarray] = []
        for k in np.argsort(-np.asarray(costs), kind="stable").tolist():
            for j, b in enumerate(bins):
                trial = np.concatenate([b, items[k]])
                if self._cost_of(trial, prompt_lens, response_lens, groups) <= self.max_tokens:
                    bins[j] = trial
                    break
            else:
                rest = self._fill(bins, items[k], prompt_lens, response_lens, groups)
                if len(rest):
                    bins.append(rest)
        return bins

    def _fill(self, bins: list[np.ndarray], item: np.ndarray, prompt_lens: np.ndarray,
              response_lens: np.ndarray, groups: np.ndarray | None) -> np.ndarray:
        """A prompt group over half the budget that fits no micro-batch whole: its rows fill the room
        left in ``bins`` (in place; each piece carries the prompt again), since such groups would run
        one to a micro-batch, up to half of it empty (smaller ones waste little: they stay whole).
        Returns the rows left over. Rows alone (no sharing) are never split: all of ``item`` comes back."""
        if not self.sharing(groups) or self.max_tokens is None:
            return item
        if 2 * self._cost_of(item, prompt_lens, response_lens, groups) <= self.max_tokens:
            return item
        rest = item
        for j, b in enumerate(bins):
            n = 0
            while n < len(rest) and self._cost_of(
                np.concatenate([b, rest[: n + 1]]), prompt_lens, response_lens, groups
            ) <= self.max_tokens:
                n += 1
            if n:
                bins[j], rest = np.concatenate([b, rest[:n]]), rest[n:]
            if not len(rest):
                break
        return rest

    def _cost_of(self, rows: np.ndarray, prompt_lens: np.ndarray, response_lens: np.ndarray,
                 groups: np.ndarray | None) -> int:
        return self.cost(prompt_lens[rows], response_lens[rows], groups[rows] if groups is not None else None)

    def _items(self, rows: np.ndarray, prompt_lens: np.ndarray, response_lens: np.ndarray,
               groups: np.ndarray | None) -> list[np.ndarray]:
        """What the budget packs: each row alone, or with shared prompts each group's rows together,
        in pieces that fit the budget when the whole group does not (each piece carries the shared prompt)."""
        if not self.sharing(groups) or self.max_tokens is None:
            return [rows[i : i + 1] for i in range(len(rows))]
        assert groups is not None  # sharing() checked it
        items: list[np.ndarray] = []
        for g in dict.fromkeys(groups[rows].tolist()):
            members = rows[groups[rows] == g]
            members = members[np.argsort(-response_lens[members], kind="stable")]
            piece: list[int] = []
            for r in members.tolist():
                if piece and int(prompt_lens[r] + response_lens[piece + [r]].sum()) > self.max_tokens:
                    items.append(np.asarray(piece, dtype=np.int64))
                    piece = []
                piece.append(r)
            items.append(np.asarray(piece, dtype=np.int64))
        return items

    def rank_plan(
        self, rows: np.ndarray, prompt_lens: np.ndarray, response_lens: np.ndarray, rank: int,
        world_size: int, groups: np.ndarray | None = None,
    ) -> list[np.ndarray]:
        """This rank's micro-batches of a mini-batch; every rank gets the same count (some may be empty).

        Without a budget the rows are first split evenly over the ranks (the first ranks take one
        more when they do not divide), as data parallel always did; with one, the rows are first
        dealt to the ranks so that each rank's real tokens are as even as can be
        (``packing.balanced_shares``), then each rank packs its own rows into micro-batches. (Dealing
        whole micro-batches instead left one rank a micro-batch more than the other whenever their
        number was odd: a 2-GPU update ran ~1.4x the 1-GPU one per agent.) With shared prompts the
        dealt items are prompt groups (or their pieces), so a group's prompt stays on one rank.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if self.max_tokens is None:
            share = np.array_split(rows, world_size)
            per_rank = -(-len(share[0]) // self.max_rows)  # the first share is the largest
            mine = self.split(share[rank], prompt_lens, response_lens)
            return mine + [np.zeros(0, dtype=np.int64)] * (per_rank - len(mine))
        items = self._items(rows, prompt_lens, response_lens, groups)
        costs = np.asarray([self._cost_of(item, prompt_lens, response_lens, groups) for item in items])
        shares = [np.concatenate([items[k] for k in s]) if len(s) else np.zeros(0, dtype=np.int64)
                  for s in balanced_shares(costs, world_size)]
        plans = [self.split(s, prompt_lens, response_lens, groups) for s in shares]
        count = max(len(p) for p in plans)
        return plans[rank] + [np.zeros(0, dtype=np.int64)] * (count - len(plans[rank]))


def real_lengths(attention_mask: np.ndarray | object, response_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(N,) real prompt tokens and (N,) real response tokens of (N, T) rows whose last
    ``response_len`` columns are the response."""
    mask = np.asarray(attention_mask).astype(bool)
    split = mask.shape[1] - response_len
    return mask[:, :split].sum(1).astype(np.int64), mask[:, split:].sum(1).astype(np.int64)


def _shares(cfg: TrainConfig) -> bool:
    """The resolved ``share_prompt_prefix`` of a worker's train config (auto is decided by the run plan)."""
    if cfg.share_prompt_prefix == "auto" and cfg.remove_padding:  # padded rows have no prompt to share
        raise ValueError("train.share_prompt_prefix=auto reaches a worker undecided: give it the run plan's "
                         "choice (RunPlan.worker_train_config)")
    return cfg.share_prompt_prefix is True and cfg.remove_padding
