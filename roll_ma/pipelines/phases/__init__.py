"""The supervised phase runs (``chain.run_phases``): sft (``sft.py``), dpo (``dpo.py``) and eval on one
set of workers (``context.PhaseContext``), and the reflection game's data (``reflection_data.py``)."""
