"""What a train strategy's policies are made of: LoRA adapters on a shared base, or all base weights.

Both kinds answer the same few questions (which policy an agent trains, its parameters,
how to make it the active one, how to score with it, how to save and load it), so the
train strategies are written once against this small protocol.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from roll_ma.config.schema import ModelConfig
from roll_ma.distributed.shm_transfer import SegmentOwner
from roll_ma.distributed.tensor_transfer import PackedTensors, pack_on_device
from roll_ma.models.adapters import (
    AdapterSpec,
    AgentSpec,
    adapter_parameters,
    adapter_state_dict,
    inject_adapters,
    load_adapter_dir,
    save_adapter,
    set_trainable,
)
from roll_ma.models.loading import load_base_model

FULL_POLICY = "full"  # name of the one policy of full fine-tuning
REFERENCE_SUFFIX = "__ref"  # adapter <name>__ref: the frozen copy of adapter <name> (DPO's reference)


class LoraWeights:
    """Every adapter injected into one base model (PeftModel); a policy is an adapter.

    ``copied``: adapters that also get a frozen copy ``<name>__ref`` of the same shape on the same base
    (never trained, no optimizer; ``snapshot`` fills it), saved and loaded with the checkpoint.
    ``critics``: the value critics' adapters (``training/critic.py``): injected, activated, saved and
    loaded like the agents' adapters, never exported to the rollout engines unless named.
    """

    has_adapters = True

    def __init__(self, model_cfg: ModelConfig, adapters: Sequence[AdapterSpec], seed: int,
                 copied: Sequence[str] = (), critics: Sequence[AdapterSpec] = (),
                 lora_in_model_dtype: bool = False):
        self.model_cfg, self.adapters, self.seed = model_cfg, list(adapters), seed
        self.lora_in_model_dtype = lora_in_model_dtype  # train.lora_compute_dtype=model
        self.critics = list(critics)
        specs = {a.name: a for a in self.adapters}
        self.copies = [dataclasses.replace(specs[name], name=name + REFERENCE_SUFFIX, init_dir=None)
                       for name in copied]
        self.injected = self.adapters + self.copies + self.critics  # every adapter on the base
        self.model: Any = None
        self._lora_params: dict[str, list[torch.nn.Parameter]] | None = None
        self._lora_layers: list[Any] | None = None  # every PEFT LoRA layer, found once (_run_adapter)
        self._export_plans: dict[str, list[tuple[str, torch.nn.Parameter]]] = {}

    def build(self, device: torch.device) -> Any:
        # adapters (and their frozen copies) are injected before any DeepSpeed engine wraps the model
        base = load_base_model(self.model_cfg, str(device), packed_rows=True)
        self.model = inject_adapters(base, self.injected, self.seed)
        if self.lora_in_model_dtype:
            from roll_ma.models.lora_dtype import compute_lora_in_input_dtype

            compute_lora_in_input_dtype(self.model)
        for copy in self.copies:  # a copy starts equal to its adapter (the adapter's init dir included)
            self.snapshot(copy.name.removesuffix(REFERENCE_SUFFIX))
        return self.model

    def reference_copy(self, policy: str) -> str:
        """The name of ``policy``'s frozen copy."""
        name = policy + REFERENCE_SUFFIX
        if name not in {c.name for c in self.copies}:
            raise ValueError(f"adapter {policy!r} has no frozen reference copy; the train workers build one "
                             "per trainable adapter when a DPO phase uses dpo.reference=phase_start or "
                             "iteration_start")
        return name

    def snapshot(self, policy: str) -> None:
        """Copy adapter ``policy``'s current weights into its frozen copy, tensor by tensor."""
        target = self.reference_copy(policy)
        source = adapter_parameters(self.model, policy)
        copies = adapter_parameters(self.model, target)
        # lora_A.<policy>.weight -> lora_A.<policy>__ref.weight (the name sits right after the LoRA part)
        rename = re.compile(rf"\.(lora_\w+?)\.{re.escape(policy)}\.")
        with torch.no_grad():
            for key, param in source.items():
                copies[rename.sub(rf".\1.{target}.", key)].copy_(param)

    def policy_of(self, agent: AgentSpec) -> str:
        return agent.adapter

    def params(self, policy: str) -> list[torch.nn.Parameter]:
        return list(adapter_parameters(self.model, policy).values())

    def _run_adapter(self, policy: str) -> None:
        """Make every LoRA layer run adapter ``policy``, as PEFT's ``set_adapter`` does but without its
        two walks over every module of the model and its requires_grad flips on every layer (roll_ma
        sets requires_grad itself): 38 ms a call at 28 layers on the 2-core CPU (0.4 ms here), paid once
        per agent per step with the GPU idle. The LoRA layers are found once; switching sets what PEFT
        sets."""
        if policy not in self.model.peft_config:
            raise ValueError(f"adapter {policy!r} is not on the model: {sorted(self.model.peft_config)}")
        if self._lora_layers is None:
            from peft.tuners.tuners_utils import BaseTunerLayer

            self._lora_layers = [m for m in self.model.modules() if isinstance(m, BaseTunerLayer)]
        for layer in self._lora_layers:
            layer._active_adapter = [policy]  # what BaseTunerLayer.set_adapter sets (its active_adapters)
        self.model.active_adapter = policy  # PeftModel.set_adapter's
        self.model.base_model.active_adapter = policy  # BaseTuner.set_adapter's

    def activate(self, policy: str | None) -> None:
        """Run adapter ``policy`` and train only it (None: nothing trainable)."""
        if policy is not None:
            self._run_adapter(policy)
        if self._lora_params is None:  # one scan of the parameter names, then flips only
            set_trainable(self.model, None)
            self._lora_params = {a.name: self.params(a.name) for a in self.injected}
        for name, params in self._lora_params.items():
            for p in params:
                p.requires_grad_(name == policy)

    def scoring(self, policy: str | None) -> contextlib.AbstractContextManager:
        """Score with adapter ``policy``, or with every adapter off (None: the base, i.e. the reference)."""
        if policy is None:
            return self.model.disable_adapter()
        self._run_adapter(policy)
        self.activate(None)  # scoring trains nothing
        return contextlib.nullcontext()

    def adapter_tensors(self, names: Sequence[str] | None, packed: bool = False,
                        dtype: str | None = None, shared: SegmentOwner | None = None) -> dict[str, Any]:
        """Adapter name -> its PEFT-format CPU tensors, or (``packed``) one buffer per adapter, cast to
        ``dtype`` (a torch dtype name) when given: a ``PackedTensors`` on the host, or with ``shared``
        a ``SharedTensors`` file that ``shared`` owns (one copy off the GPU, nothing pickled)."""
        known = [a.name for a in self.injected]
        names = list(names) if names is not None else [a.name for a in self.adapters]  # copies: by name
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"unknown adapters {unknown}; adapters are {known}")
        if not packed:
            return {name: adapter_state_dict(self.model, name) for name in names}
        cast = getattr(torch, dtype) if dtype else None
        out = {}
        for name in names:
            buffer, entries = pack_on_device({k: p.detach() for k, p in self._export_plan(name)}, cast)
            out[name] = (shared.put(buffer, entries) if shared is not None
                         else PackedTensors(buffer.cpu().numpy(), entries))
        return out

    def _export_plan(self, name: str) -> list[tuple[str, torch.nn.Parameter]]:
        """(PEFT state-dict key, live parameter) of adapter ``name``, found once: PEFT builds the whole
        model's state dict to name an adapter's tensors, which costs more than the copy at 7B."""
        if name not in self._export_plans:
            from peft import get_peft_model_state_dict

            state = get_peft_model_state_dict(self.model, adapter_name=name)
            by_storage = {p.data_ptr(): p for p in adapter_parameters(self.model, name).values()}
            missing = [k for k, v in state.items() if v.data_ptr() not in by_storage]
            if missing:
                raise RuntimeError(f"adapter {name!r}: state-dict tensors {missing[:3]} are no parameter's "
                                   "data")
            self._export_plans[name] = [(k, by_storage[v.data_ptr()]) for k, v in state.items()]
        return self._export_plans[name]

    def save(self, root: Path) -> None:
        for spec in self.injected:
            save_adapter(self.model, spec, root / "adapters" / spec.name)

    def load(self, root: Path) -> None:
        for spec in self.injected:
            load_adapter_dir(self.model, spec.name, root / "adapters" / spec.name)


