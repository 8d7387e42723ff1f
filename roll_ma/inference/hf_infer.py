"""Rollout with transformers + PEFT: one model holding every agent's adapter.

A generate call serves rows of different agents together: PEFT routes each row through
its own adapter (``adapter_names=[...]``, eval mode only). Sampling is seeded per row by
turning HF's greedy search into Gumbel-max sampling (temperature and top-p first, then
noise from a generator of that row), so a row's sample depends on its seed alone, not on
the rows beside it. Log-probs are recomputed with the same forward pass the trainer uses
(``response_log_probs``), so rollout and trainer numbers agree up to float noise.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from roll_ma.config.schema import ModelConfig, RolloutConfig
from roll_ma.distributed.tensor_transfer import as_tensor_dict
from roll_ma.inference.infer_backend import InferBackend, RolloutTraits, SleepLevel
from roll_ma.inference.rollout_common import (
    RowResult,
    SamplingSettings,
    adapters_of_rows,
    check_sleep_level,
    fallback_rng,
    pack_generation,
    pack_scores,
    request_rows,
    response_text,
    row_seeds,
    sampling_settings,
    stop_token_index,
)
from roll_ma.models.adapters import AdapterSpec, AgentSpec, inject_adapters, load_adapter_state_dict
from roll_ma.models.loading import load_base_model, load_tokenizer
from roll_ma.models.logprobs import response_log_probs, token_log_probs
from roll_ma.packing import left_pad
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import GenerateRequest


class _RowSampler:
    """A logits processor that makes greedy search sample: argmax(logits / T, top-p masked, + Gumbel noise).

    Each row draws its noise from its own generator, one draw per step, so the token of row i
    at step t depends only on (seed_i, t) and the logits of row i.
    """

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float):
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.temperature = temperature
        self.top_p = top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logits = scores.float() / self.temperature  # (b, V)
        if self.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            # keep the smallest set of tokens whose probability reaches top_p
            drop_sorted = cum - sorted_logits.softmax(-1) >= self.top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        vocab = logits.shape[-1]
        # exponential noise E: argmax(logits - log E) is a sample of softmax(logits)
        noise = torch.stack([torch.empty(vocab).exponential_(generator=g) for g in self.generators])
        return logits - noise.to(logits.device).log()


class HFInferStrategy:
    """Rollout backend on transformers + PEFT (CPU tests, laptops, small GPUs).

    Args:
        model_cfg: the base model.
        rollout_cfg: sampling defaults and ``micro_batch_size`` (rows per generate call).
        agents: agent specs (``agent_id`` -> adapter name).
        adapters: the adapters to hold, initialised like the trainer's (``inject_adapters(..., seed)``);
            none (with no agents): the base model answers every row (a teacher).
        seed: the run seed (adapter init; unseeded requests draw row seeds from it and the rank).
        device: "cpu" or "cuda".
    """

    traits = RolloutTraits()  # any device and dtype, one device per engine, full weights too

    def __init__(
        self,
        model_cfg: ModelConfig,
        rollout_cfg: RolloutConfig,
        agents: list[AgentSpec],
        adapters: list[AdapterSpec],
        seed: int,
        device: str,
    ):
        if bool(adapters) != bool(agents):
            raise ValueError("the rollout needs agents and their adapters, or neither (a base-model teacher)")
        self.model_cfg, self.rollout_cfg = model_cfg, rollout_cfg
        self.agents, self.adapters = list(agents), list(adapters)
        self.seed, self.device = seed, device
        self.model: Any = None
        self.tokenizer: Any = None
        self._versions = {a.name: 0 for a in self.adapters}
        self._asleep = False
        self._rng = fallback_rng(seed)

    # ------------------------------------------------------------------ setup
    def initialize(self, initial_adapters: bool = True) -> None:
        """Load the base with every adapter (version 0 = the trainer's init; the PEFT model needs the
        adapters' modules either way, so ``initial_adapters`` changes nothing here)."""
        self.tokenizer = load_tokenizer(self.model_cfg)
        base = load_base_model(self.model_cfg, self.device)
        self.model = inject_adapters(base, self.adapters, self.seed) if self.adapters else base
        self.model.eval()  # PEFT's mixed-adapter batches work in eval mode only
        gen_eos = self.model.generation_config.eos_token_id
        gen_eos = gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else []
        self._eos_ids = sorted({self.tokenizer.eos_token_id, *gen_eos} - {None})

    # ------------------------------------------------------------------ generate
    @torch.no_grad()
    def generate(self, data: DataProto, request: GenerateRequest) -> DataProto:
        """Sample a response for every row with its agent's adapter (layout: ``rollout_common``)."""
        self._check_ready()
        settings = sampling_settings(self.rollout_cfg, request)
        prompts, names = request_rows(data, self.agents)
        seeds = row_seeds(data, settings, self._rng)
        rows: list[RowResult] = []
        mb = self.rollout_cfg.micro_batch_size
        for start in range(0, len(prompts), mb):
            sl = slice(start, start + mb)
            rows.extend(self._generate_micro_batch(prompts[sl], names[sl], seeds[sl], settings))
        return pack_generation(data, prompts, rows, self.tokenizer.pad_token_id)

    def _generate_micro_batch(
        self, prompts: list[list[int]], names: list[str | None], seeds: list[int], settings: SamplingSettings
    ) -> list[RowResult]:
        from transformers import GenerationConfig, LogitsProcessorList

        pad = self.tokenizer.pad_token_id
        ids, mask = left_pad(prompts, pad)  # (b, P) each
        # every generation field set here: transformers fills unset ones from the model's
        # generation_config (e.g. Qwen's repetition_penalty), which would change the distribution
        gen_cfg = GenerationConfig(
            max_new_tokens=settings.max_new_tokens,
            do_sample=False,
            num_beams=1,
            temperature=1.0,
            top_p=1.0,
            top_k=50,
            repetition_penalty=1.0,
            eos_token_id=self._eos_ids,
            pad_token_id=pad,
        )
        extra: dict[str, Any] = {}
        if not settings.greedy:
            extra["logits_processor"] = LogitsProcessorList(
                [_RowSampler(seeds, settings.temperature, settings.top_p)]
            )
        if settings.stop:
            extra.update(stop_strings=list(settings.stop), tokenizer=self.tokenizer)
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            generation_config=gen_cfg,
            **({"adapter_names": list(names)} if self.adapters else {}),
            output_logits=True,
            return_dict_in_generate=True,
            **extra,
        )
        generated = out.sequences[:, ids.shape[1] :]  # (b, <=max_new_tokens)
        # log pi(token) from the raw logits generate already computed: no second forward pass. The KV-cached
        # path differs from the trainer's full forward only by float rounding (~1e-6 in fp32).
        logits = torch.stack(out.logits, dim=1).float()  # (b, n, V) raw, before any processor
        step_log_probs = token_log_probs(logits / settings.logprob_temperature, generated.to(logits.device))
        responses, finish, log_probs = [], [], []
        for toks, lps in zip(generated.cpu().tolist(), step_log_probs.cpu().tolist(), strict=True):
            toks, reason = self._cut(toks, settings)
            responses.append(toks)
            finish.append(reason)
            log_probs.append(lps[: len(toks)])
        versions = self._versions_of(names)
        return [
            RowResult(r, lp, response_text(self.tokenizer, r, settings.stop), f, v)
            for r, lp, f, v in zip(responses, log_probs, finish, versions, strict=True)
        ]

    def _cut(self, toks: list[int], settings: SamplingSettings) -> tuple[list[int], str]:
        """The response up to and including its EOS or the token completing a stop string."""
        eos = next((i for i, t in enumerate(toks) if t in self._eos_ids), None)
        if eos is not None:
            toks = toks[: eos + 1]
        stop = stop_token_index(self.tokenizer, toks, settings.stop) if settings.stop else None
        if stop is not None:
            return toks[: stop + 1], "stop"
        if eos is not None:
            return toks, "stop"
        return toks[: settings.max_new_tokens], "length"

    # ------------------------------------------------------------------ score
    @torch.no_grad()
    def score(self, data: DataProto, temperature: float = 1.0) -> DataProto:
        """(B, R) log-probs of the given responses under each row's current adapter (the freshness check)."""
        self._check_ready()
        if temperature <= 0:
            raise ValueError(f"score: temperature must be > 0, got {temperature}")
        for key in ("input_ids", "attention_mask", "responses", "response_mask"):
            if key not in data.batch.keys():
                raise ValueError(f"score: the batch lacks {key!r}; it has {list(data.batch.keys())}")
        names = adapters_of_rows(data, self.agents)
        resp_len = data.batch["responses"].shape[1]
        out = torch.zeros(len(data), resp_len, dtype=torch.float32)  # (B, R)
        mb = self.rollout_cfg.micro_batch_size
        for start in range(0, len(data), mb):
            sl = slice(start, start + mb)
            ids = data.batch["input_ids"][sl].to(self.device)  # (b, T)
            mask = data.batch["attention_mask"][sl].to(self.device)  # (b, T)
            by_adapter: dict[str, Any] = {"adapter_names": names[sl]} if self.adapters else {}
            lp, _ = response_log_probs(self.model, ids, mask, resp_len, temperature=temperature, **by_adapter)
            out[sl] = lp.float().cpu()
        return pack_scores(data, out, self._versions_of(names))

    # ------------------------------------------------------------------ adapters
    def _versions_of(self, names: list[str | None]) -> list[int]:
        """Each row's adapter version; 0 for a row the base model answers (no adapter)."""
        return [self._versions.get(n, 0) if n is not None else 0 for n in names]

    def update_adapters(self, tensors: dict[str, Any], version: int) -> dict[str, float]:
        """Copy new adapter weights (tensors or ``PackedTensors``) into the model in place; seconds per
        adapter."""
        self._check_ready()
        unknown = sorted(set(tensors) - set(self._versions))
        if unknown:
            raise ValueError(
                f"update_adapters: unknown adapters {unknown}; this rollout serves {sorted(self._versions)}"
            )
        timings = {}
        for name, state in tensors.items():
            t0 = time.perf_counter()
            load_adapter_state_dict(self.model, name, as_tensor_dict(state))
            self._versions[name] = int(version)
            timings[name] = time.perf_counter() - t0
        return timings

    def adapter_versions(self) -> dict[str, int]:
        return dict(self._versions)

    # ------------------------------------------------------------------ colocation
    def sleep(self, level: SleepLevel = 1) -> None:
        """Free the GPU for training: the model moves to CPU (a no-op on CPU). kv_cache: a no-op, as HF
        generate keeps no KV cache between calls."""
        check_sleep_level(level)
        if self.device == "cpu" or self._asleep or level == "kv_cache":
            return
        self.model.to("cpu")
        torch.cuda.empty_cache()
        self._asleep = True

    def wake_up(self) -> None:
        if not self._asleep:
            return
        self.model.to(self.device)
        self._asleep = False

    def shutdown(self) -> None:
        self.model = None

    def _check_ready(self) -> None:
        if self.model is None:
            raise RuntimeError("HFInferStrategy: call initialize() first")
        if self._asleep:
            raise RuntimeError("HFInferStrategy is asleep: call wake_up() before generating or updating")


if TYPE_CHECKING:  # mypy checks that the class is a InferBackend (the worker calls it only through that)
    _conforms: type[InferBackend] = HFInferStrategy
