"""Typed config of a roll_ma run.

Every field is documented with ``help`` in its metadata; ``min``/``max`` give the allowed
range. ``roll_ma.config.compose`` turns a Hydra-composed yaml into these dataclasses and
``roll_ma.preflight.validate`` checks them before any Ray actor starts. Workers receive only
the pieces they need (``ModelConfig``, ``TrainConfig``, ...), never the whole tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from roll_ma.config.fields import config_field as _f
from roll_ma.config.schema_phases import DPOConfig, PhaseConfig, SFTConfig

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class ModelConfig:
    """The shared base model every agent's adapter sits on."""

    path: str = _f(
        "builtin:tiny",
        "local directory or hub name (e.g. Qwen/Qwen2.5-1.5B-Instruct); "
        "'builtin:tiny' is the model shipped with roll_ma, 'builtin:tiny-habits' its variant whose "
        "tiny Hanabi answers depend on what it sees (the tiny Hanabi demo's base)",
    )
    tokenizer_path: str | None = _f(None, "tokenizer location if it differs from path")
    dtype: Literal["float32", "bfloat16", "float16"] = _f("float32", "weights and compute dtype")
    trust_remote_code: bool = _f(False, "passed to transformers' from_pretrained")
    max_prompt_tokens: int = _f(
        512, "prompts longer than this are cut from the left (system message kept)", min=8
    )
    gradient_checkpointing: bool = _f(False, "recompute activations in the backward pass to save memory")
    attn_implementation: str | None = _f(
        None,
        "transformers attention implementation (sdpa, eager, flash_attention_2, ...). Unset: sdpa, except "
        "in the train and reference models, which use roll_ma_varlen (packed rows through PyTorch's "
        "variable-length flash attention on CUDA, one sdpa call per row on CPU; padded rows through sdpa)",
    )
    liger_kernel: Literal["auto", True, False] = _f(
        "auto",
        "train and reference models: liger-kernel's fused RMSNorm, SwiGLU and rotary Triton kernels "
        "(pip install 'roll_ma[liger]'; CUDA GPUs only; the model types liger patches: Qwen2/3, Llama, "
        "Mistral, Gemma, Phi-3, ...); roll_ma's chunked LM-head log-probs stay as they are. auto: on "
        "wherever they can run (a CUDA GPU, liger-kernel installed, a model type liger patches), else off "
        "with one line that says why; true: on, refused where they cannot run; false: off",
    )
    random_weights: bool = _f(
        False,
        "BENCHMARKS ONLY: build path's architecture with random weights and a small built-in tokenizer "
        "instead of loading it (for GPU hosts without a model hub). path names a known model "
        "(Qwen/Qwen2.5-{0.5B,1.5B,3B,7B}[-Instruct]) or a shape (qwen2.5-7b); built once into "
        "~/.cache/roll_ma/random_models. The run says so in its first line and logs system/random_weights=1",
    )


@dataclass
class LoraConfig:
    """LoRA settings; the top-level block is the default, an agent may override each field."""

    rank: int = _f(8, "LoRA rank r", min=1, max=1024)
    alpha: float = _f(16.0, "LoRA scaling alpha (scale = alpha / rank)", min=0)
    dropout: float = _f(0.0, "dropout on the LoRA input", min=0.0, max=1.0)
    target_modules: list[str] = _f(help="module names that get an adapter", factory=lambda: list(ALL_LINEAR))


@dataclass
class AgentLoraOverride:
    rank: int | None = _f(None, "this agent's LoRA rank (default: lora.rank)", min=1, max=1024)
    alpha: float | None = _f(None, "this agent's LoRA alpha (default: lora.alpha)", min=0)
    dropout: float | None = _f(None, "this agent's LoRA dropout (default: lora.dropout)", min=0.0, max=1.0)
    target_modules: list[str] | None = _f(None, "this agent's target modules (default: lora.target_modules)")

    def resolve(self, default: LoraConfig) -> LoraConfig:
        """This agent's LoRA: each override set here, else the field of ``default`` (the top-level block).
        The one place the rule lives: config checks, adapter planning and resume checks all call it."""
        return LoraConfig(
            rank=self.rank if self.rank is not None else default.rank,
            alpha=self.alpha if self.alpha is not None else default.alpha,
            dropout=self.dropout if self.dropout is not None else default.dropout,
            target_modules=list(
                self.target_modules if self.target_modules is not None else default.target_modules
            ),
        )


