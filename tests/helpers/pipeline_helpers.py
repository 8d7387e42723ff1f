"""Helpers of the end-to-end tests: small configs written to a tmp dir, reading checkpoints back."""

from pathlib import Path

import yaml

from roll_ma.preflight.config_loader import load_config
from roll_ma.tracking import read_metrics

REPO = Path(__file__).resolve().parents[2]
# the toy run that tests/e2e/conftest.py's toy_run fixture trains once for several end-to-end tests
TOY_AGENTS = [{"name": "alice"}, {"name": "bob"}]
TOY_STEPS = 5


def toy_config(tmp_path: Path, model_dir: str, agents: list[dict], **sections) -> dict:
    """A DigitGame run: 2 players, tiny model, 3 steps, a checkpoint every step."""
    cfg = {
        "name": "toy",
        "seed": 0,
        "model": {"path": model_dir, "max_prompt_tokens": 64},
        "lora": {"rank": 4, "alpha": 8},
        "agents": agents,
        "env": {"name": "toy_envs:DigitGame", "groups_per_step": 2, "group_size": 4, "eval_episodes": 4},
        "rollout": {"backend": "hf", "max_new_tokens": 8},
        "train": {"lr": 0.01, "micro_batch_size": 8},
        "reference": {"mode": "none"},
        "trainer": {"max_steps": 3, "save_every": 1, "keep_last": 5, "output_dir": str(tmp_path / "out")},
    }
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return cfg


def write_config(tmp_path: Path, cfg: dict, name: str = "toy") -> Path:
    d = tmp_path / "configs"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    return d


def load(tmp_path: Path, cfg: dict, overrides=()):
    return load_config("toy", config_path=str(write_config(tmp_path, cfg)), overrides=list(overrides))


def steps_logged(out_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(Path(out_dir) / "metrics.jsonl")]


def adapter_tensors_at(out_dir: Path, step: int, adapter: str) -> dict:
    from roll_ma.models.adapters import read_adapter_dir

    return read_adapter_dir(
        Path(out_dir) / "checkpoints" / f"step_{step:06d}" / "trainer" / "adapters" / adapter
    )


def same_tensors(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
