"""Placement: GPUs per worker, tensor-parallel bundles, roles pinned to nodes by custom resources, the
config checks that refuse what Ray could not place, and the version check over every rollout engine."""

import subprocess
import sys

import pytest

from roll_ma.config import ConfigError
from roll_ma.distributed.placement import (
    bundle_specs,
    default_device_mapping,
    placement_bundles,
    shared_tp_gpus,
    worker_gpus,
)
from roll_ma.distributed.resources import ResourceManager
from roll_ma.pipelines.rl.adapter_sync import check_versions
from roll_ma.preflight import validate as validate_module
from roll_ma.preflight.config_loader import load_config


# ---------------------------------------------------------------------------- the arithmetic
def test_default_mapping_colocates_one_gpu_roles_and_gives_tensor_parallel_engines_gpus_of_their_own():
    workers = {"rollout": 2, "train": 2, "reference": 0}
    assert default_device_mapping(2, workers) == {"rollout": [0, 1], "train": [0, 1]}
    # 2 engines x 2 GPUs after the train ranks' GPUs 0..1
    assert default_device_mapping(6, workers, {"rollout": 2}) == {"train": [0, 1], "rollout": [2, 3, 4, 5]}
    # an explicit mapping wins; a defaulted engine goes after every GPU named anywhere
    given = {"train": [0], "reference": [3]}
    got = default_device_mapping(8, {"rollout": 1, "train": 1, "reference": 1}, {"rollout": 2}, given)
    assert got == {"train": [0], "reference": [3], "rollout": [4, 5]}
    assert default_device_mapping(0, workers, {"rollout": 2}) == {}


def test_bundles_keep_an_engines_gpus_together_and_sum_what_the_workers_ask_for():
    mapping = {"train": [0, 1], "reference": [0, 1], "rollout": [2, 3, 4, 5]}
    per = {"rollout": 2}
    assert shared_tp_gpus(mapping, per) == {}
    assert worker_gpus(mapping, "rollout", 1, 2) == [4, 5]
    bundles = placement_bundles(7, mapping, per)
    assert bundles == [[0], [1], [2, 3], [4, 5], [6]]  # GPU 6 is mapped to nobody: a bundle of its own
    pins = {"rollout": {"inference_node": 1.0}, "train": {"train_node": 0.5}}
    specs = bundle_specs(bundles, mapping, per, 0.1, pins)
    assert specs[0] == {"GPU": 1.0, "CPU": 1.0, "train_node": 0.5}  # train 0 + reference 0: 0.2 CPU -> 1
    assert specs[2] == {"GPU": 2.0, "CPU": 1.0, "inference_node": 1.0}  # one engine, two GPUs
    assert specs[4] == {"GPU": 1.0, "CPU": 1.0}
    crowded = bundle_specs([[0]], {"train": [0], "reference": [0], "rollout": [0]}, {}, 0.5, pins)
    assert crowded == [{"GPU": 1.0, "CPU": 1.5, "train_node": 0.5, "inference_node": 1.0}]
    with pytest.raises(ValueError, match="rollout rank 2 has no GPU"):
        worker_gpus(mapping, "rollout", 2, 2)


def test_an_engine_spanning_gpus_shares_none_of_them():
    clash = shared_tp_gpus({"train": [0, 1], "rollout": [1, 2]}, {"rollout": 2})
    assert clash == {"rollout": {"train": [1]}}
    assert shared_tp_gpus({"rollout": [0, 1, 1, 2]}, {"rollout": 2}) == {"rollout": {"rollout": [1]}}
    assert shared_tp_gpus({"train": [0], "rollout": [0]}, {"rollout": 1}) == {}  # one GPU: colocation is fine


def test_cpu_workers_ask_for_the_custom_resources_of_their_role():
    cpu = ResourceManager.cpu_only(0.2, {"env": {"cpu_node": 1.0}, "rollout": {}})
    assert cpu.actor_options("env", 3) == {"num_cpus": 0.2, "resources": {"cpu_node": 1.0}, "num_gpus": 0}
    assert cpu.actor_options("rollout", 0) == {"num_cpus": 0.2, "num_gpus": 0}


TP_SCRIPT = """
import ray
from roll_ma.distributed.cluster import Cluster
from roll_ma.distributed.resources import ResourceManager
from roll_ma.distributed.worker import Worker

ray.init(num_cpus=4, num_gpus=4, include_dashboard=False)  # declared GPUs: bundles, no CUDA
rm = ResourceManager(4, {"train": [0, 1], "rollout": [2, 3]}, gpus_per_worker={"rollout": 2},
                     placement_timeout_s=60)
print("BUNDLES", rm.bundle_specs())
train, rollout = Cluster("train", Worker, 2, rm), Cluster("rollout", Worker, 1, rm)
ping = lambda c, ranks: c._call_ranks("ping", ranks, ((), {}), list).get()
print("TRAIN", sorted(p["CUDA_VISIBLE_DEVICES"] for p in ping(train, [0, 1])))
print("ROLLOUT", ping(rollout, [0])[0]["CUDA_VISIBLE_DEVICES"])
"""


def test_a_tensor_parallel_worker_gets_the_gpus_of_its_bundle():
    out = subprocess.run([sys.executable, "-c", TP_SCRIPT], capture_output=True, text=True, timeout=240)
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.stdout.splitlines() if " " in line}
    assert "ROLLOUT" in lines, out.stdout + out.stderr[-3000:]
    assert lines["BUNDLES"].startswith("[{'GPU': 1.0, 'CPU': 1.0}, {'GPU': 1.0, 'CPU': 1.0}, {'GPU': 2.0")
    rollout = set(lines["ROLLOUT"].split(","))
    train = {g for ids in eval(lines["TRAIN"]) for g in ids.split(",")}
    assert len(rollout) == 2 and len(train) == 2 and not rollout & train  # whole GPUs, none shared