@dataclass
class AgentConfig:
    """One agent: a name, the adapter it trains, and how it trains."""

    name: str = _f("agent", "unique agent name, used in metrics (agent/<name>/...) and in env.seats")
    adapter: str | None = _f(
        None, "adapter this agent uses; agents naming the same adapter share it (default: the agent's name)"
    )
    lora: AgentLoraOverride = _f(help="per-agent LoRA overrides", factory=AgentLoraOverride)
    frozen: bool = _f(False, "never update this agent (a fixed opponent or critic)")
    update_every: int = _f(1, "update this agent only every k steps", min=1)
    lr: float | None = _f(None, "this agent's learning rate (default: train.lr)", min=0.0)
    system_prompt: str | None = _f(
        None, "system prompt of this agent (default: the env's prompt for its role)"
    )
    kind: str | None = _f(
        None, "role kind in role-based envs (math: solver, critic, refiner); default: the name"
    )
    init_adapter: str | None = _f(None, "directory of a PEFT adapter to start this agent from")
    process: str | None = _f(
        None,
        "team envs (env.name=marft): a hook file 'path/to/file.py' or dotted module holding "
        "pre_process(tokenizer, prompt_ids, obs_ids, **pre_process_kwargs) -> prompt_ids (this agent's "
        "prompt "
        "from the team context and the env's observation) and/or post_process(tokenizer, prompt_ids, "
        "response_ids, **post_process_kwargs) -> prompt_ids (the team context after this agent spoke); "
        "roll_ma/envs/team_hooks.py. Unset: a chat prompt of observation + context, the response appended",
    )
    pre_process_kwargs: dict[str, Any] = _f(help="keyword arguments of this agent's pre_process",
                                            factory=dict)
    post_process_kwargs: dict[str, Any] = _f(help="keyword arguments of this agent's post_process",
                                             factory=dict)
    obs_with_env: bool = _f(
        True, "team envs: this agent reads the env's observation (false: pre_process gets empty obs_ids)"
    )

    @property
    def adapter_name(self) -> str:
        return self.adapter or self.name


@dataclass
class DataConfig:
    """Where problems come from (math envs: problem / answer records; workflows: any task records)."""

    source: str = _f(
        "synthetic",
        "'synthetic' (built-in arithmetic), 'builtin:code_tasks' (workflows: small Python tasks with tests) "
        "or a local .parquet/.jsonl/.json file (a workflow gets each record whole unless a preset or keys "
        "are set)",
    )
    preset: Literal["auto", "deepscaler", "gsm8k", "math500", "custom"] = _f(
        "auto", "column mapping preset for files"
    )
    problem_key: str | None = _f(None, "problem column (preset custom)")
    answer_key: str | None = _f(None, "answer column (preset custom)")
    difficulty: int = _f(2, "synthetic difficulty level", min=1, max=5)
    num_problems: int = _f(20000, "synthetic training problems", min=1)
    eval_source: str | None = _f(None, "eval file (default: a held-out synthetic split)")
    num_eval_problems: int = _f(200, "evaluation problems", min=1)


