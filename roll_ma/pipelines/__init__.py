"""The run: ``run_training`` picks the multi-agent RL loop (``rl/``) or the supervised phases (``phases/``);
both open one run session (``session.py``) on the Ray clusters of a run (``clusters.py``)."""


def run_training(cfg, step_hook=None):  # noqa: ANN001 - thin lazy entry point
    """The RL loop (``rl.loop.run_rl_loop``) for ``train.objective=ppo``; the chain of
    supervised phases (``phases.chain.run_phases``) for ``train.objective=sft|dpo`` or a config that lists
    ``phases``.

    Both start after the pre-flight checks (``roll_ma.preflight``): data files, the checkpoint to resume,
    the tokenizer and model, hooks and Ray auth, all checked before Ray or any actor starts; a
    ``PreflightError`` lists every problem found. A run whose checkpoint already holds every step (or
    phase) says so in one line and returns that step's metrics (or the phases' results), without Ray."""
    # imported here, not at the top: importing any pipelines module runs this file, and these pull in
    # Ray, torch and every worker; ``roll_ma.pipelines.step_timer`` alone should not
    from roll_ma.preflight import run_preflight
    from roll_ma.workflows.lookup import with_absolute_files

    cfg = with_absolute_files(cfg)  # env, workflow, task and hook files, wherever actors run
    run_preflight(cfg)
    from roll_ma.preflight.output_dir import finished_run

    finished = finished_run(cfg)
    if finished is not None:
        print(finished.line, flush=True)
        return finished.result
    from roll_ma.config.run_plan import run_plan

    plan = run_plan(cfg)  # the run resolved once: the session, the workers and every step read this plan
    if not plan.rl:
        if step_hook is not None:
            raise ValueError("step_hook is a hook of the RL loop; phase runs take none")
        from roll_ma.pipelines.phases.chain import run_phases

        return run_phases(cfg, plan)
    from roll_ma.pipelines.rl.loop import run_rl_loop

    return run_rl_loop(cfg, plan, step_hook=step_hook)