# ---------------------------------------------------------------------------- the version check
def test_versions_are_checked_on_every_engine():
    check_versions([{"a": 3, "b": 1}, {"a": 3, "b": 2}], ["a"], 3)  # only the adapters just pushed
    stale = r"2 of 3 rollout engines .*rank 1: \{'a': 2\}; rank 2: \{'a': None\}"
    with pytest.raises(RuntimeError, match=stale):
        check_versions([{"a": 3}, {"a": 2}, {}], ["a"], 3)


# ---------------------------------------------------------------------------- the config checks
def problems_of(name, overrides):
    with pytest.raises(ConfigError) as err:
        load_config(name, overrides=list(overrides))
    return [str(p) for p in err.value.problems]


@pytest.fixture
def eight_gpus(monkeypatch):
    monkeypatch.setattr(validate_module, "local_gpu_count", lambda: 8)


def test_tensor_parallel_layouts_that_validate(eight_gpus):
    cfg = load_config("math_selfplay_7b", overrides=[
        "rollout.tensor_parallel=2", "resources.num_gpus=3",
        "resources.device_mapping={train:[0],rollout:[1,2]}",
    ])
    assert cfg.rollout.tensor_parallel == 2
    # 2 engines x 4 GPUs, 4 train ranks on GPUs 0..3 by default: 12 GPUs would be too many here
    found = problems_of("math_selfplay_7b", [
        "rollout.tensor_parallel=4", "rollout.num_workers=2", "train.num_workers=4", "resources.num_gpus=8",
        "~resources.device_mapping",
    ])
    assert any(p.startswith("resources.num_gpus: rollout takes 2 x 4 GPUs") and "GPUs 4..11" in p
               and "raise it to 12" in p for p in found), found


def test_tensor_parallel_mistakes_name_the_key_and_the_fix(eight_gpus):
    found = problems_of("math_selfplay_tiny", ["rollout.tensor_parallel=2"])
    assert any(p.startswith("rollout.tensor_parallel: the hf backend runs a model on one device")
               for p in found)
    assert any("set resources.num_gpus (>= 2)" in p for p in found)
    # the shipped 7B config colocates rollout and train on GPU 0: an engine on 2 GPUs cannot share
    found = problems_of("math_selfplay_7b", ["rollout.tensor_parallel=2", "resources.num_gpus=2"])
    assert any(p.startswith("resources.device_mapping.rollout: maps 1 GPUs but rollout has 1 workers "
                            "(2 GPUs each, tensor parallel); map 2 GPUs") for p in found), found
    found = problems_of("math_selfplay_7b", ["rollout.tensor_parallel=2", "resources.num_gpus=2",
                                             "resources.device_mapping.rollout=[0,1]"])
    assert any(p.startswith("resources.device_mapping.rollout: with rollout.tensor_parallel=2 each "
                            "rollout worker takes whole GPUs") and "shares GPUs [0] with train" in p
               and "resources.device_mapping.rollout=[1, 2]" in p for p in found), found
    found = problems_of("math_selfplay_7b", ["+rollout.engine_kwargs.tensor_parallel_size=2"])
    assert any(p.startswith("rollout.engine_kwargs.tensor_parallel_size: set rollout.tensor_parallel instead")
               for p in found), found
    # freeing the KV cache alone goes through roll_ma's worker extension: another one is refused
    found = problems_of("math_selfplay_7b", ["rollout.sleep_level=kv_cache",
                                             "+rollout.engine_kwargs.worker_extension_cls=their.Extension"])
    assert any(p.startswith("rollout.sleep_level: kv_cache frees the KV cache through roll_ma's vLLM worker "
                            "extension") and "'their.Extension'" in p for p in found), found
    assert load_config("math_selfplay_7b", overrides=["rollout.sleep_level=kv_cache"],
                       check_local_gpus=False).rollout.sleep_level == "kv_cache"
    # on CPU nothing sleeps: the default kv_cache beside a user's extension is no conflict there
    cpu = ["rollout.backend=vllm", "+rollout.engine_kwargs.worker_extension_cls=their.Extension"]
    try:  # other problems may be found (the backend's installation, the model's dtype): not this one
        load_config("math_selfplay_tiny", overrides=cpu)
    except ConfigError as err:
        assert not any(str(p).startswith("rollout.sleep_level") for p in err.problems), err.problems
    # Qwen2.5-7B has 28 attention heads: 8 shards cannot split them
    found = problems_of("math_selfplay_7b", ["rollout.tensor_parallel=8", "resources.num_gpus=8",
                                             "model.random_weights=true", "~resources.device_mapping",
                                             "train.num_workers=1"])
    assert any("has 28 attention heads, which 8 GPUs cannot split evenly" in p and "[1, 2, 4]" in p
               for p in found), found


def test_role_resources_are_checked():
    found = problems_of("math_selfplay_tiny", [
        "+resources.role_resources={rollut: {a: 1}, train: {CPU: 1}, env: {b: 0}}",
    ])
    assert any(p.startswith("resources.role_resources.rollut: unknown role (did you mean 'rollout'?)")
               for p in found), found
    assert "resources.role_resources.train.CPU: custom resources only: CPUs come from " \
           "resources.num_cpus_per_worker, GPUs from resources.device_mapping" in found
    assert "resources.role_resources.env.b: must be a number > 0, got 0.0" in found
    cfg = load_config("math_selfplay_tiny", overrides=["+resources.role_resources={rollout: {inference: 1}}"])
    assert cfg.resources.role_resources == {"rollout": {"inference": 1.0}}
