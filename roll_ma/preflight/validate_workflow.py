"""Config checks of a workflow run (``env.workflow``), before any actor starts; each names the key and fix."""

from __future__ import annotations

from roll_ma.config.schema import RunConfig
from roll_ma.config.typed import ConfigProblem, suggest


def check_workflow(cfg: RunConfig, problems: list[ConfigProblem]) -> int | None:
    """Load the workflow and its tools, check what the config hands them; returns the number of "seats"
    (one per agent), or None when the workflow cannot be loaded."""
    from roll_ma.workflows.lookup import load_workflow

    add = lambda key, msg: problems.append(ConfigProblem(key, msg))  # noqa: E731
    env, names = cfg.env, [a.name for a in cfg.agents]
    if env.seats is not None:
        add("env.seats", "a workflow calls its agents by name, it has no seats; remove env.seats")
    if env.show_greedy_moves:
        add("env.show_greedy_moves", "only turn-based envs show greedy moves; set it to false for a workflow")
    if cfg.study.action_entropy_coef > 0:
        add(
            "study.action_entropy_coef",
            "a workflow's calls list no legal actions; use "
            "algorithm.entropy_coef, or set action_entropy_coef=0",
        )
    if cfg.study.joint_search_every > 0:
        add(
            "study.joint_search_every",
            "joint search needs a small OpenSpiel game, not a workflow; set it to 0",
        )
    _check_data(cfg, add)
    _check_tools(cfg, add)
    try:
        workflow = load_workflow(env.workflow)
    except ValueError as err:
        add("env.workflow", str(err))
        return None
    except Exception as err:  # noqa: BLE001 - importing the user's file ran its code
        add("env.workflow", f"importing {env.workflow} failed: {type(err).__name__}: {err}")
        return None
    missing = [a for a in workflow.agent_names if a not in names]
    if missing:
        add(
            "agents",
            f"the workflow calls agents {missing} that the config does not define (agents: {names}); "
            f"add them, e.g. agents: [{', '.join('{name: ' + a + '}' for a in workflow.agent_names)}]",
        )
    if workflow.settings is not None:
        for key in env.kwargs:
            if key not in workflow.settings:
                options = sorted(workflow.settings)
                add(
                    f"env.kwargs.{key}",
                    f"the workflow takes no setting {key!r}{suggest(key, options)}; it takes {options}",
                )
    if env.tools and "tools" not in workflow.takes:
        add(
            "env.tools",
            "the workflow's run() takes no `tools` argument; add one "
            "(async def run(self, task, agents, tools)) or remove env.tools",
        )
    return len(names)


def _check_data(cfg: RunConfig, add) -> None:  # noqa: ANN001
    from roll_ma.data.code_tasks import BUILTIN_TASK_SETS

    for key, source in (
        ("env.data.source", cfg.env.data.source),
        ("env.data.eval_source", cfg.env.data.eval_source),
    ):
        if source is None or not source.startswith("builtin:"):
            continue  # a file is read, row by row, by the pre-flight check (roll_ma/preflight/data_files.py)
        name = source.split(":", 1)[1]
        if name not in BUILTIN_TASK_SETS:
            add(
                key,
                f"unknown built-in task set {name!r}{suggest(name, BUILTIN_TASK_SETS)}; "
                f"built-in: {['builtin:' + n for n in BUILTIN_TASK_SETS]}",
            )


def _check_tools(cfg: RunConfig, add) -> None:  # noqa: ANN001
    from roll_ma.workflows.tools import TOOLS, build_tools

    for name, settings in cfg.env.tools.items():
        settings = dict(settings or {})
        why = TOOLS.unknown(str(settings.get("tool", name)))  # under the key that names the tool
        if why:
            add(f"env.tools.{name}.tool" if "tool" in settings else f"env.tools.{name}", why)
            continue
        try:
            build_tools({name: settings})
        except (TypeError, ValueError) as err:  # a setting its constructor does not take, or refuses
            add(f"env.tools.{name}", f"bad settings {settings}: {err}")
