"""OpenRLHF 0.11.2 on the side-by-side job: ``python -m openrlhf.cli.train_ppo_ray`` with GRPO-style group
advantages (``--algo.advantage.estimator group_norm``), a LoRA actor (``--ds.lora.*``), the KL as a k3 loss
and vLLM colocated with DeepSpeed on ONE GPU (``--train.colocate_all``, engine and DeepSpeed sleep), as
OpenRLHF's examples/scripts/train_dapo_ray_hybrid_engine.sh sets it up. OpenRLHF trains one policy per
run: run_all.py runs it once per agent, on that agent's prompts (job.agent_prompts).

One step = rollout.batch_size prompts x n_samples_per_prompt = train.batch_size rows = one optimizer step.
Prompts are a JSONL file of chat messages (``--data.apply_chat_template``), the reward rewards.py's
``reward_func`` (``--reward.remote_url <file.py>``), the metrics OpenRLHF's own per-step log line
(``Global step N: {... 'timing/step_total': ...}``).

flash-attn: OpenRLHF imports ``flash_attn.bert_padding`` whenever it loads its models (ring_attn_utils,
on every path, LoRA or not), and flash-attn==2.8.3 has no binary wheel for the lent GPU. Without it
this runner puts an import-only stand-in first on the path (``--flash-attn-shim``; every function raises)
and runs sdpa attention without sample packing, the only paths that never call flash-attn.

What stops it (run on an H100, 2026-12-06; docs/benchmarks.md, "Issue 60, thirteenth lease"): step 1 runs
(192 rows generated, the reference and update passes, its 12 micro-batches of 16 rows), then the weight sync
fails. The actor's start, where DeepSpeed 0.19.6 builds FusedAdam (a JIT build, with the image's nvcc), passes
once TORCH_CUDA_ARCH_LIST names the GPU's plain capability (``plain_arch_list``: ``9.0a`` does not parse).
broadcast_to_vllm (trainer/ray/ppo_actor.py:409-490) sends the PEFT model's parameters by their PEFT names
(``base_model.model.*``, unmerged ``lora_A``/``lora_B`` beside the base weights) to vLLM's ``load_weights``
on an engine started without LoRA (vllm_engine.py:263-280), which refuses the first name: OpenRLHF#1349's
third blocker, named in the result line's ``upstream_failure``. The trained adapter never reaches
generation, so there is no step 2 and no ``vllm_kl`` (its vLLM-vs-actor log-prob gap, logged when the row
turns on ``--algo.advantage.is_correction_level``) to set against ``kl``.

    python benchmarks/peers/run_openrlhf.py --agents 3 --agent 0 --model /path/to/random-qwen2.5-7b
    python benchmarks/peers/run_openrlhf.py --agents 3 --agent 0 --model M --print-command   # no run
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from job import (  # noqa: E402
    LOSS_AGG_MODE,
    Job,
    Row,
    agent_prompts,
    exit_code,
    flash_attn_installed,
    gpu_identity,
    measure_and_emit,
    micro_batch_rows,
    parse_runner_args,
    phase_medians,
    plain_sleep,
    refuse_update_rows,
    rows_of_run,
    run_logged,
    runner_parser,
    step_summary_from_ends,
    versions,
)

STEP_LINE = re.compile(r"Global step (\d+): (\{.*\})")


def openrlhf_args(
    job: Job,
    row: Row,
    n_agents: int,
    model: str,
    data_file: str,
    out_dir: str,
    flash_attn: bool,
    shared: bool = False,
) -> list[str]:
    """The train_ppo_ray arguments of one agent's run (``shared``: every seat's prompts, one adapter) at
    ``row``'s settings; its native keys are flags added as they are (``--flag: value``, true: the flag)."""
    rows, g, gpu, s = rows_of_run(job, n_agents, None if shared else 0), job.grpo, job.gpu, row.settings
    prompts = rows // job.episodes.group_size
    # OpenRLHF splits by rows, and DeepSpeed asserts train_batch = micro x accumulation: the most rows of the
    # longest possible row that fit the token budget and divide the step's rows
    row_tokens = job.prompt.max_prompt_tokens + job.generation.max_new_tokens
    micro = micro_batch_rows(rows, row_tokens, s.update_tokens)
    args = [
        "--actor.num_nodes", "1",
        "--actor.num_gpus_per_node", "1",
        "--ref.num_nodes", "1",
        "--ref.num_gpus_per_node", "1",
        "--vllm.num_engines", "1",
        "--vllm.tensor_parallel_size", "1",
        "--train.colocate_all",
        "--vllm.gpu_memory_utilization", str(gpu.rollout_memory_fraction),
        "--algo.advantage.estimator", "group_norm",
        "--algo.advantage.gamma", "1.0",
        "--actor.eps_clip_low_high", str(g.clip_low), str(g.clip_high),
        "--actor.loss_agg_mode", LOSS_AGG_MODE[g.loss_agg],
        "--actor.model_name_or_path", model,
        "--reward.remote_url", str(HERE / "rewards.py"),
        "--ckpt.output_dir", f"{out_dir}/final",
        "--ckpt.path", f"{out_dir}/ckpt",
        "--train.micro_batch_size", str(micro),
        "--train.batch_size", str(rows),  # one optimizer step per rollout
        "--rollout.micro_batch_size", str(micro),
        "--rollout.batch_size", str(prompts),
        "--rollout.n_samples_per_prompt", str(job.episodes.group_size),
        "--rollout.max_new_tokens", str(job.generation.max_new_tokens),
        "--rollout.temperature", str(job.generation.temperature),
        "--train.max_epochs", "1",
        "--train.num_episodes", "1",
        "--train.seed", str(job.seed),
        "--data.max_len", str(job.prompt.max_prompt_tokens + job.generation.max_new_tokens),
        "--data.max_samples", str(prompts * job.steps),
        "--data.prompt_dataset", data_file,
        "--data.input_key", "prompt",
        "--data.apply_chat_template",
        "--ds.param_dtype", "bf16",
        "--ds.lora.rank", str(job.lora.rank),
        "--ds.lora.alpha", str(int(job.lora.alpha)),
        "--ds.lora.dropout", str(job.lora.dropout),
        "--ds.lora.target_modules", *job.lora.target_modules,
        "--ds.attn_implementation", "flash_attention_2" if flash_attn else "sdpa",
        "--actor.adam.lr", str(job.train.lr),
        "--actor.lr_scheduler", "constant",
        "--actor.lr_warmup_ratio", "0",
    ]  # fmt: skip
    if not job.grpo.norm_std:
        args.append("--algo.advantage.no_std_norm")
    if g.kl_coef > 0:
        args += [
            "--algo.kl.use_loss",
            "--algo.kl.init_coef",
            str(g.kl_coef),
            "--algo.kl.estimator",
            g.kl_estimator,
        ]
    else:
        args += ["--algo.kl.init_coef", "0"]  # no reference model at all
    if s.gradient_checkpointing:
        args.append("--actor.gradient_checkpointing_enable")
    if plain_sleep(row):
        args += ["--vllm.enable_sleep", "--ds.enable_sleep"]
    taken = sorted(set(row.native) & {a for a in args if a.startswith("--")})
    if taken:  # one source for each setting: the job's work or the row's settings, not both
        raise ValueError(f"{job.source}: rows.{row.name}.native sets {', '.join(taken)}, which the job sets")
    for flag, value in row.native.items():
        args += [flag] if value is True else [] if value is False else [flag, str(value)]
    return args


