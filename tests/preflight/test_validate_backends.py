"""The backends a config names (train.strategy, rollout.backend, teacher.rollout.backend): a built-in name,
'pkg.module:Name' or 'path/file.py:Name', resolved before any actor starts; a spec that names no backend is
refused with a ConfigError naming the key, and what the checks ask of a backend is a trait of its class."""

import pytest

from roll_ma.config.typed import ConfigError
from roll_ma.preflight.config_loader import load_config

USER_BACKENDS = '''
from roll_ma.inference.hf_infer import HFInferStrategy
from roll_ma.training.deepspeed_train import DeepSpeedTrainStrategy


class MyRollout(HFInferStrategy):
    pass


class OnePolicy(DeepSpeedTrainStrategy):  # inherits the built-in's traits: one policy, full fine-tuning
    pass


class NotABackend:
    def generate(self, data, request):
        return data
'''


@pytest.fixture
def user_file(tmp_path, monkeypatch):
    (tmp_path / "my_backends.py").write_text(USER_BACKENDS)
    monkeypatch.chdir(tmp_path)
    return "my_backends.py"


def refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        load_config("tiny_hanabi_selfplay", overrides=overrides)
    return str(err.value)


def test_backends_named_by_file_and_by_module_load(user_file):
    cfg = load_config("tiny_hanabi_selfplay", overrides=[
        f"rollout.backend={user_file}:MyRollout", "train.strategy=roll_ma.training.multi_agent_deepspeed:"
        "MultiAgentDeepSpeedStrategy", f"teacher.rollout.backend={user_file}:MyRollout"])
    assert cfg.rollout.backend == f"{user_file}:MyRollout"


@pytest.mark.parametrize("key,spec,says", [
    ("rollout.backend", "missing.py:MyRollout", "no file 'missing.py'"),
    ("rollout.backend", "my_backends.py:MyRolout", "has no 'MyRolout' (did you mean 'MyRollout'?)"),
    ("rollout.backend", "my_backends.py:NotABackend", "lacks adapter_versions"),
    ("train.strategy", "my_backends.py:MyRollout", "lacks adapter_tensors"),
    ("train.strategy", "deepspeed_trian", "did you mean 'deepspeed_train'?"),
    ("teacher.rollout.backend", "no_such_pkg.mod:Engine", "cannot import 'no_such_pkg.mod'"),
])
def test_a_spec_that_names_no_backend_is_refused_naming_its_key(user_file, key, spec, says):
    message = refusal([f"{key}={spec}"])
    (line,) = [line for line in message.splitlines() if line.strip().startswith(f"- {key}:")]
    assert says in line


def test_a_users_subclass_is_checked_by_the_traits_it_inherits(user_file):
    # two trainable adapters (player_0, player_1): the built-in's one-policy trait refuses them, as for it
    message = refusal([f"train.strategy={user_file}:OnePolicy"])
    assert f"train.strategy: {user_file}:OnePolicy trains one policy but 2 adapters are trainable" in message
    message = refusal(["train.full_finetune=true"])
    assert "train.full_finetune: full fine-tuning needs a train.strategy that trains every weight" in message
