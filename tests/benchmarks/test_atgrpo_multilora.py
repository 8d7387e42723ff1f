"""benchmarks/peers' multi-LoRA actor (issue 60, stage 2, plan item 1: PettingLLMs' ``lora`` regime, one
adapter and one optimizer per agent on one base).

Two levels. atgrpo_adapters (torch + peft, no verl): the agents' adapters, their disjoint optimizers, the
row split; these run wherever peft imports. atgrpo_multilora on verl 0.9.1's own FSDP2 engine and
TrainingWorker, on CPU (gloo, world size 1, a tiny Qwen2 built here): an update of one agent leaves every
other agent's weights, Adam moments and lr schedule bit for bit; each row is scored under its own agent's
adapter (and equals a plain one-adapter PEFT model with that agent's weights); the reference is the base with
adapters off. Those skip where verl does not import (CI has no verl).
"""

from __future__ import annotations

import contextlib
import socket
import sys
from pathlib import Path

import pytest

PEERS = Path(__file__).resolve().parents[2] / "benchmarks" / "peers"
sys.path[:0] = [str(PEERS), str(PEERS.parent)]

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

import atgrpo_adapters as adapters  # noqa: E402

LORA = dict(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0)


# ---------------------------------------------------------------------------- PEFT level (no verl)
def _peft_model(agents: int):
    from transformers import AutoModelForCausalLM

    from roll_ma.models.tiny import make_config

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(make_config(vocab_size=128))
    model = peft.get_peft_model(base, peft.LoraConfig(task_type="CAUSAL_LM", **LORA))  # adapter 'default'
    adapters.add_agent_adapters(model, agents)
    return model


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


def _snapshot(model, agent_id, optimizer=None):
    weights = {n: p.detach().clone() for n, p in adapters.agent_parameters(model, agent_id)}
    state = {}
    if optimizer is not None:
        for p, s in optimizer.state.items():
            state[id(p)] = {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
    return weights, state


def _same(a, b) -> bool:
    (wa, sa), (wb, sb) = a, b
    if wa.keys() != wb.keys() or sa.keys() != sb.keys():
        return False
    if not all(torch.equal(wa[k], wb[k]) for k in wa):
        return False
    return all(
        sa[p].keys() == sb[p].keys() and all(torch.equal(sa[p][k], sb[p][k]) for k in sa[p]) for p in sa
    )


def _peft_step(model, agent_id, optimizers=None, shared=None):
    """One update of ``agent_id`` on made-up tokens: its own optimizer (freeing every agent's gradients
    first), or one ``shared`` optimizer zeroing (not freeing) them, the way a single optimizer over every
    adapter would be used."""
    adapters.set_agent_adapter(model, agent_id)
    if optimizers is not None:
        adapters.free_gradients(optimizers)
    else:
        shared.zero_grad(set_to_none=False)
    ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(agent_id))
    model(input_ids=ids, labels=ids).loss.backward()
    (optimizers[agent_id] if optimizers is not None else shared).step()


def test_each_agent_has_its_own_adapter_and_an_optimizer_over_it_alone():
    model = _peft_model(3)
    assert sorted(model.peft_config) == ["agent_0", "agent_1", "agent_2"]  # verl's 'default' dropped
    assert model.active_adapter == "agent_0"
    names = [{n for n, _ in adapters.agent_parameters(model, k)} for k in range(3)]
    lora_names = {n for n, _ in model.named_parameters() if "lora_" in n}
    assert set().union(*names) == lora_names and sum(map(len, names)) == len(lora_names)  # a partition
    assert all(".agent_1." in n for n in names[1])
    optimizers = adapters.build_agent_optimizers(model, 3, _adamw)
    held = [{id(p) for g in o.param_groups for p in g["params"]} for o in optimizers]
    assert held == [{id(p) for _, p in adapters.agent_parameters(model, k)} for k in range(3)]
    # each adapter its own draw of lora_A (lora_B zero): agents start equal to the base, not to each other
    a0, a1 = (dict(adapters.agent_parameters(model, k)) for k in (0, 1))
    key = next(n for n in a0 if "lora_A" in n)
    assert not torch.equal(a0[key], a1[key.replace("agent_0", "agent_1")])
    with pytest.raises(ValueError, match="share parameters"):
        adapters.build_agent_optimizers(model, 2, lambda ps: _adamw([p for _, p in model.named_parameters()]))


