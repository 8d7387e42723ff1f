"""A config's YAML, its overrides and its ${...} refused in config words: ``ConfigError`` (a ``RollMaError``)
naming the file, line and column, or the override, never a YAML, Hydra or OmegaConf traceback. The same from
``roll_ma.train``: the typed error, whose ``str()`` is the whole message."""

from __future__ import annotations

import pytest

import roll_ma
from roll_ma.config import ConfigError
from roll_ma.config.compose import compose_raw
from roll_ma.errors import RollMaError

TINY = "math_selfplay_tiny"
DQ = 'double quote (")'


def _refusal(name: str, config_path: str | None = None, overrides: list[str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        compose_raw(name, config_path, overrides or [])
    assert isinstance(err.value, RollMaError) and len(err.value.problems) == 1
    return err.value


@pytest.mark.parametrize(
    "text, line, column, words",
    [
        ("name: x\nmodel:\n  path: builtin:tiny\n   dtype: float32\n", 4, 9, "indented differently"),
        ("name: x\n\tmodel: {}\n", 2, 1, "spaces, never tabs"),
        ("name: x\nseed: 1\nname: y\n", 3, 1, "given twice"),
        ("name: x\nagents: [{name: a}\n", 2, 9, "never closed"),
    ],
    ids=["indent", "tab", "duplicate", "unclosed"],
)
def test_a_yaml_mistake_names_the_file_line_and_column_and_shows_the_line(
    tmp_path, text, line, column, words
):
    (tmp_path / "mine.yaml").write_text(text)
    err = _refusal("mine", str(tmp_path))
    problem = err.problems[0]
    assert problem.key == f"{tmp_path / 'mine.yaml'}:{line}:{column}", str(err)
    assert "not valid YAML" in problem.message and words in problem.message
    shown = text.splitlines()[line - 1] if line <= len(text.splitlines()) else None
    if shown:  # the line itself, a caret under the column
        assert shown.expandtabs(1) in problem.message and "^" in problem.message


@pytest.mark.parametrize(
    "text, line, column, words",
    [
        # YAML notices the open '{' on the next line, at its ':'; the problem is named where it opens
        ("name: x\nmodel: {path: builtin:tiny\ntrainer:\n  max_steps: 2\n", 2, 8, "this '{' is never closed"),
        ("name: x\nagents: [{name: a}, {name: b}\nseed: 1\n", 2, 9, "this '[' is never closed"),
        ("agents:\n  - {name: a\n  - {name: b}\n", 2, 5, "this '{' is never closed"),
        ("agents: [{name: a, {name: b}]\nseed: 1\n", 1, 10, "this '{' is never closed"),
        ('name: x\nmodel:\n  path: "builtin:tiny\n  dtype: float32\n', 3, 9, f"this {DQ} is never closed"),
        ("name: x\nmodel:\n  path: 'builtin:tiny\n", 3, 9, "this single quote (') is never closed"),
        # the next value's opening quote closes it: YAML stops a line later, after that quote
        ('name: x\nmodel:\n  path: "builtin:tiny\n  dtype: "f32"\n', 3, 9, f"this {DQ} is not closed"),
    ],
    ids=["brace", "bracket", "brace-in-list", "inner-brace", "double-quote", "single-quote", "quote-run-on"],
)
def test_an_unclosed_bracket_or_quote_is_named_where_it_opens(tmp_path, text, line, column, words):
    (tmp_path / "mine.yaml").write_text(text)
    problem = _refusal("mine", str(tmp_path)).problems[0]
    assert problem.key == f"{tmp_path / 'mine.yaml'}:{line}:{column}", str(problem)
    assert problem.message.startswith(f"not valid YAML: {words}"), problem.message
    opening_line = text.splitlines()[line - 1]
    assert f"\n      {opening_line}\n      {' ' * (column - 1)}^" in problem.message  # the caret under it


def test_an_unclosed_brace_says_where_yaml_stopped_and_how_to_close_it(tmp_path):
    (tmp_path / "mine.yaml").write_text("name: x\nmodel: {path: builtin:tiny\ntrainer:\n  max_steps: 2\n")
    message = _refusal("mine", str(tmp_path)).problems[0].message
    assert "on line 3, column 8 YAML expected ',' or '}' and found a key's ':'" in message
    assert "close it with '}', or put a ',' between its entries" in message


def _write_configs(folder, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


@pytest.mark.parametrize(
    "entry, words",
    [
        ("basee", "defaults: 'basee' is no config in {dir}; did you mean 'base'?"),
        ("/basee", "defaults: 'basee' is no config in {dir}; did you mean 'base'?"),
        ("model: tinyy", "defaults: model: 'tinyy' is no config in {dir}/model; did you mean 'tiny'?"),
        ("modell: tiny", "defaults: 'modell' is no config group (a folder) in {dir}; did you mean 'model'?"),
        ("zzz", "defaults: 'zzz' is no config in {dir}; there are: base, mine, model/tiny"),
    ],
    ids=["name", "absolute", "group-option", "group", "nothing-close"],
)
def test_a_defaults_entry_that_names_no_config_is_named_by_file_and_line_with_the_closest(
    tmp_path, entry, words
):
    _write_configs(
        tmp_path,
        {
            "base.yaml": "seed: 1\n",
            "model/tiny.yaml": "path: builtin:tiny\n",
            "mine.yaml": f"name: mine\ndefaults:\n  - _self_\n  - {entry}\n",
        },
    )
    problem = _refusal("mine", str(tmp_path)).problems[0]
    assert problem.key == f"{tmp_path / 'mine.yaml'}:4", str(problem)  # the entry's own line
    assert problem.message.startswith(words.format(dir=tmp_path)), problem.message
    assert "Could not load" not in problem.message and "Config search path" not in problem.message


def test_a_defaults_entry_of_an_included_file_names_that_file(tmp_path):
    _write_configs(
        tmp_path,
        {
            "base.yaml": "defaults:\n  - _self_\n  - commn\nseed: 1\n",
            "common.yaml": "seed: 2\n",
            "mine.yaml": "defaults:\n  - base\n  - _self_\n",
        },
    )
    problem = _refusal("mine", str(tmp_path)).problems[0]
    assert problem.key == f"{tmp_path / 'base.yaml'}:3"
    assert "did you mean 'common'?" in problem.message


def test_a_yaml_mistake_in_a_file_the_defaults_list_includes_names_that_file(tmp_path):
    (tmp_path / "base.yaml").write_text("seed: 1\nmodel:\n  path: x\n    dtype: float32\n")
    (tmp_path / "mine.yaml").write_text("defaults:\n  - base\n  - _self_\nname: mine\n")
    assert _refusal("mine", str(tmp_path)).problems[0].key == f"{tmp_path / 'base.yaml'}:4:10"


@pytest.mark.parametrize(
    "text, key", [(b"name: \xff\n", ":1"), (b"- a\n- b\n", "")], ids=["not-utf8", "list"]
)
def test_a_file_that_is_no_mapping_of_text_is_named(tmp_path, text, key):
    (tmp_path / "mine.yaml").write_bytes(text)
    problem = _refusal("mine", str(tmp_path)).problems[0]
    assert problem.key == f"{tmp_path / 'mine.yaml'}{key}"
    assert "UTF-8" in problem.message or "mapping of config keys" in problem.message


@pytest.mark.parametrize(
    "override, words",
    [
        ("env.seats=[solver,critic", "unclosed bracket"),
        ("model.path='a", "unclosed"),
        ("model.path=x=y", "quote a value"),
        ("=3", "names no key"),
        ("trainer.max_steps", "key=value"),
        ("agents.5.name=x", "cannot be applied"),
        ("~nope", "'nope' does not exist"),
    ],
)
def test_an_override_that_cannot_be_read_or_applied_is_named_and_no_plus_is_advised(override, words):
    problem = _refusal(TINY, overrides=["seed=3", override]).problems[0]
    assert problem.key == override and words in problem.message
    assert "+key" not in problem.message and "hydra.cc" not in problem.message


def test_an_override_that_applies_alone_but_not_after_an_earlier_one_names_the_earlier_one():
    # each applies alone: the pair fails, named on the second with the override that replaced its parent
    problems = _refusal(TINY, overrides=["seed=3", "trainer=5", "trainer.output_dir=/tmp/x"]).problems
    assert [p.key for p in problems] == ["trainer.output_dir=/tmp/x"]
    words = "cannot be applied after 'trainer=5', which replaced trainer as a whole"
    assert problems[0].message.startswith(words)


@pytest.mark.parametrize("override", ["agents.5.lr=1e-4", "agents.solver.lr=1e-4", "+agents.7=x"])
def test_a_list_entry_out_of_range_or_by_name_says_lists_are_addressed_by_position(override):
    problem = _refusal(TINY, overrides=[override]).problems[0]
    assert problem.key == override
    assert "agents is a list: its entries are addressed by position from 0" in problem.message


def test_an_interpolation_that_does_not_resolve_names_its_key_and_the_override_that_set_it():
    problem = _refusal(TINY, overrides=["model.path=${nope}"]).problems[0]
    assert problem.key == "model.path" and "set by the override model.path=${nope}" in problem.message


def test_an_interpolation_in_the_file_names_its_key_and_the_file(tmp_path):
    (tmp_path / "mine.yaml").write_text("name: x\nmodel:\n  path: ${nope.x}\n")
    problem = _refusal("mine", str(tmp_path)).problems[0]
    assert problem.key == "model.path" and str(tmp_path / "mine.yaml") in problem.message


def test_roll_ma_train_raises_the_same_typed_error_whose_str_is_the_whole_message(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("name: x\nmodel:\n  path: builtin:tiny\n   dtype: float32\n")
    with pytest.raises(ConfigError) as err:
        roll_ma.train(str(path))
    assert isinstance(err.value, RollMaError)
    text = str(err.value)
    assert text.startswith("invalid config (1 problem):") and f"{path}:4:9: not valid YAML" in text
    assert "dtype: float32" in text and "^" in text  # the line and the caret: every line of the message
    with pytest.raises(ConfigError) as err:
        roll_ma.train(TINY, trainer__max_steps=0)
    assert str(err.value) == (
        "invalid config (1 problem):\n  - trainer.max_steps: must be 1 or more: a run trains the steps up to "
        "trainer.max_steps, and a run that resumes from a checkpoint the steps after it (got 0)"
    )


def test_the_clis_list_of_overrides_given_to_the_api_is_answered_with_the_keyword_form():
    from roll_ma.errors import ConfigError
    from roll_ma.run import resolve_config

    with pytest.raises(ConfigError) as err:
        resolve_config("math_selfplay_tiny", overrides=["trainer.max_steps=0"])
    assert "trainer__max_steps=2) for trainer.max_steps=2" in str(err.value)
    assert "not a list of key=value strings" in str(err.value)
