"""Math problem data: local files (DeepScaleR, GSM8K, MATH-500 presets) and synthetic arithmetic."""

from roll_ma.data.dataset import MathDataset
from roll_ma.data.math_files import PRESETS, gsm8k_final_answer, load_math_records, read_rows
from roll_ma.data.synthetic import MAX_LEVEL, arithmetic_problem, generate_arithmetic, is_heldout

__all__ = [
    "MAX_LEVEL",
    "PRESETS",
    "MathDataset",
    "arithmetic_problem",
    "generate_arithmetic",
    "gsm8k_final_answer",
    "is_heldout",
    "load_math_records",
    "read_rows",
]
