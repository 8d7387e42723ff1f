"""The multi-agent pipeline loop and its evaluation."""


def run_pipeline(cfg, step_hook=None):  # noqa: ANN001 - thin lazy entry point, see multi_agent_pipeline
    from roll_ma.pipelines.multi_agent_pipeline import run_pipeline as run

    return run(cfg, step_hook=step_hook)