def test_an_update_of_one_agent_leaves_every_other_agents_weights_and_adam_state_bit_for_bit():
    model = _peft_model(3)
    optimizers = adapters.build_agent_optimizers(model, 3, _adamw)
    _peft_step(model, 0, optimizers)  # agent 0 now has Adam moments, which a shared optimizer would use
    before = [_snapshot(model, k, optimizers[k]) for k in range(3)]
    _peft_step(model, 1, optimizers)
    _peft_step(model, 1, optimizers)
    after = [_snapshot(model, k, optimizers[k]) for k in range(3)]
    assert _same(before[0], after[0]) and _same(before[2], after[2])
    assert not optimizers[2].state  # never updated: no moments at all
    assert not any(torch.equal(before[1][0][n], after[1][0][n]) for n in before[1][0] if "lora_B" in n)
    assert all(p.grad is None for _, p in adapters.agent_parameters(model, 0))  # freed, not zeroed

    # why not one optimizer over every adapter: zeroed gradients still step agent 0 (momentum, decay)
    model = _peft_model(3)
    shared = _adamw([p for n, p in model.named_parameters() if "lora_" in n])
    _peft_step(model, 0, shared=shared)
    agent0 = _snapshot(model, 0)
    _peft_step(model, 1, shared=shared)
    assert not _same(agent0, _snapshot(model, 0))


def test_rows_are_split_by_agent_and_put_back_in_batch_order():
    agent_ids = torch.tensor([2, 0, 2, 1, 0])
    rows = adapters.rows_by_agent(agent_ids, 3)
    assert {k: v.tolist() for k, v in rows.items()} == {0: [1, 4], 1: [3], 2: [0, 2]}
    parts = [(r, [torch.tensor([float(i)]) for i in r.tolist()]) for r in rows.values()]
    assert [t.item() for t in adapters.in_row_order(parts, 5)] == [0, 1, 2, 3, 4]
    assert list(adapters.rows_by_agent(torch.tensor([1, 1]), 3)) == [1]  # absent agents: no entry
    with pytest.raises(ValueError, match="outside 0..2"):
        adapters.rows_by_agent(torch.tensor([0, 3]), 3)
    with pytest.raises(ValueError, match="rows without a result"):
        adapters.in_row_order(parts[:1], 5)


# ---------------------------------------------------------------------------- verl 0.9.1's FSDP2 engine, CPU
def _cpu_platform():
    """verl's platform layer has CUDA / NPU / ROCm only (verl/plugin/platform/); a CPU one for the test, so
    verl's device mesh, ``.to(device)`` calls and process group run on CPU and gloo."""
    from verl.plugin.platform.platform_base import PlatformBase

    class CpuPlatform(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"
        # verl's memory logging recognises torch.cpu (utils/profiler/performance.py)
        device_module = torch.cpu

        def is_available(self):
            return True

        def current_device(self):
            return "cpu"

        def device_count(self):
            return 1

        def set_device(self, device_index):
            pass

        def synchronize(self, device_index=None):
            pass

        def manual_seed(self, seed):
            torch.manual_seed(seed)

        def manual_seed_all(self, seed):
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings):
            pass

        def empty_cache(self):
            pass

        def get_device_capability(self, device_index=0):
            return (None, None)

        def communication_backend_name(self):
            return "gloo"

        def visible_devices_envvar(self):
            return "CUDA_VISIBLE_DEVICES"

        def nvtx_range(self, msg):
            return contextlib.nullcontext()

        def profiler_start(self):
            pass

        def profiler_stop(self):
            pass

        def ray_resource_name(self):
            return "CPU"

        def ray_noset_envvars(self):
            return []

        def is_ipc_supported(self):
            return False

        def cudart(self):
            return None

    return CpuPlatform()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def verl_cpu(tmp_path_factory):
    """verl 0.9.1's engine and worker in this process on CPU: the CPU platform, a gloo process group of one,
    and the tiny model's path."""
    pytest.importorskip("verl.workers.engine.fsdp.transformer_impl", reason="verl 0.9.1 and its pins")
    import torch.distributed as dist
    import verl.models.transformers.monkey_patch as verl_monkey_patch
    from verl.plugin.platform import platform_manager

    from roll_ma.models.tiny import build_tiny_model

    patch = pytest.MonkeyPatch()
    for key, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1",
                           LOCAL_RANK="0").items():  # fmt: skip
        patch.setenv(key, value)  # verl's Worker reads these
    # verl registers its FSDP engines for cuda / npu (transformer_impl.py:1144); the worker looks one up
    # before MultiLoraTrainingWorker replaces it
    patch.setenv("VERL_ENGINE_DEVICE", "cuda")
    patch.setattr(platform_manager, "_current_platform", _cpu_platform())
    # verl asks the device module for memory figures (engine_workers.py:219, memory_utils.py:47); torch.cpu
    # has none of them
    for name in ("max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved"):
        patch.setattr(torch.cpu, name, lambda *a: 0, raising=False)
    patch.setattr(torch.cpu, "empty_cache", lambda: None, raising=False)
    # verl patches trl's value-head class when trl imports (monkey_patch.py:352); the trl here is newer than
    # verl's and lacks it, and the GPU stage has no trl on verl's path
    patch.setattr(verl_monkey_patch, "is_trl_available", lambda: False)
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield build_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"))
    finally:
        if started:
            dist.destroy_process_group()
        patch.undo()


