"""The built-in models shipped in the package: names and where they live (no heavy imports).

Both are made by scripts/build_tiny_model.py (docs/tiny_model.md). "tiny" answers tiny Hanabi
turns with uniformly random moves; "tiny-habits" with fixed habits per information set, so its
answers depend on what it sees (the tiny Hanabi demo's base).
"""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "assets"
# name -> (folder under roll_ma/assets, the build script's arguments that rebuild it)
BUILTIN_MODELS = {
    "builtin:tiny": ("tiny_model", ""),
    "builtin:tiny-habits": (
        "tiny_habits_model", " --hanabi-answers habits --out roll_ma/assets/tiny_habits_model"
    ),
}
