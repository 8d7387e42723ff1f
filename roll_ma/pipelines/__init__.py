"""The pipelines: the multi-agent RL loop, and supervised phases (sft, dpo, eval); a dispatcher picks one."""


def run_pipeline(cfg, step_hook=None):  # noqa: ANN001 - thin lazy entry point
    """The RL loop (``multi_agent_pipeline``) for ``train.objective=ppo``; the chain of supervised phases
    (``phases``) for ``train.objective=sft|dpo`` or a config that lists ``phases``."""
    import dataclasses

    from roll_ma.workflows.loader import absolute_spec

    name = absolute_spec(cfg.env.name)  # an env file relative to the driver's directory, wherever actors run
    if name != cfg.env.name:
        cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, name=name))
    if cfg.phases or cfg.train.objective != "ppo":
        if step_hook is not None:
            raise ValueError("step_hook is a hook of the RL loop; phase runs take none")
        from roll_ma.pipelines.phases import run_phases

        return run_phases(cfg)
    from roll_ma.pipelines.multi_agent_pipeline import run_pipeline as run

    return run(cfg, step_hook=step_hook)