@dataclass
class EnvConfig:
    """The environment: which env, who sits where, how many episodes per step."""

    name: str = _f(
        "math_selfplay",
        "registered env name, import path 'pkg.module:Class' or file 'path/to/file.py:Class' (a relative "
        "path is looked up from where the run starts, then the roll_ma checkout; unused with env.workflow)",
    )
    path: str | None = _f(
        None,
        "env.name=marft: the task the team plays, 'path/to/file.py:Class' or 'pkg.module:Class', a class "
        "with reset(problem) -> obs and step(actions, ground_truth) -> (obs, reward, done) (actions: agent "
        "name -> its answer this round); env.kwargs go to its constructor. Unset: the built-in math task "
        "(reward 1 when the last agent's \\boxed{} answer is right)",
    )
    max_assistant_turns: int | None = _f(
        None,
        "env.name=marft: agent turns per episode, a multiple of the team size (each round every agent "
        "speaks once, in config order; default: one round)",
        min=1,
    )
    workflow: str | None = _f(
        None,
        "a workflow instead of a turn-based env: 'path/to/file.py:Name' or 'pkg.module:Name', a class with "
        "`async def run(self, task, agents)` or an `async def f(task, agents)` that calls agents by name and "
        "returns per-agent rewards (roll_ma.workflows); env.kwargs then go to its constructor / function",
    )
    kwargs: dict[str, Any] = _f(
        help="env-specific settings, passed to the env constructor (or the workflow's)", factory=dict
    )
    tools: dict[str, dict[str, Any]] = _f(
        help="workflows: tools handed to run() as `tools`, name -> settings, e.g. {python: {timeout_s: 5, "
        "memory_mb: 512}, search: {tool: 'my_pkg.tools:Search'}} (`tool`: a registered name, import path or "
        "'path/to/file.py:Name', "
        "default the name; the rest go to its constructor; roll_ma.workflows.tools)",
        factory=dict,
    )
    on_workflow_error: Literal["raise", "skip"] = _f(
        "raise",
        "workflows: raise = a workflow that raises stops the run, naming its file and line; skip = the "
        "episode counts as failed (rollout/env/workflow_failed), its rows are dropped and the run goes on",
    )
    seats: list[str] | None = _f(
        None,
        "agent name per seat / role (games: 'random' or 'scripted' for a "
        "built-in opponent); default: agents in order, or one agent in every seat",
    )
    num_workers: int = _f(1, "env worker actors", min=1)
    groups_per_step: int = _f(8, "episode groups per step (problems / seeds)", min=1)
    group_size: int = _f(4, "episodes per group (GRPO samples per problem / seed)", min=1)
    max_turns: int = _f(64, "safety cap on turns per episode (workflows: on generate calls)", min=1)
    max_rounds: int = _f(
        5,
        "reflection envs (math_reflection): the actor's answers per episode, its first answer and the "
        "refinements after each critique (the K of p1@tK and m1@tK)",
        min=1,
    )
    data: DataConfig = _f(help="math problems", factory=DataConfig)
    eval_episodes: int = _f(64, "episodes per evaluation (games) ", min=1)
    eval_opponent: str = _f("random", "built-in opponent for game evaluation: random or scripted")
    show_greedy_moves: bool = _f(
        False,
        "SAD (Hu & Foerster, 2020): also decode every sampled model move greedily and show the "
        "other players that greedy move next to the sampled one, so exploration does not blur "
        "the signal; envs that support it only (tiny_hanabi)",
    )
    batch_encode: bool = _f(
        True,
        "a round's chat prompts encoded together: every prompt's cut search (over-long histories) in "
        "lockstep, each probe one batched tokenizer call on all CPU cores (the same ids and cuts as one "
        "prompt at a time on one core); envs that give their own prompt ids are unaffected",
    )
    decode_ahead: bool = _f(
        True,
        "envs that plan their turns (prompts that never depend on a reply, MultiAgentEnv.planned_turns): "
        "decode an episode's remaining turns in the same generate call as its current one; false: one "
        "round per turn (the same rows and, with per-row seeds, the same samples)",
    )


