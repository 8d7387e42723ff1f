"""Where a model comes from, decided before anything loads it: a missing local path or a hub name the hub
cannot give is one problem, found without asking the hub when the name can only be a path; one cause gives
one problem (a damaged config.json is not reported again as a tokenizer problem)."""

from __future__ import annotations

import shutil

import pytest

from roll_ma.cli import main
from roll_ma.errors import PreflightError
from roll_ma.models.builtin import ASSETS
from roll_ma.preflight import run_preflight
from roll_ma.preflight.config_loader import load_config
from roll_ma.preflight.model_source import Hub, locate


class NoHub(Hub):
    """A hub that cannot be reached, with the reason given; counts how often it was asked."""

    def __init__(self, reason: str | None = "the test says so"):
        super().__init__()
        self.reason, self.asked = reason, 0

    def _ask(self):
        self.asked += 1
        return self.reason


@pytest.fixture(autouse=True)
def empty_hub_cache(tmp_path, monkeypatch):
    """An empty local hub cache, and a hub that is offline (HF_HUB_OFFLINE answers without the network)."""
    from huggingface_hub import constants

    cache = tmp_path / "hub_cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # a folder of its own: the demo's outputs/ in the checkout (README's first command) would add a resume
    # problem to the config's default trainer.output_dir
    monkeypatch.chdir(tmp_path)
    return cache


def problems_of(overrides):
    with pytest.raises(PreflightError) as err:
        run_preflight(load_config("math_selfplay_tiny", overrides=overrides))
    return err.value.problems


def test_a_missing_path_next_to_its_folder_is_a_missing_local_path_and_the_hub_is_not_asked(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-models" / "qwen-tiny-v2").mkdir(parents=True)
    hub = NoHub()
    source = locate("my-models/qwen-tiny", hub)
    assert hub.asked == 0
    assert source.problem == (
        f"my-models/qwen-tiny does not exist (no {tmp_path}/my-models/qwen-tiny; the nearest folder that "
        f"exists is {tmp_path}/my-models, it holds qwen-tiny-v2); give the model's local directory "
        "(config.json, weights, tokenizer files), a hub name such as Qwen/Qwen2.5-0.5B-Instruct, or "
        "builtin:tiny")


@pytest.mark.parametrize("name", ["./qwen-tiny", "../models/qwen", "/nowhere/qwen", "~/no-such-model-dir",
                                  "a/b/c", "my models/qwen"])
def test_what_can_only_be_a_path_is_never_taken_for_a_hub_name(name):
    hub = NoHub()
    source = locate(name, hub)
    assert source.problem.startswith(f"{name} does not exist (no ")
    assert hub.asked == 0


def test_a_hub_name_while_the_hub_is_offline_and_not_cached(empty_hub_cache):
    (problem,) = problems_of(["model.path=my-org/no-such-model"])
    assert problem.startswith(
        "model.path: my-org/no-such-model is not a local directory (no ")
    assert problem.endswith(
        f"), and as a hub name it cannot be downloaded: HF_HUB_OFFLINE is set, and the local hub cache "
        f"({empty_hub_cache}) does not hold it; give the model's local directory, or download it where the "
        "hub can be reached (`hf download my-org/no-such-model --local-dir DIR`) and give that DIR")


def test_a_hub_that_does_not_answer_is_named_with_its_reason(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: refused at once
    reason = Hub().unreachable()
    assert reason.startswith("http://127.0.0.1:9 cannot be reached (")


def test_a_cached_hub_name_is_used_with_a_note_while_the_hub_cannot_be_reached(empty_hub_cache):
    snapshot = empty_hub_cache / "models--my-org--cached" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (empty_hub_cache / "models--my-org--cached" / "refs").mkdir()
    (empty_hub_cache / "models--my-org--cached" / "refs" / "main").write_text("abc")
    shutil.copy(ASSETS / "tiny_model" / "config.json", snapshot / "config.json")
    source = locate("my-org/cached", NoHub("HF_HUB_OFFLINE is set"))
    assert source.problem is None and source.path == "my-org/cached"
    assert source.note == (f"my-org/cached is read from the local hub cache ({snapshot}) as the hub "
                           "cannot be reached (HF_HUB_OFFLINE is set); HF_HUB_OFFLINE=1 skips asking it")


def test_a_damaged_config_json_is_one_problem(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(ASSETS / "tiny_model", model)
    text = (model / "config.json").read_text()
    (model / "config.json").write_text(text[: len(text) // 2])
    (problem,) = problems_of([f"model.path={model}", f"trainer.output_dir={tmp_path / 'out'}"])
    assert problem.startswith(f"model.path: {model / 'config.json'} is not valid JSON: Unterminated string")
    assert "cut short" in problem and "tokenizer" not in problem
    # without tokenizer files as well, that is a second cause with its own fix
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    first, second = problems_of([f"model.path={model}", f"trainer.output_dir={tmp_path / 'out'}"])
    assert first == problem
    assert second.startswith(f"model.path: {model} holds no tokenizer files; copy the tokenizer files")


def test_a_missing_tokenizer_path_is_its_own_problem(tmp_path):
    (problem,) = problems_of([f"model.tokenizer_path={tmp_path / 'tok'}", f"trainer.output_dir={tmp_path}"])
    assert problem.startswith(f"model.tokenizer_path: {tmp_path / 'tok'} does not exist (no ")


def test_the_cli_refuses_a_missing_model_path_before_ray(tmp_path, monkeypatch, capsys, no_ray):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-models").mkdir()
    code = main(["--config_name", "math_selfplay_tiny", "model.path=my-models/qwen-tiny",
                 f"trainer.output_dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "the run cannot start (1 problem):" in err
    assert "model.path: my-models/qwen-tiny does not exist" in err
