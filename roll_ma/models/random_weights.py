"""``model.random_weights``: a real model's architecture with random weights, for benchmarks only.

GPU hosts without a model hub (the lent benchmark machines) cannot load Qwen/Qwen2.5-7B-Instruct,
but throughput, memory and adapter-sync figures depend on the architecture, not on the weights.
With ``model.random_weights=true`` the driver builds the named architecture once (random weights,
the built-in byte-level tokenizer padded to the model's vocabulary) into a cache folder, points
``model.path`` there and says so loudly; every worker then loads it like any local model.

    python -m roll_ma.models.random_weights Qwen/Qwen2.5-7B-Instruct --dtype bfloat16   # build ahead
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

from roll_ma.config.schema import RunConfig

# hub names (and their base / Instruct variants) -> roll_ma.models.tiny.SHAPES
KNOWN_MODELS = {
    "Qwen/Qwen2.5-0.5B": "qwen2.5-0.5b",
    "Qwen/Qwen2.5-1.5B": "qwen2.5-1.5b",
    "Qwen/Qwen2.5-3B": "qwen2.5-3b",
    "Qwen/Qwen2.5-7B": "qwen2.5-7b",
}
BANNER = (
    "[roll_ma] model.random_weights=true: RANDOM weights of {path}'s architecture ({shape}), "
    "for benchmarks only; nothing this run learns or scores means anything"
)


def shape_of(path: str) -> str:
    """The shape name of a known model name (base or -Instruct) or of a shape name itself."""
    from roll_ma.models.tiny import SHAPES

    if path in SHAPES:
        return path
    name = path.removesuffix("-Instruct")
    if name in KNOWN_MODELS:
        return KNOWN_MODELS[name]
    known = sorted(KNOWN_MODELS) + sorted(SHAPES)
    raise ValueError(
        f"model.random_weights needs a known architecture; model.path={path!r} is not one of "
        f"{known} (with or without -Instruct)"
    )


def cache_root() -> Path:
    return Path(os.environ.get("ROLL_MA_CACHE", Path.home() / ".cache" / "roll_ma")) / "random_models"


def random_model_dir(path: str, dtype: str, seed: int = 0) -> Path:
    """Where the random model of (architecture, dtype, seed) lives; the builder's code is in the name,
    so a changed builder never reuses an old model."""
    from roll_ma.models import tiny, tiny_tokenizer

    code = zlib.crc32(b"".join(Path(inspect.getfile(m)).read_bytes() for m in (tiny, tiny_tokenizer)))
    return cache_root() / f"{shape_of(path)}_{dtype}_s{seed}_{code:08x}"


def build_random_model(path: str, dtype: str, seed: int = 0) -> Path:
    """Build (once) and return the random model's directory; a killed build leaves nothing behind."""
    out = random_model_dir(path, dtype, seed)
    if (out / "config.json").exists():
        return out
    import torch

    from roll_ma.models.tiny import SHAPES, build_tiny_model

    shape = shape_of(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.", dir=out.parent))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    build_tiny_model(
        tmp,
        shape=shape,
        seed=seed,
        dtype=dtype,
        device=device,
        vocab_size=SHAPES[shape].get("vocab_size", 512),
    )
    try:
        tmp.rename(out)  # complete or absent
    except OSError:  # built meanwhile by another process: keep that one
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


def use_random_weights(cfg: RunConfig) -> RunConfig:
    """The config with ``model.path`` pointing at the random model (built in a child process, so the
    driver holds no GPU memory for it); prints the banner."""
    shape = shape_of(cfg.model.path)
    print(BANNER.format(path=cfg.model.path, shape=shape), flush=True)
    out = random_model_dir(cfg.model.path, cfg.model.dtype, cfg.seed)
    if not (out / "config.json").exists():
        print(f"[roll_ma] building the random {shape} model into {out} (once)", flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "roll_ma.models.random_weights",
                cfg.model.path,
                "--dtype",
                cfg.model.dtype,
                "--seed",
                str(cfg.seed),
            ],
            check=True,
        )
    model = dataclasses.replace(cfg.model, path=str(out), tokenizer_path=None)
    return dataclasses.replace(cfg, model=model)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Build the random-weight model that model.random_weights uses.")
    p.add_argument("path", help="a known model name (Qwen/Qwen2.5-7B-Instruct) or a shape (qwen2.5-7b)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(build_random_model(args.path, args.dtype, args.seed))


if __name__ == "__main__":
    main()