@dataclass
class RolloutConfig:
    """Generation: backend, sampling, engine settings."""

    backend: str = _f(
        "hf", "hf (transformers + PEFT) or vllm (one engine, all adapters); or your own class implementing "
        "roll_ma.inference.infer_backend.InferBackend as 'path/to/file.py:Name' or 'pkg.module:Name' "
        "(imported by the driver and every rollout worker), or a name registered with "
        "roll_ma.inference.INFER_STRATEGIES.register"
    )
    num_workers: int = _f(
        1, "rollout worker actors (data parallel: each is one engine serving every adapter; a step's "
        "requests are split across them, and every sync installs each new adapter in all of them)", min=1
    )
    tensor_parallel: int = _f(
        1,
        "vllm: GPUs one engine is sharded over (vLLM's tensor_parallel_size), all on one node. Each "
        "rollout worker then takes this many whole GPUs of resources.device_mapping.rollout (num_workers x "
        "tensor_parallel entries), which no other role may share (default mapping: GPUs after the "
        "train/reference ones); 1: one GPU per engine, colocation allowed",
        min=1,
    )
    temperature: float = _f(1.0, "sampling temperature", min=0.0)
    top_p: float = _f(1.0, "nucleus sampling", min=0.0, max=1.0)
    max_new_tokens: int = _f(32, "cap on generated tokens per turn", min=1)
    stop: list[str] = _f(help="stop strings", factory=list)
    micro_batch_size: int = _f(64, "hf: rows per generate call", min=1)
    gpu_memory_utilization: float = _f(
        0.4, "vllm: fraction of GPU memory for weights + KV cache", min=0.01, max=1.0
    )
    enforce_eager: bool = _f(False, "vllm: skip CUDA graphs (faster start, slower decode)")
    sleep_level: Literal[0, 1, "kv_cache"] = _f(
        "kv_cache",
        "vllm, colocated: what the engine frees while the trainer works. kv_cache: its KV cache only (the "
        "weights stay on the GPU: a LoRA run never changes them, and their round trip through host memory "
        "was most of what a sleep cost: 0.93 -> 0.23 s of sleep + sync a 7B step, docs/benchmarks.md); 1: "
        "vLLM's sleep level 1 (the weights copied to host memory and back each step, the KV cache dropped: "
        "the trainer also gets the weights' room, ~15 GB at 7B); 0: nothing (the engine stays awake)",
        refused={2: "vLLM's sleep level 2 discards the weights, which breaks reloading LoRA adapters into "
                    "the engine (verl #3516); 1 frees the weights' memory too and keeps them"},
    )
    max_num_seqs: int = _f(256, "vllm: max concurrent sequences", min=1)
    max_staleness: int = _f(
        0,
        "0: the synchronous loop (roll out, update, sync, repeat). k >= 1: the next step's rollout runs "
        "while the trainer updates on this one, each agent's new adapter is pushed to the engines as "
        "soon as its own update ends, rows whose agent's adapter is more than k versions newer than "
        "the one that generated them are dropped, and the update uses decoupled PPO "
        "(algorithm.is_weight_cap). Needs the engine awake during the update (its own GPU, or "
        "rollout.sleep_level=0)",
        min=0,
    )
    adapter_sync: Literal["memory", "disk"] = _f(
        "memory",
        "vllm: how new adapter weights reach the engine. memory: the tensors go straight into vLLM's LoRA "
        "slots (collective_rpc into its worker, no files); disk: a PEFT directory on /dev/shm loaded with "
        "add_lora (vLLM's public path)",
    )
    per_row_seeds: bool = _f(
        True,
        "seed every sampled row from (run seed, episode, turn), so a row's sample does not depend on "
        "how rows are batched or split over workers. vLLM then samples with one generator per row, "
        "which slows GPU decoding; false: the engine's own generator (still seeded per worker)",
    )
    log_probs: bool = _f(
        True,
        "have the engine report each sampled token's log-prob (rollout_log_probs), which the "
        "trainer-vs-rollout check compares with the trainer's (agent/<name>/logprob_gap); costs a "
        "log-softmax over the vocabulary per generated token",
    )
    engine_kwargs: dict[str, Any] = _f(help="extra keyword arguments for vllm.LLM", factory=dict)


