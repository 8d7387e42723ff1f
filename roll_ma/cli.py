"""Command line: ``python start_pipeline.py --config_name NAME [--config_path DIR] [key=value ...]``.

Options and ``key=value`` overrides may come in any order; ``--cfg [job|hydra|all]`` prints the config
and runs the pre-flight checks of a run (``roll_ma/cli_cfg.py``). A failure prints as a few lines (what,
where, the fix; the log file with the full traceback for failures during the run) and the exit code says
which kind: 2 the config or a check before the run, 1 the run itself, 130 interrupted (Ctrl-C), 143
stopped by SIGTERM, 129 stopped by SIGHUP (a closed terminal or ssh session); the last three print one line
saying how to resume, also written to the run's ``logs/run.log`` (after a SIGHUP, the one place left to read
it).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import Any, TextIO

USAGE_EPILOG = """\
overrides are Hydra-style key=value pairs, before or after the options, e.g.
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
    parser.add_argument(
        "--cfg",
        "-c",
        nargs="?",
        const="",
        default=None,
        metavar="{job,hydra,all}",
        help="print the validated config and exit, after the checks a run makes before it starts (exit 2 "
        "when they find problems): bare --cfg as JSON; as Hydra does, in YAML: job (the run's config), "
        "hydra (what roll_ma has in place of Hydra's launcher settings) or all (both)",
    )
    parser.add_argument(
        "--describe", action="store_true", help="list every config key with its help and exit"
    )
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line; Ctrl-C, SIGTERM or SIGHUP at any moment ends it with one line and exit 130, 143 or
    129."""
    from roll_ma.error_report import run_line
    from roll_ma.interrupts import exit_code, stop_signals, stopped_message

    with stop_signals():
        try:
            return _main(argv)
        except KeyboardInterrupt as err:  # before the run began (reading the config); run() says it after
            run_line(f"[roll_ma] {stopped_message(err, None, 'auto')}", None, sys.stderr)
            return exit_code(err)


def _main(argv: list[str] | None) -> int:
    from roll_ma.cli_cfg import CFG_PARTS, PLAIN, cfg_argv, print_config

    # intermixed: `... key=value --cfg` is read like `--cfg ... key=value`
    parser = build_parser()
    args = parser.parse_intermixed_args(cfg_argv(list(sys.argv[1:] if argv is None else argv)))
    if args.cfg not in (None, PLAIN, *CFG_PARTS):
        parser.error(f"--cfg takes job, hydra or all (or nothing: JSON), got {args.cfg!r}")
    from roll_ma.config import ConfigError, RunConfig, available_configs
    from roll_ma.config.compose import mars_flags_to_overrides
    from roll_ma.error_report import error_prefix
    from roll_ma.interrupts import stop_behind
    from roll_ma.preflight.config_loader import load_config

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
        print(f"{error_prefix()} --config_name is required (see --list for the shipped configs)",
              file=sys.stderr)
        return 2
    overrides = mars_flags_to_overrides(args.num_agents, args.lora_rank, args.lora_alpha) + list(
        args.overrides
    )
    cfg_only = args.cfg is not None
    try:
        # --cfg checks a GPU config anywhere: everything but this machine's own GPU count
        cfg = load_config(args.config_name, args.config_path, overrides, num_agents=args.num_agents,
                          check_local_gpus=not cfg_only)
    except Exception as err:  # noqa: BLE001 - a check that failed itself: its short form and a log file
        if (stop := stop_behind(err)) is not None:  # a stop while the config was read, said as a problem
            raise stop from None
        if isinstance(err, ConfigError):
            print(f"{error_prefix()} {err}", file=sys.stderr)
            return 2
        from roll_ma.error_report import unexpected

        print(f"{error_prefix()} {unexpected(err, None)}", file=sys.stderr)
        return 1
    if (stop := stop_behind(None)) is not None:  # a stop that a check caught and dropped
        raise stop
    if cfg_only:
        return print_config(cfg, args.cfg, args.config_name, args.config_path, overrides)
    with plain_output():
        return run(cfg)


def run(cfg: Any) -> int:
    """Run a validated config; every failure is printed as its message (no driver stack), exit code back."""
    import ray

    from roll_ma.config import ConfigError
    from roll_ma.error_report import error_prefix, run_line, unexpected
    from roll_ma.errors import PreflightError, RollMaError
    from roll_ma.interrupts import exit_code, stop_behind, stopped_message
    from roll_ma.run import run_config

    ours = not ray.is_initialized()  # a Ray this run starts is stopped before its error is printed

    def fail(message: Any, code: int, prefix: str | None = None, logged: bool = False) -> int:
        if ours and ray.is_initialized():  # why: actors' late log lines would otherwise follow the message
            ray.shutdown()
        # logged: in run.log too (a stop's line; an error's traceback has its own log file)
        log_to = cfg.trainer.output_dir if logged else None
        run_line(f"{prefix or error_prefix()} {message}", log_to, sys.stderr)
        return code

    try:
        try:
            run_config(cfg)
        except Exception as err:  # an error that grew out of a stop is the stop
            if (stop := stop_behind(err)) is not None:
                raise stop from None
            raise
    except (ConfigError, PreflightError) as err:  # found before anything ran
        return fail(err, 2)
    except RollMaError as err:  # the message says what, where and the fix, and names the log file
        return fail(err, 1)
    except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM or SIGHUP (roll_ma.interrupts): say how to resume
        message = stopped_message(err, cfg.trainer.output_dir, cfg.trainer.resume, _finished_line(cfg))
        return fail(message, exit_code(err), "[roll_ma]", logged=True)
    except Exception as err:  # noqa: BLE001 - an error roll_ma does not know: its short form and a log file
        return fail(unexpected(err, cfg.trainer.output_dir), 1)
    return 0


def _finished_line(cfg: Any) -> str | None:
    """What the same command would say of a run with nothing left to do (None: work is left, or unknown)."""
    from roll_ma.preflight.output_dir import finished_run

    try:
        finished = finished_run(cfg)
    except Exception:  # noqa: BLE001 - a damaged checkpoint: the generic resume line, the rerun reports it
        return None
    return finished.line.removeprefix("[roll_ma] ") if finished is not None else None


class PlainStream:
    """A text stream that drops terminal escapes (colours, cursor moves) on their way to ``stream``."""

    def __init__(self, stream: TextIO):
        from roll_ma.error_report import plain

        self.stream = stream
        # bound now: a progress bar closed while Python shuts down writes here after imports stopped working
        self._plain = plain

    def write(self, text: str) -> int:
        self.stream.write(self._plain(text))
        return len(text)

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:  # flush, fileno, encoding, ...
        return getattr(self.stream, name)


@contextlib.contextmanager
def plain_output() -> Iterator[None]:
    """stdout / stderr without terminal escapes where they are not a terminal (a log file, a pipe): Ray's
    coloured actor prefixes and tracebacks, the progress bars' redraws."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s if s.isatty() else PlainStream(s) for s in saved)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


if __name__ == "__main__":
    sys.exit(main())