SHIM_NOTE = (
    "roll_ma benchmarks/peers: import-only stand-in for flash-attn (no binary wheel for this GPU); "
    "OpenRLHF runs sdpa without sample packing here, which never calls it"
)


def write_flash_attn_shim(root: Path) -> Path:
    """A ``flash_attn`` package with the names OpenRLHF imports at load time, each raising if called."""
    pkg = root / "flash_attn"
    (pkg / "utils").mkdir(parents=True, exist_ok=True)
    stub = f"def _missing(*args, **kwargs):\n    raise NotImplementedError({SHIM_NOTE!r})\n\n\n"
    (pkg / "__init__.py").write_text(f'"""{SHIM_NOTE}"""\n')
    names = ("index_first_axis", "pad_input", "rearrange", "unpad_input")
    (pkg / "bert_padding.py").write_text(stub + "".join(f"{n} = _missing\n" for n in names))
    (pkg / "utils" / "__init__.py").write_text("")
    (pkg / "utils" / "distributed.py").write_text(stub + "all_gather = _missing\n")
    return root


def write_prompts(job: Job, n_agents: int, agent: int | None, path: Path) -> Path:
    """The agent's prompts of every step, in step order, one JSON object per line ({"prompt": messages})."""
    with path.open("w") as f:
        for step in agent_prompts(job, n_agents, agent):
            for messages in step:
                f.write(json.dumps({"prompt": messages}) + "\n")
    return path


def parse_steps(output: str) -> list[dict[str, float]]:
    """The numbers of OpenRLHF's per-step log lines (``Global step N: {...}``), in step order."""
    steps = {}
    for line in output.splitlines():
        m = STEP_LINE.search(line)
        if not m:
            continue
        nums = re.findall(r"'([\w/]+)': (?:np\.float64\()?([-+0-9.eE]+|nan|inf)", m.group(2))
        steps[int(m.group(1))] = {k: float(v) for k, v in nums}
    return [steps[k] for k in sorted(steps)]


