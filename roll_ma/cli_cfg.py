"""``--cfg``: print a config the way Hydra users expect, then run the checks a run would make before Ray.

- ``--cfg`` prints the validated config as JSON (roll_ma's form since its first release);
- ``--cfg job`` prints it as YAML, as Hydra prints a job's config (save it, then run it with
  ``--config_path DIR --config_name NAME``);
- ``--cfg hydra`` prints what roll_ma has in place of Hydra's launcher settings (it composes configs with
  Hydra but runs without Hydra's launcher: no ``hydra.run.dir``, no multirun, no working-directory change);
- ``--cfg all`` prints both, as one YAML document.

After the config (stdout), the pre-flight checks of a run (``roll_ma.preflight``: the model and tokenizer,
data files row by row, the checkpoint a resume would take, hooks, Ray auth) run in this process; their
problems go to stderr and the exit code is 2, as for a run refused before it starts. A config this machine
cannot run (it asks for more GPUs than there are, and names no cluster) is checked for everything but this
machine: its GPU count and the pre-flight checks are skipped, and a note says so.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

CFG_PARTS = ("job", "hydra", "all")
PLAIN = ""  # ``--cfg`` without a part: the JSON of before


def cfg_argv(argv: list[str]) -> list[str]:
    """``--cfg job`` / ``-c job`` as ``--cfg=job``, and a bare ``--cfg`` as ``--cfg=`` (JSON), so that an
    override after ``--cfg`` is never taken for its value."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--cfg", "-c"):
            part = argv[i + 1] if i + 1 < len(argv) and argv[i + 1] in CFG_PARTS else PLAIN
            out.append(f"--cfg={part}")
            i += 2 if part else 1
            continue
        out.append(arg)
        i += 1
    return out


def print_config(cfg: Any, part: str, config_name: str, config_path: str | None, overrides: list[str]) -> int:
    """Print ``cfg`` (``part``: PLAIN, job, hydra or all) and run the pre-flight checks; the exit code."""
    job = dataclasses.asdict(cfg)
    if part == PLAIN:
        print(json.dumps(job, indent=2))
    else:
        print(_as_yaml(part, job, _launcher(cfg, config_name, config_path, overrides)), end="")
    sys.stdout.flush()  # the config first, then what the checks say
    elsewhere = _runs_elsewhere(cfg)
    if elsewhere:
        print(f"note: config {cfg.name!r} is valid and {elsewhere}", file=sys.stderr)
        print("note: the pre-flight checks (model and tokenizer, data files, checkpoint, hooks, Ray auth) "
              "were skipped: they look at the machine the run starts on; --cfg there runs them",
              file=sys.stderr)
        return 0
    return check_before_run(cfg)


def check_before_run(cfg: Any) -> int:
    """The pre-flight checks a run makes before Ray (problems to stderr: 2; else 0)."""
    from roll_ma.error_report import error_prefix
    from roll_ma.errors import PreflightError
    from roll_ma.preflight import run_preflight
    from roll_ma.workflows.lookup import with_absolute_files

    try:
        run_preflight(with_absolute_files(cfg), log=lambda text: print(text, file=sys.stderr))
    except PreflightError as err:
        print(f"{error_prefix()} {err}", file=sys.stderr)
        return 2
    return 0


def _runs_elsewhere(cfg: Any) -> str | None:
    """Why this machine cannot run ``cfg`` (the advice a run would give), or None."""
    from roll_ma.preflight.validate import check_without_machine, local_gpu_count
    from roll_ma.preflight.validate_resources import too_few_gpus_message

    have = local_gpu_count()
    if cfg.resources.num_gpus <= have or cfg.resources.ray_address or os.environ.get("RAY_ADDRESS"):
        return None
    # the same advice a run would give, so --cfg and a run never disagree on the fix
    return too_few_gpus_message(cfg, have, check_without_machine)


def _launcher(cfg: Any, config_name: str, config_path: str | None, overrides: list[str]) -> dict[str, Any]:
    """What roll_ma has in place of Hydra's ``hydra`` node."""
    from roll_ma.config.compose import config_dirs, find_config

    return {
        "config_name": config_name,
        "config_file": str(find_config(config_name, config_path)),
        "search_path": [str(d) for d in config_dirs(config_path)],
        "overrides": list(overrides),
        "output_dir": cfg.trainer.output_dir,
        "log_dir": str(Path(cfg.trainer.output_dir) / "logs"),
        "cwd": os.getcwd(),
    }


HYDRA_NOTE = """\
# roll_ma composes configs with Hydra but runs without Hydra's launcher: there is no hydra.run.dir
# (a run writes to trainer.output_dir), no multirun (-m) or sweeper, no job logging settings, and the
# working directory is not changed. What it has instead:
"""


def _as_yaml(part: str, job: dict[str, Any], launcher: dict[str, Any]) -> str:
    from omegaconf import OmegaConf

    text = ""
    if part in ("hydra", "all"):
        text += HYDRA_NOTE + OmegaConf.to_yaml({"hydra": launcher})
    if part in ("job", "all"):
        text += OmegaConf.to_yaml(job)
    return text