def _config(model_path: str, agents: int, attention: str = "sdpa", fused: str | None = None):
    """verl's TrainingWorker config for an actor with ``agents`` LoRAs; fp32 throughout and one row per
    micro-batch, so that equal work gives bit-equal results. ``fused``: verl's fused log-probs on that
    backend (use_fused_kernels)."""
    import atgrpo_multilora
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig, TrainingWorkerConfig

    model = HFModelConfig(path=model_path, lora_rank=LORA["r"], lora_alpha=LORA["lora_alpha"],
                          target_modules="all-linear", use_remove_padding=True,
                          enable_gradient_checkpointing=False,
                          override_config={"attn_implementation": attention},
                          use_fused_kernels=fused is not None,
                          fused_kernel_options={"impl_backend": fused} if fused else {},
                          lora={atgrpo_multilora.AGENTS_KEY: agents})  # fmt: skip
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    engine = FSDPEngineConfig(strategy="fsdp2", mixed_precision=fp32, use_torch_compile=False,
                              use_dynamic_bsz=False, micro_batch_size_per_gpu=1,
                              infer_micro_batch_size_per_gpu=1)  # fmt: skip
    # clip_grad small enough to clip every step: another agent's gradient in the norm would show
    optim = FSDPOptimizerConfig(lr=1e-2, weight_decay=0.1, clip_grad=0.01, total_training_steps=10)
    return TrainingWorkerConfig(model_type="language_model", model_config=model, engine_config=engine,
                                optimizer_config=optim, checkpoint_config=CheckpointConfig())  # fmt: skip


def _worker(model_path: str, agents: int, attention: str = "sdpa", fused: str | None = None,
            **engine_changes):  # fmt: skip
    import dataclasses

    import atgrpo_multilora

    config = _config(model_path, agents, attention, fused)
    if engine_changes:  # verl's configs are frozen dataclasses
        engine = dataclasses.replace(config.engine_config, **engine_changes)
        config = dataclasses.replace(config, engine_config=engine)
    worker = atgrpo_multilora.MultiLoraTrainingWorker(config)
    torch.manual_seed(0)  # each adapter's lora_A draw: equal across workers built alike
    worker.reset()  # verl builds the model, the adapters and the optimizers here
    worker.set_loss_fn(_reinforce_loss)
    return worker


def _reinforce_loss(model_output, data, dp_group=None):
    """-advantage x log-prob of every scored token, over the batch's tokens (a loss verl's engine backs up
    and steps as it does ppo_loss; isolation does not depend on which loss)."""
    from verl.utils import tensordict_utils as tu

    log_probs = model_output["log_probs"]  # (B, j) nested
    advantages = data["advantage"]  # (B,)
    total = sum((lp * a).sum() for lp, a in zip(log_probs.unbind(), advantages))
    loss = -total / tu.get_non_tensor_data(data, "batch_num_tokens", 1)
    return loss, {"pg": loss.detach().item()}


PROMPT, RESPONSE = 5, 4


def _tokens(seeds: list[int]):
    """(B, P + R) made-up token ids and (B, P + R) attention mask, both from each row's seed alone (equal
    seeds, equal rows); odd seeds' prompts are left-padded by 2."""
    ids = torch.stack([torch.randint(3, 100, (PROMPT + RESPONSE,), generator=torch.Generator().manual_seed(s))
                       for s in seeds])  # fmt: skip
    mask = torch.ones_like(ids)
    mask[[i for i, s in enumerate(seeds) if s % 2], :2] = 0
    return ids, mask


