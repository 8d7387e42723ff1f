"""Every shipped example config, found by globbing examples/ (a new yaml is covered without a test edit).

A config is a GPU config when it asks for GPUs (``resources.num_gpus > 0``); the rest run on CPU with the
built-in model. Read from the yaml itself: classifying at collection time must not compose with Hydra.
"""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def example_configs() -> dict[str, Path]:
    """Config name -> yaml, for every yaml under examples/."""
    return {p.stem: p for p in sorted(EXAMPLES.rglob("*.yaml"))}


def needs_gpu(path: Path) -> bool:
    raw = yaml.safe_load(path.read_text()) or {}
    return int((raw.get("resources") or {}).get("num_gpus") or 0) > 0


def cpu_configs() -> list[str]:
    return [name for name, path in example_configs().items() if not needs_gpu(path)]


def gpu_configs() -> list[str]:
    return [name for name, path in example_configs().items() if needs_gpu(path)]
