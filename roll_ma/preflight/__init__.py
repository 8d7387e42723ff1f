"""Pre-flight: everything a config names, loaded or probed in the driver before Ray or any actor starts.

``run_preflight(cfg)`` runs every check and raises one ``PreflightError`` listing every problem found:

- ``output_dir``: ``trainer.output_dir`` can be created and written (not a file, not under one, not
  read-only), and holds no file where the run writes a folder.
- ``model_source`` and ``tokenizer``: the model (and a teacher's) is found first, in seconds: a local path
  that does not exist, or a hub name while the hub cannot be reached and the cache lacks it, is one
  problem; then its config, weights and tokenizer load; the tokenizer is not empty, has an end-of-turn
  token, fits the model's vocabulary and has a chat template where prompts need one.
- ``data_files``: every row of every SFT / DPO / problem file, with ``file:line: field: what is wrong``.
- ``checkpoint_compat``: the checkpoint ``trainer.resume=auto`` would continue from was written with
  this config's agents, adapters, LoRA shapes, critic layout and model.
- ``hooks``: prompt hooks, workflows and team tasks take the arguments they will be given.
- ``ray_auth``: the auth variables, and the cluster's auth mode against this process's.

The config's own consistency (keys, types, combinations) is checked earlier, when it is loaded
(``config_loader.load_config``: ``roll_ma.config`` types it, ``validate`` checks it across keys and against
the runtime); ``pipelines.run_training`` calls this before dispatching to the RL loop or the supervised
phases.
"""

from __future__ import annotations

from collections.abc import Callable

from roll_ma.config.schema import RunConfig
from roll_ma.errors import PreflightError


def run_preflight(cfg: RunConfig, log: Callable[[str], None] = print) -> None:
    """Every pre-flight check of ``cfg``; raises ``PreflightError`` listing every problem. Notes (what is
    allowed but worth knowing, e.g. an older checkpoint resumed unchecked) go to ``log``."""
    from roll_ma.preflight.checkpoint_compat import resume_problems
    from roll_ma.preflight.data_files import chat_file_problems, chat_files, problem_file_problems
    from roll_ma.preflight.model_probe import probe_model
    from roll_ma.preflight.model_source import Hub
    from roll_ma.preflight.output_dir import output_dir_problems
    from roll_ma.preflight.ray_auth import ray_auth_problems
    from roll_ma.preflight.user_functions import hook_problems

    problems: list[str] = output_dir_problems(cfg.trainer.output_dir)
    notes: list[str] = []
    hub = Hub()  # asked at most once, and only for a hub name that is not in the local cache
    files = chat_files(cfg)  # parsed first: prompts given as messages need a chat template
    probe, found = probe_model(cfg.model, "model", chat_template_need(cfg, files), hub, notes)
    problems += found
    if teacher_used(cfg):
        problems += probe_model(cfg.teacher.model, "teacher.model", "the teacher's prompts", hub, notes)[1]
    for note in notes:
        log(f"note: {note}")
    problems += chat_file_problems(files, probe.tokenizer, cfg.model.max_prompt_tokens, probe.max_positions)
    problems += problem_file_problems(cfg)
    problems += hook_problems(cfg)
    problems += resume_problems(cfg, log)
    problems += ray_auth_problems(cfg)
    if problems:
        raise PreflightError(problems)


def teacher_used(cfg: RunConfig) -> bool:
    from roll_ma.preflight.validate_phases import teacher_workers

    return teacher_workers(cfg) > 0


def chat_template_need(cfg: RunConfig, files: list) -> str | None:  # noqa: ANN001 - data_files.ChatFile
    """What in this run renders prompts with the chat template (None: nothing does)."""
    from roll_ma.config.phase_plan import plan_phases
    from roll_ma.config.run_plan import rl_loop

    message_files = [f.path for f in files if f.uses_messages]
    if message_files:
        return f"the prompts given as messages in {message_files[0]}"
    if not rl_loop(cfg):
        playing = [p.name for p in plan_phases(cfg) if not _reads_file_only(p)]
        return f"phase {playing[0]!r} (it plays episodes)" if playing else None
    if cfg.env.workflow:
        return f"the workflow's agent calls ({cfg.env.workflow})"
    if _team_prompts_are_own(cfg):
        return None
    return f"the env's prompts (env.name={cfg.env.name})"


def _reads_file_only(phase) -> bool:  # noqa: ANN001 - config.phase_plan.Phase
    return (phase.objective == "sft" and phase.sft.source == "file") or (
        phase.objective == "dpo" and phase.dpo.source == "file")


def _team_prompts_are_own(cfg: RunConfig) -> bool:
    """A team env whose every agent builds its prompt with its own pre_process (no chat template)."""
    from roll_ma.preflight.validate_team import TEAM_ENV

    if cfg.env.name != TEAM_ENV:
        return False
    from roll_ma.envs.team_hooks import default_pre_process, load_hooks

    try:
        return all(load_hooks(a).pre is not default_pre_process for a in cfg.agents)
    except Exception:  # noqa: BLE001 - a hook that does not load is reported by the hook check
        return True
