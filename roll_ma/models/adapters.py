"""Per-agent LoRA adapters as a few functions over PEFT.

Each agent maps to an adapter (agents may share one). All adapters are injected into the
one base model before any DeepSpeed wrapping; each is initialised from its own seed so that
adding an agent never changes another agent's initial weights. Adapters are exported in the
PEFT file format (``adapter_config.json`` + ``adapter_model.safetensors``), which both
``PeftModel.from_pretrained`` and vLLM's ``LoRARequest`` load.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roll_ma.checkpoint_manifest import new_file_mode
from roll_ma.config.schema import AgentConfig, LoraConfig

_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")


@dataclass(frozen=True)
class AdapterSpec:
    """One LoRA adapter on the base model."""

    name: str
    rank: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]
    init_dir: str | None = None


@dataclass(frozen=True)
class AgentSpec:
    """One agent as the workers see it: its id (row column agent_id), adapter, frozen and lr (which agents
    an update trains at a step comes with its request: ``RunPlan.due_agents``)."""

    agent_id: int
    name: str
    adapter: str
    frozen: bool = False
    lr: float | None = None


def plan_adapters(
    lora: LoraConfig, agents: Sequence[AgentConfig]
) -> tuple[list[AgentSpec], list[AdapterSpec]]:
    """Agents (by id) and the distinct adapters they use, in first-use order."""
    agent_specs: list[AgentSpec] = []
    adapters: dict[str, AdapterSpec] = {}
    for agent_id, agent in enumerate(agents):
        name = agent.adapter_name
        if not _NAME.match(name):
            raise ValueError(f"adapter name {name!r} must use only letters, digits, '_' and '-'")
        own = agent.lora.resolve(lora)
        spec = AdapterSpec(
            name=name,
            rank=own.rank,
            alpha=own.alpha,
            dropout=own.dropout,
            target_modules=tuple(own.target_modules),
            init_dir=agent.init_adapter,
        )
        if name in adapters and adapters[name] != spec:
            raise ValueError(f"agents sharing adapter {name!r} disagree on its LoRA settings")
        adapters.setdefault(name, spec)
        agent_specs.append(AgentSpec(agent_id, agent.name, name, agent.frozen, agent.lr))
    return agent_specs, list(adapters.values())


def _peft_config(spec: AdapterSpec):
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,  # type: ignore[arg-type]  # peft annotates int; a float works (alpha / r)
        lora_dropout=spec.dropout,
        target_modules=list(spec.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def inject_adapters(model: Any, specs: Sequence[AdapterSpec], seed: int = 0) -> Any:
    """Wrap ``model`` in a PeftModel holding one LoRA adapter per spec (initialised or loaded)."""
    import torch
    from peft import get_peft_model

    if not specs:
        raise ValueError("inject_adapters needs at least one adapter spec")
    peft_model = None
    for spec in specs:
        # a private RNG stream per adapter name: init does not depend on which other adapters exist
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + zlib.crc32(spec.name.encode()))
            if peft_model is None:
                peft_model = get_peft_model(model, _peft_config(spec), adapter_name=spec.name)
            else:
                peft_model.add_adapter(spec.name, _peft_config(spec))
        if spec.init_dir:
            load_adapter_dir(peft_model, spec.name, spec.init_dir)
    set_trainable(peft_model, None)
    return peft_model


def adapter_parameters(model: Any, name: str) -> dict[str, Any]:
    """The LoRA parameters of adapter ``name`` (module path -> Parameter)."""
    params = {n: p for n, p in model.named_parameters() if f".{name}." in n and "lora_" in n}
    if not params:
        raise KeyError(f"no LoRA parameters for adapter {name!r}; adapters: {list(model.peft_config)}")
    return params


def set_trainable(model: Any, name: str | None) -> None:
    """requires_grad on adapter ``name`` only (None: nothing trainable)."""
    for n, p in model.named_parameters():
        p.requires_grad_(name is not None and "lora_" in n and f".{name}." in n)


def adapter_state_dict(model: Any, name: str) -> dict[str, Any]:
    """PEFT-format tensors of one adapter (keys without the adapter name), detached CPU copies."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model, adapter_name=name)
    return {k: v.detach().to("cpu").clone() for k, v in state.items()}


def load_adapter_state_dict(model: Any, name: str, state: dict[str, Any]) -> None:
    """Copy PEFT-format tensors into adapter ``name`` in place (keeps the Parameter objects)."""
    from peft import set_peft_model_state_dict

    # torch's _IncompatibleKeys (missing_keys, unexpected_keys); peft annotates it as a bare namedtuple
    result: Any = set_peft_model_state_dict(model, state, adapter_name=name)
    missing = [k for k in result.missing_keys if "lora_" in k and f".{name}." in k]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"adapter {name!r}: missing {missing[:3]}, unexpected {list(result.unexpected_keys)[:3]}"
        )


def write_adapter_dir(
    tensors: dict[str, Any], spec: AdapterSpec, out_dir: str | Path, base_model: str | None = None
) -> Path:
    """Write tensors + adapter_config.json as a PEFT adapter directory (what vLLM and PEFT load)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "adapter_model.safetensors.tmp"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    os.chmod(tmp, new_file_mode())  # safetensors writes 0600; vLLM or a teammate may read it as another user
    tmp.replace(out / "adapter_model.safetensors")
    write_adapter_config(spec, out, base_model)
    return out


def peft_config_dict(spec: AdapterSpec, base_model: str | None = None) -> dict[str, Any]:
    """The adapter's ``adapter_config.json`` content as plain JSON values (sets sorted, enums as str)."""
    cfg = _peft_config(spec).to_dict()
    cfg["base_model_name_or_path"] = base_model
    cfg = {k: (sorted(v) if isinstance(v, set) else v) for k, v in cfg.items()}
    return json.loads(json.dumps(cfg, default=str))


def write_adapter_config(spec: AdapterSpec, out_dir: str | Path, base_model: str | None = None) -> Path:
    """Write only ``adapter_config.json`` (the in-memory vLLM sync serves weights without a file)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text(json.dumps(peft_config_dict(spec, base_model), indent=2))
    return out


def save_adapter(model: Any, spec: AdapterSpec, out_dir: str | Path) -> Path:
    return write_adapter_dir(
        adapter_state_dict(model, spec.name),
        spec,
        out_dir,
        getattr(model.base_model.model.config, "_name_or_path", None),
    )


def read_adapter_dir(path: str | Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    f = Path(path) / "adapter_model.safetensors"
    if not f.exists():
        raise FileNotFoundError(f"{path} holds no adapter_model.safetensors")
    return load_file(str(f))


def load_adapter_dir(model: Any, name: str, path: str | Path) -> None:
    load_adapter_state_dict(model, name, read_adapter_dir(path))
