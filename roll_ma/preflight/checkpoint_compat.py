"""Does the checkpoint a run would resume from fit its config? Checked before Ray starts.

Every checkpoint holds ``run_signature.json`` (written by ``run_signature`` at save time, listed in the
manifest like every other file): what decides the shape and meaning of the saved tensors. Resuming
compares it with the config and refuses a mismatch, naming each key with its old and new value and
the two fixes, instead of failing after Ray started on tensor sizes or a missing file.

Recorded and compared (``run_signature``): the agents (names, order, adapters, frozen), every adapter's LoRA
rank, alpha and target modules, the value critic's layout (``algorithm.advantage=gae``,
``critic.share``, ``critic.groups``, its rank and alpha), ``model.path``, the tokenizer, ``model.dtype``,
full fine-tuning, ``train.zero_stage`` (and ``train.num_workers`` at ZeRO 1/2: each rank saved its
shard), and the phases (or ``train.objective``).

Everything else may change on resume: steps, evaluation, logging, checkpoints, rollout and sampling
settings, batch sizes, loss coefficients, resources. Learning-rate settings are recorded too, and a
change is allowed with a note: the resumed optimizer continues the checkpoint's schedule.

A checkpoint written before signatures existed resumes unchecked, with a note.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roll_ma.checkpoint import SIGNATURE_FILE, choose_resume
from roll_ma.config.run_plan import RL_OBJECTIVE, needs_critic, rl_loop
from roll_ma.config.schema import RunConfig

SIGNATURE_VERSION = 1


def run_signature(cfg: RunConfig) -> dict[str, Any]:
    """The record of ``cfg`` a checkpoint keeps (flat, JSON-ready). Compute it before the pipeline
    rewrites the config (``model.random_weights`` points ``model.path`` at a built model)."""
    from roll_ma.config.phase_plan import plan_phases

    sig: dict[str, Any] = {"signature_version": SIGNATURE_VERSION}
    sig["model.path"] = _model_location(cfg.model.path)
    sig["model.tokenizer_path"] = _model_location(cfg.model.tokenizer_path or cfg.model.path)
    sig["model.dtype"] = cfg.model.dtype
    sig["agents"] = [a.name for a in cfg.agents]
    for a in cfg.agents:
        sig[f"agents.{a.name}.adapter"] = a.adapter_name
        sig[f"agents.{a.name}.frozen"] = a.frozen
    sig["train.full_finetune"] = cfg.train.full_finetune
    if not cfg.train.full_finetune:
        for adapter, agent in _first_agent_of_adapter(cfg).items():
            lora = cfg.agent_lora(agent)
            sig[f"adapters.{adapter}.rank"] = lora.rank
            sig[f"adapters.{adapter}.alpha"] = lora.alpha
            sig[f"adapters.{adapter}.target_modules"] = sorted(lora.target_modules)
            sig[f"adapters.{adapter}.lr"] = agent.lr if agent.lr is not None else cfg.train.lr
    sig["train.zero_stage"] = cfg.train.zero_stage
    if cfg.train.zero_stage > 0:
        sig["train.num_workers"] = cfg.train.num_workers
    sig["algorithm.advantage"] = cfg.algorithm.advantage
    if needs_critic(cfg.algorithm.advantage):
        first = cfg.agent_lora(cfg.agents[0]) if cfg.agents else cfg.lora
        sig["critic.share"] = cfg.critic.share
        sig["critic.groups"] = [list(g) for g in cfg.critic.groups]
        sig["critic.rank"], sig["critic.alpha"] = cfg.critic.adapter_shape(first.rank, first.alpha)
        sig["critic.lr"] = cfg.critic.lr
    phases = [f"{p.name} ({p.objective})" for p in plan_phases(cfg)]
    sig["phases"] = [RL_OBJECTIVE] if rl_loop(cfg) else phases
    sig["train.lr_schedule"] = cfg.train.lr_schedule
    sig["train.warmup_steps"] = cfg.train.warmup_steps
    sig["trainer.max_steps"] = cfg.trainer.max_steps
    return sig


def _first_agent_of_adapter(cfg: RunConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in cfg.agents:
        out.setdefault(a.adapter_name, a)
    return out


def _model_location(path: str) -> str:
    """A local directory as an absolute path (the same model however it was spelled); anything else as is."""
    local = Path(path).expanduser()
    return str(local.resolve()) if not path.startswith("builtin:") and local.exists() else path


# ---------------------------------------------------------------------------------------- comparing
def _same_critic(old: Any, new: Any) -> bool:
    # grpo <-> reinforce_pp changes nothing that was saved; to or from gae adds or drops the critic
    return needs_critic(str(old)) == needs_critic(str(new))


def _decays(sig: dict[str, Any]) -> bool:
    return sig.get("train.lr_schedule", "constant") != "constant"


LR_NOTE = ("the resumed optimizer continues the checkpoint's learning-rate schedule (its lr, warmup and "
           "decay horizon); start afresh (trainer.resume=never) to train with the new one")


@dataclass(frozen=True)
class Rule:
    """How one recorded key is compared: ``same(old, new)``; a ``note`` instead of a refusal when set."""

    same: Callable[[Any, Any], bool] = lambda old, new: old == new
    note: str | None = None
    applies: Callable[[dict, dict], bool] = lambda old_sig, new_sig: True


ADAPTER_LR = Rule(note=LR_NOTE)  # adapters.<name>.lr: train.lr or the agent's own lr
NOTED = {  # keys that may change, with a note
    "critic.lr": Rule(note=LR_NOTE),
    "train.lr_schedule": Rule(note=LR_NOTE),
    "train.warmup_steps": Rule(note=LR_NOTE),
    "trainer.max_steps": Rule(note=LR_NOTE, applies=lambda o, n: _decays(o) or _decays(n)),
}
COMPARED = {"algorithm.advantage": Rule(same=_same_critic)}  # every other recorded key: equality


def _rule(key: str) -> Rule:
    if key in COMPARED:
        return COMPARED[key]
    if key in NOTED:
        return NOTED[key]
    if key.startswith("adapters.") and key.endswith(".lr"):
        return ADAPTER_LR
    return Rule()


@dataclass(frozen=True)
class Change:
    key: str  # the config key to look at (lora.rank, agents[1].lora.rank, critic.share, ...)
    old: Any
    new: Any
    adapters: tuple[str, ...] = ()
    note: str | None = None

    def __str__(self) -> str:
        plural = "s" * (len(self.adapters) > 1)
        which = f" (adapter{plural} {', '.join(self.adapters)})" if self.adapters else ""
        return f"{self.key}: {_shown(self.old)} in the checkpoint, {_shown(self.new)} now{which}"


def _shown(value: Any) -> str:
    return json.dumps(value)


def compare(old: dict[str, Any], new: dict[str, Any], cfg: RunConfig) -> list[Change]:
    """Every recorded key whose value differs (keys only one side has are not compared: a newer roll_ma
    may record more), named as the config key a user would change, one line per (key, old, new)."""
    changes: dict[tuple, Change] = {}
    for key in new:
        if key == "signature_version" or key not in old:
            continue
        rule = _rule(key)
        if not rule.applies(old, new) or rule.same(old[key], new[key]):
            continue
        shown, adapter = _config_key(key, cfg)
        ident = (shown, json.dumps(old[key]), json.dumps(new[key]))
        before = changes.get(ident)
        adapters = (before.adapters if before else ()) + ((adapter,) if adapter else ())
        changes[ident] = Change(shown, old[key], new[key], adapters, rule.note)
    return list(changes.values())


def _config_key(key: str, cfg: RunConfig) -> tuple[str, str | None]:
    """(the config key behind a recorded key, the adapter it is about or None)."""
    names = [a.name for a in cfg.agents]
    if key.startswith("agents."):
        name, what = key[len("agents."):].rsplit(".", 1)
        return (f"agents[{names.index(name)}].{what}" if name in names else f"agents ({name})"), None
    if key.startswith("adapters."):
        adapter, what = key[len("adapters."):].rsplit(".", 1)
        users = [i for i, a in enumerate(cfg.agents) if a.adapter_name == adapter]
        if what == "lr":
            own = [i for i in users if cfg.agents[i].lr is not None]
            return (f"agents[{own[0]}].lr" if own else "train.lr"), adapter
        own = [i for i in users if getattr(cfg.agents[i].lora, what) is not None]
        return (f"agents[{own[0]}].lora.{what}" if own else f"lora.{what}"), adapter
    if key == "phases":
        return ("phases" if cfg.phases else "train.objective"), None
    if key in ("critic.rank", "critic.alpha") and getattr(cfg.critic, key.split(".")[1]) is None:
        return f"{key} (unset: the first agent's LoRA {key.split('.')[1]})", None
    return key, None


# ---------------------------------------------------------------------------------------- the check
def resume_problems(cfg: RunConfig, log: Callable[[str], None] = print) -> list[str]:
    """Compare the checkpoint ``trainer.resume=auto`` would continue from with ``cfg``; a list of one
    problem (every refused key, the fixes) or nothing. Notes (allowed changes, an unsigned checkpoint)
    go to ``log``."""
    if cfg.trainer.resume != "auto":
        return []
    out_dir = Path(cfg.trainer.output_dir)
    choice = choose_resume(out_dir)  # the checkpoint the run will load, chosen as the run chooses it
    if choice.chosen is None:
        message = choice.no_intact_message(out_dir)  # its lines indented under the problem's "  - "
        return [message.replace("\n", "\n    ")] if message else []
    path = choice.chosen[1]
    file = path / SIGNATURE_FILE
    if not file.is_file():
        log(f"[roll_ma] note: checkpoint {path.name} has no {SIGNATURE_FILE} (written by an older "
            "roll_ma): its agents, adapters and LoRA settings are not compared with this config")
        return []
    try:
        old = json.loads(file.read_text())
    except ValueError as err:  # only a checkpoint loaded unchecked (no manifest) can get here
        log(f"[roll_ma] note: checkpoint {path.name}: {SIGNATURE_FILE} does not parse ({err}); "
            "its agents, adapters and LoRA settings are not compared with this config")
        return []
    changes = compare(old, run_signature(cfg), cfg)
    refused = [c for c in changes if not c.note]
    if refused:  # refused: the notes on what could have changed are beside the point
        lines = "\n".join(f"      {c}" for c in refused)
        return [
            f"trainer.output_dir={out_dir} holds a checkpoint of another config ({path.name}); "
            f"trainer.resume=auto would continue from it, but:\n{lines}\n"
            "    Start afresh with trainer.resume=never (moves the previous run's files aside), or give this "
            "run another trainer.output_dir."
        ]
    for c in changes:
        log(f"[roll_ma] note: resuming from {path.name}: {c}; {c.note}")
    return []
