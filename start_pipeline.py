"""Start a roll_ma run: ``python start_pipeline.py --config_name <name> [key=value ...]``."""

import sys

from roll_ma.cli import main

if __name__ == "__main__":  # the guard matters: vLLM and Ray spawn processes that re-import this file
    sys.exit(main())