@dataclass
class TrainConfig:
    """Policy update: strategy, optimizer, batch shapes."""

    strategy: str = _f(
        "multi_agent_deepspeed",
        "multi_agent_deepspeed (one adapter per agent) or deepspeed_train (one policy); or your own class "
        "implementing roll_ma.training.train_backend.TrainBackend as 'path/to/file.py:Name' or "
        "'pkg.module:Name' (imported by the driver and every train worker), or a name registered with "
        "roll_ma.training.TRAIN_STRATEGIES.register",
    )
    objective: Literal["ppo", "sft", "dpo"] = _f(
        "ppo",
        "what a run without `phases` trains: ppo (the RL loop), sft (one SFT phase, the sft block) or "
        "dpo (one DPO phase, the dpo block); every agent learns from its own rows with its own optimizer",
    )
    num_workers: int = _f(
        1, "data-parallel train ranks (DeepSpeed, one GPU each): every agent's rows are split across them "
        "and their gradients all-reduced, with ZeRO sharding as train.zero_stage says", min=1
    )
    zero_stage: int = _f(
        0, "DeepSpeed ZeRO stage (0, 1, 2)", min=0, max=2,
        max_why="ZeRO-3 is not supported: it partitions the shared base under every agent's engine; use 0, 1 "
        "or 2, as LoRA optimizer states are small and ZeRO-2 already shards them",
    )
    lr: float = _f(5e-4, "learning rate", min=0.0)
    weight_decay: float = _f(0.0, "AdamW weight decay", min=0.0)
    betas: list[float] = _f(help="AdamW betas", factory=lambda: [0.9, 0.999])
    eps: float = _f(1e-8, "AdamW eps", min=0.0)
    lr_schedule: Literal["constant", "linear", "cosine"] = _f(
        "constant", "learning-rate schedule after warmup"
    )
    warmup_steps: int = _f(0, "optimizer steps of linear warmup", min=0)
    micro_batch_size: int = _f(
        16, "rows per forward/backward (when max_tokens_per_micro_batch is unset)", min=1
    )
    max_tokens_per_micro_batch: int | None = _f(
        None,
        "token budget of one forward/backward: rows x padded width, or the packed length with "
        "remove_padding. Rows are sorted by length and packed first-fit, so memory follows tokens, not "
        "rows (a row longer than the budget runs alone). Unset: micro_batch_size rows",
        min=1,
    )
    score_max_tokens_per_micro_batch: int | None = _f(
        None,
        "token budget of one forward when scoring old and reference log-probs (no activations are "
        "kept, so 2-4x the training budget fits); unset: max_tokens_per_micro_batch",
        min=1,
    )
    remove_padding: bool = _f(
        False,
        "pack each micro-batch's rows into one sequence without padding (position ids restart per row). "
        "The train and reference models' default attention (roll_ma_varlen) runs it as variable-length "
        "flash attention on CUDA (one sdpa call per row on CPU), as flash_attention_2/3 do; with "
        "model.attn_implementation=sdpa or eager, transformers builds a block-diagonal mask over the whole "
        "micro-batch (correct, but quadratic in its length: keep it off there)",
    )
    share_prompt_prefix: Literal["auto", True, False] = _f(
        "auto",
        "with remove_padding: the rows of one GRPO group (same agent, same prompt tokens) run their shared "
        "prompt once in the scoring and update passes, each reply attending to it (same log-probs and "
        "gradients as repeating it; a budget counts the prompt once). Saves the prompt's repeats: ~30% of "
        "the trainer's tokens with 8 samples of 136-token prompts and 256-token replies. Samples that "
        "branch from one history (rows of one group_id whose prompts go on with each sample's own earlier "
        "replies) run their common prefix once, wherever that saves more than identical prompts. (With "
        "lora.dropout > 0 a group's shared prompt draws one dropout mask for all its rows.) auto: on "
        "wherever "
        "rows are packed under the default attention (roll_ma_varlen); packed rows under another "
        "model.attn_implementation run it off, with one line saying so. true: refused where it cannot run",
    )
    lora_compute_dtype: Literal["float32", "model"] = _f(
        "model",
        "the dtype each LoRA branch computes in during training and scoring. float32: PEFT's way, every "
        "LoRA input (tokens x hidden) is cast to the adapter's fp32 and the branch's output back; model: "
        "the base model's dtype (bf16 on the GPU configs), each adapter factor cast to it per call (the "
        "weights, their gradients and the optimizer stay fp32). On a float32 model both are the same",
    )
    logits_chunk_tokens: int = _f(
        1024,
        "response tokens per LM-head chunk: log-probs and entropy are computed chunk by chunk and "
        "recomputed in the backward pass, so the (tokens x vocabulary) logits never exist for a whole "
        "micro-batch (0: one chunk). Qwen2/3, Llama, Mistral, Phi-3; other models use full logits",
        min=0,
    )
    mini_batch_size: int | None = _f(None, "rows per optimizer step per agent (default: all its rows)", min=1)
    ppo_epochs: int = _f(1, "passes over each step's rows", min=1)
    reuse_update_log_probs: bool = _f(
        True,
        "on-policy steps (one epoch, one mini-batch per policy, max_staleness 0, kl_mode=loss, no LoRA "
        "dropout) take log pi_old from the update's own forward, detached, instead of a scoring pass "
        "over every token (the same loss and gradient: the ratio is exactly 1; the rows of agents the "
        "step does not train are still scored, for their trainer-vs-rollout gap); other steps score pi_old",
    )
    grad_clip: float = _f(1.0, "max gradient norm (0 disables)", min=0.0)
    full_finetune: bool = _f(
        False, "train all base weights instead of one adapter (a train.strategy that supports it: "
        "deepspeed_train)"
    )
    use_all_traj: bool = _f(
        True,
        "train on every turn of every round; false: only each agent's last turn of an episode (the last "
        "round's turns; earlier turns still shape the GAE advantages through the critic's values)",
    )
    train_cycle: int = _f(
        1, "every agent updates only every k steps (an agent's own update_every other than 1 wins)", min=1
    )


@dataclass
class TeacherConfig:
    """A teacher model served by its own rollout workers, without adapters (sft.source=teacher)."""

    model: ModelConfig = _f(
        help="the teacher's model (any model.path: a larger model on its own GPUs, or builtin:tiny on CPU); "
        "its path is empty when there is no teacher",
        factory=lambda: ModelConfig(path=""),
    )
    rollout: RolloutConfig = _f(
        help="the teacher's generation (backend, workers, sampling)", factory=RolloutConfig
    )