def _batch(agent_ids: list[int], seeds: list[int], **extra):
    """A batch as verl's trainer hands it to the actor: no padding (nested rows), the ``agent_id`` column."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    ids, mask = _tokens(seeds)
    batch = len(seeds)
    td = TensorDict({"input_ids": ids, "attention_mask": mask, "response_mask": mask[:, PROMPT:].clone(),
                     "position_ids": (mask.cumsum(-1) - 1).clamp(min=0), "prompts": ids[:, :PROMPT],
                     "responses": ids[:, PROMPT:], adapters.AGENT_COLUMN: torch.tensor(agent_ids),
                     "advantage": torch.linspace(1.0, -0.5, batch)}, batch_size=batch)  # fmt: skip
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(td, temperature=1.0, compute_loss=False, **extra)
    return td


def _log_probs(worker, agent_ids, seeds, **extra) -> list:
    out = worker.infer_batch(_batch(agent_ids, seeds, **extra))
    return [row.clone() for row in out["log_probs"].unbind()]  # per row (L_i,)


def _train(worker, agent_ids, seeds, **extra):
    return worker.train_mini_batch(_batch(agent_ids, seeds, mini_batch_size=len(seeds), **extra))["metrics"]


def _full(t):
    return t.full_tensor().clone() if hasattr(t, "full_tensor") else t.clone()  # a DTensor's whole tensor


def _agent(worker, agent_id):
    """Agent ``agent_id``'s LoRA weights and its optimizer's state, copied."""
    engine = worker.engine
    state = {}
    for i, per_param in enumerate(engine.agent_optimizers[agent_id].state.values()):
        state[i] = {k: _full(v) for k, v in per_param.items()}
    return engine.agent_state(agent_id), state, engine.agent_lr_schedulers[agent_id].last_epoch


def _equal(a, b) -> bool:
    (wa, sa, ea), (wb, sb, eb) = a, b
    same_weights = wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    same_state = sa.keys() == sb.keys() and all(
        sa[i].keys() == sb[i].keys() and all(torch.equal(sa[i][k], sb[i][k]) for k in sa[i]) for i in sa
    )
    return same_weights and same_state and ea == eb


def test_verls_engine_holds_one_adapter_one_optimizer_one_schedule_per_agent(verl_cpu):
    import atgrpo_multilora
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    worker = _worker(verl_cpu, 3)
    engine = worker.engine
    assert isinstance(engine, atgrpo_multilora.MultiLoraFSDPEngine)
    assert issubclass(atgrpo_multilora.MultiLoraFSDPEngine, FSDPEngineWithLMHead)  # verl's engine, extended
    assert type(engine.module).__name__ == "FSDPPeftModelForCausalLM"  # verl's FSDP2-wrapped PEFT model
    assert sorted(engine.module.peft_config) == ["agent_0", "agent_1", "agent_2"]
    assert len(engine.agent_optimizers) == len(engine.agent_lr_schedulers) == 3
    for k in range(3):
        held = {id(p) for g in engine.agent_optimizers[k].param_groups for p in g["params"]}
        assert held == {id(p) for _, p in adapters.agent_parameters(engine.module, k)}
    engine.use_agent(2)
    assert engine.optimizer is engine.agent_optimizers[2]
    assert engine.lr_scheduler is engine.agent_lr_schedulers[2]
    assert engine.module.active_adapter == "agent_2"
    with pytest.raises(ValueError, match="outside 0..2"):
        engine.use_agent(3)
    bad = _batch([0, 1], [1, 2])
    del bad[adapters.AGENT_COLUMN]
    with pytest.raises(ValueError, match="agent_id"):
        worker.infer_batch(bad)


def test_training_one_agent_leaves_every_other_agent_bit_for_bit(verl_cpu):
    worker = _worker(verl_cpu, 3)
    initial = [_agent(worker, k) for k in range(3)]
    _train(worker, [0, 0], [1, 2])  # agent 0 first: it now has Adam moments and a stepped schedule
    after0 = [_agent(worker, k) for k in range(3)]
    assert not _equal(initial[0], after0[0]) and after0[0][2] == initial[0][2] + 1
    assert _equal(initial[1], after0[1]) and _equal(initial[2], after0[2])

    metrics = _train(worker, [1, 1], [3, 4])  # then agent 1 alone
    after1 = [_agent(worker, k) for k in range(3)]
    assert not _equal(after0[1], after1[1])
    assert _equal(after0[0], after1[0]) and _equal(after0[2], after1[2])  # weights, moments, schedule
    assert not after1[2][1]  # agent 2 never updated: an empty optimizer state
    assert "agent_1/pg" in metrics and "agent_0/pg" not in metrics and "mfu" in metrics

    # a batch of two agents' rows: each agent updated once on its own rows, the third left as it was
    metrics = _train(worker, [2, 0, 2, 0], [5, 6, 7, 8])
    after2 = [_agent(worker, k) for k in range(3)]
    assert not _equal(after1[0], after2[0]) and not _equal(after1[2], after2[2])
    assert _equal(after1[1], after2[1])
    assert after2[0][2] == after1[0][2] + 1 and after2[2][2] == after1[2][2] + 1
    assert {"agent_0/loss", "agent_2/loss"} <= set(metrics) and len(metrics["loss"]) == 2  # one step each


def test_with_optimizer_offload_every_agents_optimizer_moves_and_the_others_stay_bit_for_bit(verl_cpu):
    """verl moves the optimizer in and out around each update when it is offloaded (engine/base.py:323);
    the engine moves every agent's (on CPU the moves are no-ops: this runs the code; GPU memory untested)."""
    worker = _worker(verl_cpu, 3, optimizer_offload=True)
    assert worker.engine.is_optimizer_offload_enabled
    _train(worker, [0, 0], [1, 2])
    before = [_agent(worker, k) for k in range(3)]
    _train(worker, [1, 1], [3, 4])
    after = [_agent(worker, k) for k in range(3)]
    assert _equal(before[0], after[0]) and _equal(before[2], after[2]) and not _equal(before[1], after[1])


