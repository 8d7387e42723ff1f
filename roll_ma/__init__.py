"""roll_ma: multi-agent reinforcement learning of LLMs, one LoRA adapter per agent.

Importing the package is cheap and never imports Ray, vLLM or DeepSpeed: the heavy
backends are imported inside the modules that use them.
"""

__version__ = "0.1.0"