@dataclass
class ReferenceConfig:
    """Where reference log-probs (the KL anchor) come from."""

    mode: Literal["train_worker", "worker", "none"] = _f(
        "train_worker",
        "train_worker: adapters disabled on the train worker (no second copy); "
        "worker: a reference worker holding the base; none: no reference (kl_coef must be 0)",
    )
    num_workers: int = _f(1, "reference worker actors (mode worker)", min=1)


@dataclass
class AlgorithmConfig:
    """Advantages and losses."""

    advantage: str = _f(
        "grpo",
        "grpo: normalise within (group, agent); reinforce_pp: baseline per agent, normalised per agent; "
        "gae: PPO with a value critic (the critic block), token-level GAE over each agent's turns of an "
        "episode; or your own estimator as 'path/to/file.py:fn' or 'pkg.module:fn' (imported by the driver), "
        "or a name registered with roll_ma.algorithms.algorithm_registry.register_advantage_estimator",
    )
    policy_loss: str = _f(
        "ppo_clip",
        "ppo_clip: PPO's clipped surrogate (clip_ratio_low/high, loss_agg); or your own loss as "
        "'path/to/file.py:fn' or 'pkg.module:fn' (imported by every train worker), or a name registered "
        "with roll_ma.algorithms.algorithm_registry.register_policy_loss",
    )
    gamma: float = _f(1.0, "discount of turn rewards back through an agent's earlier turns (gae: per token)",
                      min=0.0, max=1.0)
    lam: float = _f(1.0, "gae: the GAE lambda (1: Monte-Carlo return minus value, 0: one-step TD)",
                    min=0.0, max=1.0)
    share_reward_in_agent: bool = _f(
        False,
        "team reward: every reward of an episode also reaches each other agent's latest turn before it (an "
        "Actor's reward is the Reasoner's too, MARFT); false: an agent gets only its own turns' rewards "
        "(0 where nothing rewards it). agent/<name>/reward_trained shows what each agent trained on",
    )
    is_weight_cap: float = _f(
        2.0,
        "rollout.max_staleness > 0: cap on the decoupled objective's importance weight pi_old / pi_rollout "
        "per token (rows from older adapters are weighted by it, PPO's clip is taken against pi_old)",
        min=1.0,
    )
    norm_std: bool = _f(True, "divide advantages by the std (GRPO) / per-agent std (REINFORCE++)")
    clip_ratio_low: float = _f(0.2, "PPO clip epsilon below 1", min=0.0)
    clip_ratio_high: float = _f(0.2, "PPO clip epsilon above 1", min=0.0)
    kl_coef: float = _f(0.0, "weight of the KL to the reference", min=0.0)
    kl_estimator: Literal["k1", "k3"] = _f("k3", "KL estimator")
    kl_mode: Literal["loss", "reward"] = _f("loss", "KL as a loss term or as a reward penalty")
    entropy_coef: float = _f(0.0, "entropy bonus weight", min=0.0)
    entropy_decay_steps: int = _f(
        0,
        "decay entropy_coef and study.action_entropy_coef linearly to 0 at this step (0: constant); "
        "explore early, then let the agents commit (gets independent learners out of a safe "
        "joint action, e.g. tiny Hanabi)",
        min=0,
    )
    loss_agg: Literal["token_mean", "seq_mean"] = _f(
        "token_mean",
        "how token losses are averaged: over every response token, or (seq_mean) per row, then over "
        "rows, a row without a response token counting as one (TRL's loss_type='grpo' does so; verl "
        "leaves such rows out)",
    )