# What ends an OpenRLHF 0.11.2 LoRA run on this stack, each as its output says it (the earliest one found
# is the cause; later ones follow from it); the name says where it comes from.
UPSTREAM_FAILURES = (
    (
        r"invalid literal for int\(\) with base 10: '\d+[a-z]",
        "DeepSpeed 0.19.6's JIT builder cannot read an arch-specific TORCH_CUDA_ARCH_LIST entry such as "
        "9.0a (op_builder/builder.py:708); this runner names the GPU's plain capability instead",
    ),
    (
        r"CUDA_HOME environment variable is not set|CUDA_HOME does not exist|nvcc: not found",
        "no nvcc for DeepSpeed's FusedAdam JIT build (OpenRLHF 0.11.2 has no flag for torch's Adam)",
    ),
    (
        r"Error building extension 'fused_adam'",
        "DeepSpeed's FusedAdam JIT build failed (the compiler's output is above it)",
    ),
    (
        r"mismatch dtype: src torch\.float32, dst torch\.bfloat16",
        "OpenRLHF#1349 (1): fp32 LoRA weights sent to a bf16 vLLM engine (PR #1348 casts them)",
    ),
    (r"pidfd_getfd", "OpenRLHF#1349 (2): the CUDA-IPC handoff of the weights to vLLM is not permitted here"),
    (
        r"no module or parameter named \W*base_model",
        "OpenRLHF#1349 (3): broadcast_to_vllm sends the PEFT model's parameter names (base_model.model.*, "
        "lora_A/lora_B) to vLLM's load_weights, which has none of them: the trained adapter never reaches "
        "generation",
    ),
)


def upstream_failure(output: str) -> str | None:
    """The name of the known failure that shows first in OpenRLHF's output, None if none shows."""
    found = [(m.start(), name) for pattern, name in UPSTREAM_FAILURES if (m := re.search(pattern, output))]
    return min(found)[1] if found else None


def plain_arch_list(arch: str) -> str:
    """``arch`` (TORCH_CUDA_ARCH_LIST, ``;`` or space separated) without arch-specific suffixes, deduplicated:
    "8.0 9.0a 10.0f+PTX" -> "8.0;9.0;10.0+PTX". DeepSpeed 0.19.6 reads every part of an entry as an int
    (op_builder/builder.py:708); a plain 9.0 build of FusedAdam needs none of Hopper's own instructions."""
    plain = [re.sub(r"^(\d+\.\d+)[a-z]+", r"\1", cc) for cc in re.split(r"[;\s]+", arch) if cc]
    return ";".join(dict.fromkeys(plain))


def nvcc_path(env: dict[str, str]) -> str | None:
    """The nvcc a JIT build in ``env`` would run, looked for as torch.utils.cpp_extension finds CUDA_HOME
    (CUDA_HOME or CUDA_PATH, else nvcc on PATH, else /usr/local/cuda); None if there is none."""
    import shutil

    for home in (env.get("CUDA_HOME"), env.get("CUDA_PATH")):
        if home:
            return str(Path(home) / "bin" / "nvcc") if (Path(home) / "bin" / "nvcc").exists() else None
    found = shutil.which("nvcc", path=env.get("PATH"))
    return found or (str(p) if (p := Path("/usr/local/cuda/bin/nvcc")).exists() else None)


def adapter_evidence(steps: list[dict[str, float]]) -> dict[str, list[float | None]]:
    """Per step, what says whether vLLM generated from the trained weights: ``vllm_kl``, the mean gap
    between vLLM's log-probs of its own tokens and the actor's (logged only with is_correction on), and
    ``kl``, the actor's from the reference (the base model). Step 1 samples before any update, so its
    vllm_kl is the two engines' numerical floor; past it, a vllm_kl that stays at the floor while kl grows
    well above it means the rollouts used the trained adapter, one that follows kl means the base."""
    return {key: [s.get(key) for s in steps] for key in ("vllm_kl", "kl")}