class FullWeights:
    """The base model itself; the one policy is every weight (full fine-tuning)."""

    has_adapters = False

    def __init__(self, model_cfg: ModelConfig):
        self.model_cfg = model_cfg
        self.model: Any = None

    def build(self, device: torch.device) -> Any:
        self.model = load_base_model(self.model_cfg, str(device), packed_rows=True)
        self.activate(None)
        return self.model

    def policy_of(self, agent: AgentSpec) -> str:
        return FULL_POLICY

    def params(self, policy: str) -> list[torch.nn.Parameter]:
        return list(self.model.parameters())

    def activate(self, policy: str | None) -> None:
        for p in self.model.parameters():
            p.requires_grad_(policy is not None)

    def scoring(self, policy: str | None) -> contextlib.AbstractContextManager:
        if policy is None:
            raise ValueError("full fine-tuning has no adapters to disable: the base weights train. Use "
                             "reference.mode=worker for reference log-probs")
        self.activate(None)
        return contextlib.nullcontext()

    def adapter_tensors(self, names: Sequence[str] | None, packed: bool = False,
                        dtype: str | None = None, shared: Any = None) -> dict[str, Any]:
        raise ValueError("full fine-tuning has no adapters to export; its weights are the whole model "
                         "(see save_checkpoint)")

    def save(self, root: Path) -> None:
        self.model.save_pretrained(root / "model")

    def load(self, root: Path) -> None:
        from safetensors.torch import load_file

        files = sorted((root / "model").glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"checkpoint {root} holds no model/*.safetensors")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        # tied weights (lm_head = embed_tokens) are saved once; anything else missing is a real mismatch
        untied = [k for k in missing if "lm_head" not in k]
        if untied or unexpected:
            raise ValueError(f"checkpoint {root}/model does not match the model: missing {untied[:3]}, "
                             f"unexpected {list(unexpected)[:3]}")
