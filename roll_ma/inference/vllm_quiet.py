"""vLLM's warnings about what roll_ma itself chose: dropped, since the user can do nothing about them.

- ``This model does not officially support disabling chunked prefill``: on CPU roll_ma turns chunked
  prefill off (``vllm_infer.py`` says why: seeded rows would be rewound, which CPU generators cannot).
- ``vLLM has deprecated support for supporting different tokenizers for different LoRAs``: vLLM warns
  whenever a request carries a ``LoRARequest``; every roll_ma request does (one adapter per agent), and
  the adapters use the base model's tokenizer.

Every other vLLM line is left alone (it goes to the run's log file: ``distributed/worker_output.py``).
"""

from __future__ import annotations

import logging

# (vLLM logger, the start of the message) of each warning roll_ma's own settings cause
OWN_CHOICES = (
    ("vllm.engine.arg_utils", "This model does not officially support disabling chunked prefill"),
    ("vllm.v1.engine.input_processor", "vLLM has deprecated support for supporting different tokenizers"),
)


class _DropOwnChoices(logging.Filter):
    def __init__(self, starts: tuple[str, ...]):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.starts)


def quiet_own_choices() -> None:
    """Install the filters on vLLM's loggers in this process (once; before the engine starts)."""
    by_logger: dict[str, tuple[str, ...]] = {}
    for name, start in OWN_CHOICES:
        by_logger[name] = (*by_logger.get(name, ()), start)
    for name, starts in by_logger.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropOwnChoices) for f in logger.filters):
            logger.addFilter(_DropOwnChoices(starts))