def test_an_agents_update_is_the_same_whether_or_not_another_agent_trained_first(verl_cpu):
    """No gradient, clip or schedule of agent 0 reaches agent 1's update: agent 1 trained after agent 0
    equals agent 1 trained alone, bit for bit."""
    first = _worker(verl_cpu, 2)
    trained0 = _train(first, [0, 0], [1, 2])
    after = _train(first, [1, 1], [3, 4])
    alone = _worker(verl_cpu, 2)
    assert _equal(_agent(first, 0), _agent(alone, 0)) is False  # agent 0 did train in the first
    only = _train(alone, [1, 1], [3, 4])
    assert _equal(_agent(first, 1), _agent(alone, 1))
    assert trained0["grad_norm"][0] > 0.01  # clipped: the clip's scale depends on every gradient it sees
    assert after["grad_norm"] == only["grad_norm"]


def _hf_log_probs(model, ids, mask) -> list:
    """Row by row through a plain transformers/peft model: log p(token t+1 | ..t), each row's real tokens."""
    out = []
    with torch.no_grad():
        for row_ids, row_mask in zip(ids, mask):
            tokens = row_ids[row_mask.bool()].unsqueeze(0)  # (1, L)
            logits = model(input_ids=tokens).logits.float()  # (1, L, V)
            lp = torch.log_softmax(logits[0, :-1], dim=-1).gather(-1, tokens[0, 1:, None]).squeeze(-1)
            out.append(lp)  # (L - 1,)
    return out


def _one_adapter_model(model_path, engine, agent_id):
    """The base with ONE adapter (peft's 'default') holding agent ``agent_id``'s weights from the engine."""
    import copy

    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation="sdpa", dtype=torch.float32)
    config = copy.deepcopy(engine.module.peft_config[adapters.adapter_name(agent_id)])
    plain = peft.get_peft_model(base, config)
    weights = {
        n.replace(f".{adapters.adapter_name(agent_id)}.", ".default."): w
        for n, w in engine.agent_state(agent_id).items()
    }
    missing, unexpected = plain.load_state_dict(weights, strict=False)
    assert not unexpected and not [m for m in missing if "lora_" in m]
    return plain.eval()


def test_each_row_is_scored_under_its_own_agents_adapter_and_the_reference_under_none(verl_cpu):
    from transformers import AutoModelForCausalLM

    worker = _worker(verl_cpu, 2)
    _train(worker, [1, 1], [11, 12])  # agent 1 trained, agent 0 still the base (lora_B zero)
    seeds = [7, 7, 8, 8]  # rows 0 and 1 are the same tokens, so are rows 2 and 3
    agent_ids = [0, 1, 1, 0]
    mixed = _log_probs(worker, agent_ids, seeds)
    # the same tokens under two agents score differently
    assert not torch.equal(mixed[0], mixed[1]) and not torch.equal(mixed[2], mixed[3])

    # each row as it is in a batch of its agent's rows only (verl's one-adapter path), bit for bit
    only0 = _log_probs(worker, [0, 0], [7, 8])
    only1 = _log_probs(worker, [1, 1], [7, 8])
    assert torch.equal(mixed[0], only0[0]) and torch.equal(mixed[3], only0[1])
    assert torch.equal(mixed[1], only1[0]) and torch.equal(mixed[2], only1[1])

    # ... and as a plain one-adapter PEFT model with that agent's weights scores it (not verl's code path)
    ids, mask = _tokens(seeds)
    for agent_id in (0, 1):
        plain = _hf_log_probs(_one_adapter_model(verl_cpu, worker.engine, agent_id), ids, mask)
        for row in (i for i, a in enumerate(agent_ids) if a == agent_id):
            torch.testing.assert_close(mixed[row][:-1], plain[row], rtol=1e-5, atol=1e-5)

    # the reference (verl's no_lora_adapter): every row on the base, whatever its agent
    reference = _log_probs(worker, agent_ids, seeds, no_lora_adapter=True)
    base = AutoModelForCausalLM.from_pretrained(verl_cpu, attn_implementation="sdpa", dtype=torch.float32)
    for row, lp in enumerate(_hf_log_probs(base.eval(), ids, mask)):
        torch.testing.assert_close(reference[row][:-1], lp, rtol=1e-5, atol=1e-5)
    assert torch.equal(reference[0], reference[1]) and torch.equal(reference[0], mixed[0])  # agent 0 = base
    assert not torch.equal(reference[1], mixed[1])
    # adapters back on after the reference: the agents' scores are as before
    again = _log_probs(worker, agent_ids, seeds)
    assert all(torch.equal(a, b) for a, b in zip(again, mixed))