@dataclass
class StudyConfig:
    """Game-study helpers beside the RL algorithm: joint policy search, action entropy, class balance.

    Used by the tiny Hanabi demo and the math critic. The keys lived in ``algorithm`` before; loading
    refuses the old spelling and names the new one (``MOVED_KEYS``).
    """

    action_entropy_coef: float = _f(
        0.0,
        "bonus on the entropy of each game turn's choice among its legal actions: every legal "
        "action's answer is scored under the policy and the scores renormalised, so unlike "
        "algorithm.entropy_coef it never pushes mass onto malformed answers (one extra forward per legal "
        "action and row; decays with algorithm.entropy_decay_steps; games only)",
        min=0.0,
    )
    balance_reward_classes: bool = _f(
        False,
        "weight advantages so each reward class the env labels (info['reward_class'], e.g. whether "
        "the answer a critic judged was right) weighs the same per agent; keeps a verifier from "
        "collapsing to the majority verdict",
    )
    joint_search_every: int = _f(
        0,
        "every k steps (0: never), search the game tree from the agents' greedy joint policy for a "
        "better one (one seat's action changed at one information set, the other seats "
        "best-responding; JPS) and distill it into the adapters: gets independent learners out of "
        "a joint policy no single seat can improve (tiny Hanabi's 9 of 10). Small common-payoff "
        "OpenSpiel games only",
        min=0,
    )
    joint_search_depth: int = _f(
        2, "how many information sets the search may force another action at, at once (1 or 2; "
        "some conventions pay only when a seat changes two moves together)", min=1, max=3,
    )
    joint_search_min_gain: float = _f(
        0.05, "distill only when the found joint policy beats the greedy one by more than this", min=0.0
    )
    joint_search_distill_steps: int = _f(
        300, "at most this many supervised steps per agent to distill a found joint policy", min=1
    )
    joint_search_stop_prob: float = _f(
        0.9, "distillation stops once every information set picks its target with this probability",
        min=0.0, max=1.0,
    )


@dataclass
class CriticConfig:
    """The value critic of algorithm.advantage=gae: a value head, its own LoRA adapter on the shared base."""

    share: bool = _f(
        True,
        "true: one critic for all agents, trained on every agent's rows (siiRL's share_instance); "
        "false: one critic per agent, trained only on that agent's rows",
    )
    groups: list[list[str]] = _f(
        help="with share: true, one critic per group of agent names instead of one for all, e.g. [[reasoner, "
        "actor], [judge]] (an agent in no group gets its own)",
        factory=list,
    )
    lr: float = _f(1e-4, "the critic's learning rate (adapter and value head)", min=0.0)
    warmup_steps: int = _f(
        0, "the first k steps train only the critic (the agents' adapters stay as they are)", min=0
    )
    cliprange_value: float = _f(
        0.2, "clipped value loss: a new value may move at most this far from the old one (0: no clipping)",
        min=0.0,
    )
    value_loss_coef: float = _f(0.5, "weight of the value loss", min=0.0)
    ppo_epochs: int = _f(1, "passes of the critic over each step's rows", min=1)
    grad_clip: float = _f(1.0, "max gradient norm of the critic (0 disables)", min=0.0)
    rank: int | None = _f(None, "LoRA rank of the critic's adapter (default: lora.rank)", min=1, max=1024)
    alpha: float | None = _f(None, "LoRA alpha of the critic's adapter (default: lora.alpha)", min=0)

    def adapter_shape(self, rank: int, alpha: float) -> tuple[int, float]:
        """The critic adapter's (rank, alpha): critic.rank / critic.alpha, else the given ones (the first
        agent's LoRA). The one place the rule lives (the critic set and the resume checks call it)."""
        return (self.rank if self.rank is not None else rank, self.alpha if self.alpha is not None else alpha)


@dataclass
class TrainerConfig:
    """The loop: steps, output, checkpoints, evaluation, resume."""

    max_steps: int = _f(100, "training steps", min=1,
                        min_why="must be 1 or more: a run trains the steps up to trainer.max_steps, and a "
                                "run that resumes from a checkpoint the steps after it")
    output_dir: str = _f("outputs/run", "metrics.jsonl, checkpoints, logs and plots go here")
    save_every: int = _f(0, "checkpoint every k steps (0: only at the end)", min=0)
    keep_last: int = _f(2, "checkpoints kept", min=1)
    eval_every: int = _f(
        0, "evaluate every k steps (0: never; the first and last evaluation always run when > 0)", min=0
    )
    resume: Literal["auto", "never"] = _f("auto", "auto: continue from the newest complete checkpoint")
    log_every: int = _f(1, "console summary every k steps", min=1)
    progress_bars: bool = _f(True, "tqdm progress bars")
    stall_timeout_s: float = _f(
        1800.0,
        "stop the run with an error naming the role, rank, its last report and its log files when a "
        "call to the workers shows no sign of life (a method starting or returning, a progress bar "
        "moving) for this many seconds; 0 waits forever. Raise it if one phase (a slow model "
        "download, a long generate call) legitimately runs longer without reporting",
        min=0.0,
    )


