"""roll_ma: multi-agent reinforcement learning of LLMs, one LoRA adapter per agent.

Importing the package is cheap and never imports Ray, vLLM or DeepSpeed: the heavy
backends are imported inside the modules that use them.
"""

__version__ = "0.1.0"


def train(config_or_path, **overrides):  # noqa: ANN001, ANN201 - see roll_ma.run.train
    """Run a config from Python (a name, a yaml path, a dict or a RunConfig); returns the final metrics.

    ``roll_ma.train("math_tool_tiny", trainer__max_steps=2)``: same validation and outputs as
    ``start_pipeline.py`` (``roll_ma.run`` has the details).
    """
    from roll_ma.run import train as _train

    return _train(config_or_path, **overrides)