def test_packed_micro_batches_under_roll_ma_varlen_score_each_row_as_it_scores_alone(verl_cpu, monkeypatch):
    """relay.yaml's AT-GRPO rows and job.yaml's verl_best run verl's packed rows (use_remove_padding) through
    roll_ma_varlen (verl_varlen.py, imported in every verl process): micro-batches of two rows of unequal
    lengths, each packed into one sequence by verl's engine, score each row as one row a micro-batch under
    sdpa does, under an agent's adapter and for the reference."""
    import verl_varlen

    from roll_ma.models import varlen_attention

    packed_calls = []  # the rows each packed attention call saw (CPU: the per-row path of roll_ma_varlen)
    per_row = varlen_attention._per_row_sdpa
    monkeypatch.setattr(varlen_attention, "_per_row_sdpa",
                        lambda q, k, v, cu, *a: packed_calls.append(len(cu) - 1) or per_row(q, k, v, cu, *a))
    seeds, agent_ids = [7, 8, 9, 10], [0, 1, 1, 0]  # odd seeds' rows are 2 tokens shorter
    packed = _worker(verl_cpu, 2, verl_varlen.NAME, infer_micro_batch_size_per_gpu=2)
    alone = _worker(verl_cpu, 2)
    assert packed.engine.module.config._attn_implementation == "roll_ma_varlen"
    for extra in ({}, {"no_lora_adapter": True}):
        packed_calls.clear()
        got = _log_probs(packed, agent_ids, seeds, **extra)
        want = _log_probs(alone, agent_ids, seeds, **extra)
        assert packed_calls and set(packed_calls) == {2}  # every layer's call: a micro-batch's two rows
        # a row's last entry scores the token after the row (verl's roll: packed, the next row's first)
        for a, b in zip(got, want):
            torch.testing.assert_close(a[:-1], b[:-1], rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def untied_model(verl_cpu, tmp_path_factory):
    """The tiny model with an LM head of its own (tie_word_embeddings false, as the 7B of the jobs)."""
    from roll_ma.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen2_untied"), tie_word_embeddings=False)


@pytest.mark.parametrize("head", ["tied", "untied"])
def test_fused_log_probs_on_verls_torch_backend_score_each_agents_rows_as_unfused(
    verl_cpu, untied_model, head, monkeypatch
):
    """relay.yaml's atgrpo row scores with verl's fused log-probs on its torch backend (use_fused_kernels,
    impl_backend torch: the LM head and log-softmax in 512-token chunks; unfused, verl 0.9.1 without
    flash-attn runs log_softmax once per token, torch_functional.py logprobs_from_logits_v2). Trained alike,
    each row scores under its agent's adapter, and the reference with every adapter off, as unfused: on a
    tied head as verl ships, on an untied one (the 7B's) with verl_fused_head's wrapping."""
    import verl.utils.fsdp_utils as fsdp_utils
    import verl_fused_head
    from transformers.models.qwen2.modeling_qwen2 import Qwen2ForCausalLM

    model = verl_cpu if head == "tied" else untied_model
    monkeypatch.setattr(fsdp_utils, "_select_fsdp2_wrap_targets", verl_fused_head.wrap_targets_head_in_root)
    seeds, agent_ids, scored = [7, 7, 8, 8], [0, 1, 1, 0], ({}, {"no_lora_adapter": True})
    plain = _worker(model, 2)  # first: building a fused worker replaces the model class's forward
    _train(plain, [1, 1], [11, 12])
    want = [_log_probs(plain, agent_ids, seeds, **extra) for extra in scored]
    # (monkey_patch.py:286, for every model of the class; put back after the test)
    monkeypatch.setattr(Qwen2ForCausalLM, "forward", Qwen2ForCausalLM.forward)
    fused = _worker(model, 2, fused="torch")
    # the fused path is the one scoring: the model class now runs verl's torch-backend forward (log-probs out)
    assert Qwen2ForCausalLM.forward.__name__ == "forward_with_torch_backend"
    _train(fused, [1, 1], [11, 12], use_fused_kernels=True)
    got = [_log_probs(fused, agent_ids, seeds, use_fused_kernels=True, **extra) for extra in scored]
    for rows_got, rows_want in zip(got, want):
        for a, b in zip(rows_got, rows_want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # the comparison is not vacuous: agent 1 trained scores the tokens of row 0 apart from agent 0 (the base)
    assert not torch.allclose(got[0][1], got[0][0]) and torch.allclose(got[0][0], got[1][0])


def test_verls_own_fsdp2_wrapping_fails_fused_log_probs_on_an_untied_head(untied_model, monkeypatch):
    """Why the fused rows import verl_fused_head: verl 0.9.1 wraps an untied LM head as an FSDP2 unit of its
    own (verl PR #5516) and its fused forward reads the head's weight without calling the head, so it meets
    the sharded DTensor: the failure the per-agent row hit on the H200 (2026-12-03). With the head in the
    root unit (verl PR #7427's decision) the head is gathered before the forward. Should a later verl read the
    head right, the first half of this test fails: drop verl_fused_head then."""
    import verl.utils.fsdp_utils as fsdp_utils
    import verl_fused_head
    from torch.distributed.fsdp import FSDPModule
    from transformers.models.qwen2.modeling_qwen2 import Qwen2ForCausalLM

    monkeypatch.setattr(Qwen2ForCausalLM, "forward", Qwen2ForCausalLM.forward)
    monkeypatch.setattr(fsdp_utils, "_select_fsdp2_wrap_targets", verl_fused_head.verls_wrap_targets)
    shipped = _worker(untied_model, 1, fused="torch")
    assert isinstance(shipped.engine.module.get_output_embeddings(), FSDPModule)
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        _log_probs(shipped, [0], [7], use_fused_kernels=True)
    monkeypatch.setattr(fsdp_utils, "_select_fsdp2_wrap_targets", verl_fused_head.wrap_targets_head_in_root)
    fixed = _worker(untied_model, 1, fused="torch")
    module = fixed.engine.module
    assert not isinstance(module.get_output_embeddings(), FSDPModule)  # the root unit holds it
    assert isinstance(module.get_input_embeddings(), FSDPModule)  # the embedding keeps its own unit
    assert _log_probs(fixed, [0], [7], use_fused_kernels=True)[0].isfinite().all()


def test_the_weight_sync_exports_verls_base_and_each_agents_lora_under_verls_names(verl_cpu):
    """What plan item 2 sends to vLLM: the base as verl's own one-LoRA engine exports it, and each agent's
    LoRA under the names verl gives its one adapter, with that agent's weights."""
    from peft.utils.save_and_load import get_peft_model_state_dict
    from verl.workers.engine_workers import TrainingWorker

    ours = _worker(verl_cpu, 2)
    _train(ours, [1, 1], [3, 4])
    stock = TrainingWorker(_config(verl_cpu, 2))  # verl's engine: one adapter, 'default'
    torch.manual_seed(0)
    stock.reset()

    base, config = ours.engine.get_per_tensor_param(base_sync_done=False)
    stock_base, stock_config = stock.engine.get_per_tensor_param(base_sync_done=False)
    base, stock_base = dict(base), dict(stock_base)
    assert base.keys() == stock_base.keys() and all(torch.equal(base[k], stock_base[k]) for k in base)
    assert not any("lora_" in k for k in base) and config == stock_config
    assert "default" not in ours.engine.module.peft_config  # the alias verl's export reads is gone again

    stock_lora, _ = stock.engine.get_per_tensor_param(base_sync_done=True)
    stock_lora = dict(stock_lora)
    for agent_id in (0, 1):
        lora, lora_config = ours.engine.agent_lora_params(agent_id)
        assert len(lora) == 2 * 7 * 2  # lora_A and lora_B of 7 linear layers in each of 2 blocks
        assert all(".lora_A.weight" in k or ".lora_B.weight" in k for k in lora)
        assert {k: v.shape for k, v in lora.items()} == {k: v.shape for k, v in stock_lora.items()}
        assert lora_config == stock_config
        plain = get_peft_model_state_dict(_one_adapter_model(verl_cpu, ours.engine, agent_id))
        assert all(torch.equal(lora[k], plain[k]) for k in lora)
    trained = ours.engine.agent_lora_params(1)[0]
    assert any(not torch.equal(trained[k], ours.engine.agent_lora_params(0)[0][k]) for k in trained)
    # the worker's engine adds the sync's LoRA half: every agent's adapter in one stream, under its
    # multi-adapter names, each agent's split off as vLLM's worker splits it (atgrpo_multilora_vllm.py)
    import atgrpo_multilora
    from atgrpo_multilora_rollout import split_agent_adapters

    assert type(ours.engine) is atgrpo_multilora.MultiLoraSyncEngine
    exported, exported_config = ours.engine.get_per_tensor_param(base_sync_done=True)
    per_agent = split_agent_adapters(exported)
    assert sorted(per_agent) == [0, 1] and exported_config == stock_config
    for agent_id in (0, 1):
        lora = ours.engine.agent_lora_params(agent_id)[0]
        assert per_agent[agent_id].keys() == lora.keys()
        assert all(torch.equal(per_agent[agent_id][k], lora[k]) for k in lora)
    with pytest.raises(NotImplementedError, match="agent_lora_params"):  # the engine without the sync's half
        atgrpo_multilora.MultiLoraFSDPEngine.get_per_tensor_param(ours.engine, base_sync_done=True)


# ---------------------------------------------------------------------------- as verl's trainer drives it
def _trainer_config(model_path: str, agents: int):
    """verl's own ppo_trainer config (hydra), as run_atgrpo would override it for the multi-LoRA actor."""
    import importlib.util

    import atgrpo_multilora
    from hydra import compose, initialize_config_dir

    config_dir = Path(importlib.util.find_spec("verl").origin).parent / "trainer" / "config"
    overrides = [
        f"actor_rollout_ref.model.path={model_path}",
        "actor_rollout_ref.model.lora_rank=4",
        "actor_rollout_ref.model.lora_alpha=8",
        f"+actor_rollout_ref.model.lora.{atgrpo_multilora.AGENTS_KEY}={agents}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.optim.lr=0.01",
        # seq-mean divides by the mini-batch's rows (global_batch_size): an agent's share must be its own
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        f"trainer.v1.trainer_mode={atgrpo_multilora.TRAINER_MODE}",
        "trainer.use_v1=true",
        "algorithm.adv_estimator=grpo_vectorized",  # as run_atgrpo sets it (no critic)
        "trainer.n_gpus_per_node=1",
    ]
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def test_verls_sync_trainer_under_its_mode_starts_the_multi_lora_actor(verl_cpu):
    import atgrpo_multilora
    from verl.trainer.ppo.utils import Role
    from verl.trainer.ppo.v1 import get_trainer_cls

    config = _trainer_config(verl_cpu, 3)
    trainer_cls = get_trainer_cls(config.trainer.v1.trainer_mode)
    assert trainer_cls is atgrpo_multilora.MultiLoraPPOTrainer
    trainer = trainer_cls.__new__(trainer_cls)  # only its worker mapping: no Ray, no TransferQueue
    trainer.config = config
    trainer._init_resource_pool_mgr()
    # LoRA: verl scores the reference on the actor with adapters off, so one worker holds both
    assert set(trainer.role_worker_mapping) == {Role.ActorRollout}
    worker = trainer.role_worker_mapping[Role.ActorRollout].__ray_metadata__.modified_class
    assert issubclass(worker, atgrpo_multilora.MultiLoraActorRolloutRefWorker)


def _ppo_batch(agent_ids, seeds, **extra):
    """The fields verl's ppo_loss reads (workers/utils/losses.py:86-97) on top of ``_batch``'s rows."""
    batch = _batch(agent_ids, seeds, **extra)
    n = len(seeds)
    batch["old_log_probs"] = torch.full((n, RESPONSE), -4.0)  # (B, R)
    advantage = torch.tensor([1.0 if s % 2 else -0.5 for s in seeds])  # (B,) a row's from its seed alone
    batch["advantages"] = advantage[:, None].expand(n, RESPONSE).clone()  # (B, R)
    return batch


def _actor(model_path: str, agents: int):
    import atgrpo_multilora

    config = _trainer_config(model_path, agents)
    outer = atgrpo_multilora.MultiLoraActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    torch.manual_seed(0)
    outer.init_model()
    return outer


def test_verls_actor_worker_scores_and_updates_each_agent_on_its_own_adapter(verl_cpu):
    """verl's ActorRolloutRefWorker (role actor) from verl's config, its entry points as the v1 trainer calls
    them: compute_log_prob (per agent; with ``no_lora_adapter`` the reference) and update_actor with verl's
    ppo_loss, an agent's update in a mixed batch being its update on its own rows alone."""
    import atgrpo_multilora

    outer = _actor(verl_cpu, 3)
    assert isinstance(outer.actor, atgrpo_multilora.MultiLoraTrainingWorker)
    engine = outer.actor.engine
    assert engine.agents == 3 and sorted(engine.module.peft_config) == ["agent_0", "agent_1", "agent_2"]

    before = [_agent(outer.actor, k) for k in range(3)]
    reference = outer.compute_log_prob(_batch([0, 2], [3, 3], no_lora_adapter=True))
    metrics = outer.update_actor(
        _ppo_batch([2, 0, 2, 0], [1, 2, 3, 4], mini_batch_size=4, global_batch_size=4, epochs=1)
    )["metrics"]
    after = [_agent(outer.actor, k) for k in range(3)]
    assert not _equal(before[0], after[0]) and not _equal(before[2], after[2])
    assert _equal(before[1], after[1])  # no rows of agent 1: its weights, moments and schedule untouched
    assert {"agent_0/actor/pg_loss", "agent_2/actor/pg_loss", "mfu"} <= set(metrics)
    assert len(metrics["loss"]) == 2  # one optimizer step for each agent present

    scored = outer.compute_log_prob(_batch([0, 2, 1], [3, 3, 3]))["log_probs"].unbind()
    ref_after = outer.compute_log_prob(_batch([0, 2], [3, 3], no_lora_adapter=True))["log_probs"].unbind()
    assert all(
        torch.equal(a, b) for a, b in zip(reference["log_probs"].unbind(), ref_after)
    )  # base unchanged
    assert not torch.equal(scored[0], scored[1])  # agents 0 and 2 trained differently on the same tokens
    assert torch.equal(scored[2], ref_after[0])  # agent 1 untrained: lora_B zero, exactly the base
    with_entropy = outer.compute_log_prob(_batch([2, 0, 1], [3, 3, 3], calculate_entropy=True))
    assert with_entropy.batch_size[0] == 3 and len(with_entropy["entropy"].unbind()) == 3
    assert all(
        torch.equal(a, b) for a, b in zip(with_entropy["log_probs"].unbind(), scored[1::-1] + scored[2:])
    )

    # agent 2's update in that mixed batch is its update on its own rows alone, bit for bit
    alone = _actor(verl_cpu, 3)
    alone.update_actor(_ppo_batch([2, 2], [1, 3], mini_batch_size=2, global_batch_size=2, epochs=1))
    assert _equal(_agent(outer.actor, 2), _agent(alone.actor, 2))
