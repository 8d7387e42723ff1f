"""Command line: ``python start_pipeline.py --config_name NAME [--config_path DIR] [key=value ...]``."""

from __future__ import annotations

import argparse
import os
import sys

USAGE_EPILOG = """\
overrides are Hydra-style key=value pairs, e.g.
  trainer.max_steps=50 rollout.backend=vllm agents.0.lr=1e-4 env.kwargs.rounds=2

examples:
  python start_pipeline.py --config_name math_selfplay_tiny
  python start_pipeline.py --config_name math_reflection_tiny      # SFT then iterative DPO, actor + critic
  python start_pipeline.py --config_name tiny_hanabi_selfplay trainer.max_steps=20
  RAY_ADDRESS=auto python start_pipeline.py --config_name hanabi_selfplay --num_agents 2 --lora_rank 16
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="roll-ma",
        description="Multi-agent RL of LLMs: one LoRA adapter per agent.",
        epilog=USAGE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config_name",
        "--config-name",
        "-cn",
        dest="config_name",
        help="config to run (a yaml under examples/, or under --config_path)",
    )
    parser.add_argument(
        "--config_path",
        "--config-path",
        "-cp",
        dest="config_path",
        help="directory holding the config (default: search examples/)",
    )
    parser.add_argument("--num_agents", type=int, help="MARS-style: N agents, each with its own adapter")
    parser.add_argument("--lora_rank", type=int, help="MARS-style: same as lora.rank=R")
    parser.add_argument("--lora_alpha", type=float, help="MARS-style: same as lora.alpha=A")
    parser.add_argument("--list", action="store_true", help="list the available configs and exit")
    parser.add_argument("--cfg", action="store_true", help="print the validated config and exit")
    parser.add_argument(
        "--describe", action="store_true", help="list every config key with its help and exit"
    )
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from roll_ma.config import ConfigError, RunConfig, available_configs, load_config
    from roll_ma.config.loading import mars_flags_to_overrides

    if args.list:
        for name, path in sorted(available_configs(args.config_path).items()):
            print(f"{name:28s} {path}")
        return 0
    if args.describe:
        from roll_ma.config.typed import describe

        for key, tp, default, text in describe(RunConfig):
            print(f"{key:34s} {tp:28s} default={default!r}\n{'':34s} {text}")
        return 0
    if not args.config_name:
        print("error: --config_name is required (see --list for the shipped configs)", file=sys.stderr)
        return 2
    overrides = mars_flags_to_overrides(args.num_agents, args.lora_rank, args.lora_alpha) + list(
        args.overrides
    )
    try:
        # --cfg checks a GPU config anywhere: everything but this machine's own GPU count
        cfg = load_config(args.config_name, args.config_path, overrides, num_agents=args.num_agents,
                          check_local_gpus=not args.cfg)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.cfg:
        import dataclasses
        import json

        from roll_ma.config.validate import local_gpu_count

        print(json.dumps(dataclasses.asdict(cfg), indent=2))
        have = local_gpu_count()
        if cfg.resources.num_gpus > have and not (cfg.resources.ray_address or os.environ.get("RAY_ADDRESS")):
            print(f"note: config {cfg.name!r} is valid; it runs on {cfg.resources.num_gpus} GPU(s) "
                  f"(resources.num_gpus) and this machine has {have}", file=sys.stderr)
        return 0
    from roll_ma.distributed.watchdog import WorkerStalled, WorkerStartError
    from roll_ma.pipelines import run_pipeline

    try:
        run_pipeline(cfg)
    except (WorkerStalled, WorkerStartError) as err:  # the message says it all; the driver's stack would not
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