def gpu_arch_list() -> str | None:
    """The visible GPUs' compute capabilities as TORCH_CUDA_ARCH_LIST wants them ("9.0"), from nvidia-smi
    (no CUDA context in this process); None where there is no nvidia-smi."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    caps = sorted({c.strip() for c in out.splitlines() if c.strip()})
    return ";".join(caps) or None


def run(
    job: Job, row: Row, n_agents: int, agent: int | None, model: str, shim: bool, work: Path
) -> dict[str, Any]:
    data = write_prompts(job, n_agents, agent, work / "prompts.jsonl")
    flash = flash_attn_installed()
    env = dict(os.environ)
    if shim and not flash:  # Ray's workers inherit the driver's PYTHONPATH
        env["PYTHONPATH"] = os.pathsep.join(
            [str(write_flash_attn_shim(work / "shim")), env.get("PYTHONPATH", "")]
        )
    # the GPU's own capability first: the image's list (which its last run kept, and which held "9.0a")
    # would also make the FusedAdam JIT build compile for every GPU it names
    arch = gpu_arch_list() or env.get("TORCH_CUDA_ARCH_LIST")
    if arch:
        env["TORCH_CUDA_ARCH_LIST"] = plain_arch_list(arch)
    cmd = [
        sys.executable,
        "-m",
        "openrlhf.cli.train_ppo_ray",
        *openrlhf_args(job, row, n_agents, model, str(data), str(work), flash, shared=agent is None),
    ]
    output, outcome, step_ends = run_logged(cmd, env, "run_openrlhf", STEP_LINE)
    steps = parse_steps(output)
    lengths = sorted(s["response_length"] for s in steps[job.warmup_steps :] if "response_length" in s)
    rows = rows_of_run(job, n_agents, agent)
    out: dict[str, Any] = {
        **step_summary_from_ends(step_ends, job.warmup_steps, started_at=0.0),  # ends: s since launch
        # OpenRLHF's own per-step timers, every one it logs (its names change between releases)
        "phases_s": phase_medians(
            steps,
            {k: k for k in sorted({k for s in steps for k in s if k.startswith("timing/")})},
            job.warmup_steps,
        ),
        "rows_per_step": rows,
        "response_tokens_per_step": lengths[len(lengths) // 2] * rows if lengths else None,
        **outcome,
        "attention": "flash_attention_2" if flash else "sdpa",
        "flash_attn": "installed" if flash else ("import-only stand-in" if shim else "missing"),
        "torch_cuda_arch_list": env.get("TORCH_CUDA_ARCH_LIST"),
        "nvcc": nvcc_path(env),
        "upstream_failure": upstream_failure(output) if outcome["returncode"] else None,
        "adapter_evidence": adapter_evidence(steps),
    }
    return out


def train_ppo_ray_flags() -> list[str] | None:
    """Patterns of every flag the installed OpenRLHF's train_ppo_ray takes (read from its source, not
    imported; a flag built by an f-string is a pattern), None where OpenRLHF is not installed."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("openrlhf")
    path = Path(spec.origin).parent / "cli" / "train_ppo_ray.py" if spec and spec.origin else None
    if path is None or not path.exists():
        return None
    flags = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for a in node.args:
                if isinstance(a, ast.Constant) and str(a.value).startswith("--"):
                    flags.append(re.escape(a.value))
                elif isinstance(a, ast.JoinedStr):
                    flags.append("".join(re.escape(v.value) if isinstance(v, ast.Constant) else r"\w+"
                                         for v in a.values))  # fmt: skip
    return flags


def check_row(job: Job, row: Row, n_agents: int | None = None, flags: list[str] | None = None) -> None:
    """Refuse, before OpenRLHF starts, what its run cannot take, naming the row's key: a native flag that
    train_ppo_ray does not have (``flags``: its flag patterns, default the installed OpenRLHF's; none
    installed: skipped), update_rows (its micro-batches come from the token budget here), kv_cache sleep."""
    where = f"{job.source}: rows.{row.name}"
    plain_sleep(row)
    refuse_update_rows(job, row, "this runner sizes OpenRLHF's micro-batches from settings.update_tokens")
    flags = flags if flags is not None else train_ppo_ray_flags()
    if flags is not None:
        unknown = [k for k in row.native if not any(re.fullmatch(f, k) for f in flags)]
        if unknown:
            raise ValueError(f"{where}.native: {', '.join(unknown)} are not flags of its train_ppo_ray")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = runner_parser(__doc__)
    p.add_argument(
        "--flash-attn-shim",
        action="store_true",
        help="if flash-attn is not installed, put an import-only stand-in on the path (see above)",
    )
    p.add_argument("--print-command", action="store_true", help="print the arguments and exit")
    args, job, row = parse_runner_args(p, argv, "openrlhf", check_row)
    if args.print_command:
        flash = flash_attn_installed()
        print(
            " ".join(
                openrlhf_args(job, row, args.agents, args.model, "PROMPTS.jsonl", "OUT", flash, args.shared)
            )
        )
        return {}
    result: dict[str, Any] = {
        "framework": "openrlhf",
        "row": row.name,
        "settings": f"{row.name}: {row.describe()}",
        "agents": args.agents,
        "agent": args.agent,
        "shared": args.shared,
        "versions": versions(
            "openrlhf", "torch", "transformers", "peft", "vllm", "ray", "deepspeed", "flash-attn"
        ),
        **gpu_identity(),
    }

    def measure() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="peers_openrlhf_") as work:
            return run(job, row, args.agents, args.agent, args.model, args.flash_attn_shim, Path(work))

    return measure_and_emit(result, measure)


if __name__ == "__main__":
    sys.exit(exit_code(main()))
