import random

import pytest

from roll_ma.envs import MultiAgentEnv, StepResult, Turn, list_envs, make_env, register_env


class _CoinEnv(MultiAgentEnv):
    """A one-turn test env: say heads."""

    def __init__(self, seat_agents=None, bonus=1.0):
        self.num_players, self.seat_agents, self.bonus = 1, seat_agents or ["a"], bonus

    def reset(self, seed):
        self._r = 0.0
        return Turn(0, self.seat_agents[0], [{"role": "user", "content": "say heads"}], ["heads"])

    def step(self, action_text):
        self._r = self.bonus if "heads" in action_text else 0.0
        return StepResult([self._r], True, {"format_error": False, "action": None, "fallback": False}, None)

    def episode_returns(self):
        return [self._r]

    def episode_metrics(self):
        return {}

    def builtin_action(self, policy, rng):
        return "heads"


def test_builtin_names_listed():
    names = list_envs()
    for name in ("hanabi", "tiny_hanabi", "kuhn_poker", "leduc_poker", "tic_tac_toe", "math_selfplay"):
        assert name in names


def test_register_and_make():
    register_env("coin_test")(_CoinEnv)
    register_env("coin_test")(_CoinEnv)  # registering the same class again is harmless
    env = make_env("coin_test", bonus=2.0)
    env.reset(0)
    assert env.step("heads").rewards == [2.0]
    with pytest.raises(ValueError, match="already registered"):
        register_env("coin_test")(type("Other", (_CoinEnv,), {}))
    with pytest.raises(TypeError):
        register_env("not_an_env")(dict)


def test_import_path_both_spellings():
    for path in (f"{__name__}:_CoinEnv", f"{__name__}._CoinEnv"):
        env = make_env(path, bonus=3.0)
        env.reset(1)
        assert env.step(env.builtin_action("random", random.Random(0))).rewards == [3.0]


def test_env_from_a_file(tmp_path, monkeypatch):
    from roll_ma.config import ConfigError
    from roll_ma.preflight.config_loader import load_config

    (tmp_path / "my_envs.py").write_text(
        "from roll_ma.envs.tiny_hanabi import TinyHanabiEnv\n\n\nclass MyHanabi(TinyHanabiEnv):\n    pass\n"
    )
    env = make_env(f"{tmp_path}/my_envs.py:MyHanabi")
    assert env.num_players == 2 and type(env).__name__ == "MyHanabi"
    monkeypatch.chdir(tmp_path)  # a relative file is looked up from where the run starts
    cfg = load_config("tiny_hanabi_selfplay", overrides=["env.name=my_envs.py:MyHanabi"])
    assert cfg.env.name == "my_envs.py:MyHanabi"
    # the run hands the env workers an absolute path: they may run in another directory
    import roll_ma.pipelines.rl.loop as loop
    from roll_ma.pipelines import run_training

    monkeypatch.setattr(loop, "run_rl_loop", lambda cfg, plan, step_hook=None: cfg)
    assert run_training(cfg).env.name == f"{(tmp_path / 'my_envs.py').resolve()}:MyHanabi"
    with pytest.raises(ConfigError, match="has no 'Nope'"):
        load_config("tiny_hanabi_selfplay", overrides=["env.name=my_envs.py:Nope"])
    with pytest.raises(ValueError, match="no file 'missing.py'"):
        make_env("missing.py:MyHanabi")


def test_unknown_name_did_you_mean():
    with pytest.raises(ValueError) as e:
        make_env("tiny_hanabbi")
    msg = str(e.value)
    assert "did you mean 'tiny_hanabi'" in msg and "registered:" in msg and "kuhn_poker" in msg


def test_bad_import_paths():
    with pytest.raises(ValueError, match="cannot import 'no_such_pkg_xyz.mod'"):
        make_env("no_such_pkg_xyz.mod:Env")
    with pytest.raises(ValueError, match="base.py has no 'Nope'"):
        make_env("roll_ma.envs.base:Nope")
    with pytest.raises(ValueError, match="not a MultiAgentEnv"):
        make_env("roll_ma.envs.base:Turn")


def test_import_is_light():
    import subprocess
    import sys

    heavy = ("pyspiel", "math_verify", "ray", "vllm", "deepspeed")
    code = f"import sys, roll_ma.envs, roll_ma.data; print(any(m in sys.modules for m in {heavy!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