@dataclass
class TrackingConfig:
    """Metric sinks (metrics.jsonl is always written)."""

    tensorboard: bool = _f(False, "write tensorboard event files under output_dir/tensorboard")
    wandb: bool = _f(False, "log to Weights & Biases (offline unless WANDB_API_KEY is set)")
    project: str = _f("roll_ma", "wandb project")
    run_name: str | None = _f(None, "wandb run name (default: config name)")


@dataclass
class ResourcesConfig:
    """Where roles run: GPUs per role (indices into the cluster's GPUs), Ray address."""

    num_gpus: int = _f(0, "GPUs the run uses (0: CPU only)", min=0)
    ray_address: str | None = _f(None, "Ray cluster to join (default: RAY_ADDRESS, else a local Ray)")
    device_mapping: dict[str, list[int]] = _f(
        help="GPU indices per role: rollout, train, reference (roles sharing a GPU are colocated)",
        factory=dict,
    )
    num_cpus_per_worker: float = _f(0.1, "CPUs Ray reserves per actor", min=0.0)
    role_resources: dict[str, dict[str, float]] = _f(
        help="Ray custom resources every worker of a role asks for, to pin roles to nodes, e.g. "
        "{rollout: {inference_node: 1}, train: {train_node: 1}} with `ray start --resources="
        "'{\"inference_node\": 8}'` on the nodes meant for rollout (amounts per worker; with GPUs they are "
        "reserved in the worker's placement bundle). Roles: rollout, train, reference, teacher, env",
        factory=dict,
    )
    actor_start_timeout_s: float = _f(
        300.0,
        "every worker actor must start (its process running and registered with Ray) within this many "
        "seconds of the run waiting for its role (every role's actors are asked for at once, then waited "
        "for in turn: train, rollout, reference, env), else the run stops naming the role and rank that "
        "did not (not enough free CPUs/GPUs, or worker processes that cannot pass the cluster's token "
        "authentication)",
        min=1.0,
    )


@dataclass
class RunConfig:
    """A whole roll_ma run."""

    name: str = _f("run", "experiment name")
    seed: int = _f(0, "seed of everything (envs, sampling, init, data order)")
    model: ModelConfig = _f(help="base model", factory=ModelConfig)
    lora: LoraConfig = _f(help="default LoRA settings", factory=LoraConfig)
    agents: list[AgentConfig] = _f(
        help="the agents, each with its adapter", factory=lambda: [AgentConfig(name="agent")]
    )
    env: EnvConfig = _f(help="environment", factory=EnvConfig)
    rollout: RolloutConfig = _f(help="generation", factory=RolloutConfig)
    train: TrainConfig = _f(help="policy update", factory=TrainConfig)
    reference: ReferenceConfig = _f(help="reference log-probs", factory=ReferenceConfig)
    algorithm: AlgorithmConfig = _f(help="advantages and losses", factory=AlgorithmConfig)
    critic: CriticConfig = _f(help="the value critic (algorithm.advantage=gae)", factory=CriticConfig)
    study: StudyConfig = _f(
        help="game-study helpers: joint policy search, entropy over legal actions, reward-class balancing",
        factory=StudyConfig,
    )
    sft: SFTConfig = _f(help="supervised fine-tuning (train.objective=sft, or sft phases)", factory=SFTConfig)
    dpo: DPOConfig = _f(help="direct preference optimization (train.objective=dpo, or dpo phases)",
                        factory=DPOConfig)
    teacher: TeacherConfig = _f(help="the teacher model of sft.source=teacher", factory=TeacherConfig)
    phases: list[PhaseConfig] = _f(
        help="a chain of phases (sft, dpo, eval), each resumable; empty: one run of train.objective",
        factory=list,
    )
    trainer: TrainerConfig = _f(help="loop, checkpoints, evaluation", factory=TrainerConfig)
    tracking: TrackingConfig = _f(help="metric sinks", factory=TrackingConfig)
    resources: ResourcesConfig = _f(help="GPUs and Ray", factory=ResourcesConfig)

    def agent_lora(self, agent: AgentConfig) -> LoraConfig:
        """The LoRA settings of one agent: its overrides on top of the default block."""
        return agent.lora.resolve(self.lora)


# keys that left a section: old path -> new path. Loading refuses the old spelling and names the new one.
MOVED_KEYS: dict[str, str] = {
    f"algorithm.{key}": f"study.{key}"
    for key in (
        "action_entropy_coef",
        "balance_reward_classes",
        "joint_search_every",
        "joint_search_depth",
        "joint_search_min_gain",
        "joint_search_distill_steps",
        "joint_search_stop_prob",
    )
}
