"""Pre-flight of data files: every bad row of an SFT, DPO or problem file is listed as ``file:line: field:
what is wrong`` (lines from 1; the first 20, then a count) before Ray or any actor starts."""

from __future__ import annotations

import json

import pytest

from roll_ma.errors import PreflightError
from roll_ma.preflight import run_preflight
from roll_ma.preflight.config_loader import build_config

AGENTS = [{"name": "actor"}, {"name": "critic"}]


def write_jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def phase_config(tmp_path, objective: str, path: str, **extra):
    raw = {
        "name": "preflight",
        "model": {"path": "builtin:tiny", "max_prompt_tokens": 64},
        "agents": AGENTS,
        "env": {"name": "math_reflection", "max_rounds": 2},
        "train": {"objective": objective},
        objective: {"source": "file", "path": path, **extra},
        "trainer": {"output_dir": str(tmp_path / "out")},
    }
    return build_config(raw)


def problems_of(cfg) -> list[str]:
    with pytest.raises(PreflightError) as err:
        run_preflight(cfg)
    return err.value.problems


def test_a_dpo_pair_with_an_empty_side_is_refused_before_ray_starts(tmp_path, no_ray):
    from roll_ma.pipelines import run_training

    path = write_jsonl(tmp_path / "pairs.jsonl", [
        {"role": "actor", "prompt": "Problem: 1+1", "chosen": "\\boxed{2}", "rejected": "\\boxed{3}"},
        {"role": "actor", "prompt": "Problem: 2+2", "chosen": "", "rejected": "\\boxed{5}"},
        {"role": "critic", "prompt": "Problem: 2+2", "chosen": [{"role": "assistant", "content": "  "}],
         "rejected": "Correct"},
    ])
    with pytest.raises(PreflightError) as err:
        run_training(phase_config(tmp_path, "dpo", path))  # the CLI's and roll_ma.train's entry
    assert err.value.problems == [
        f"{path}:2: chosen: is empty",
        f"{path}:3: chosen[0].content: is empty",
    ]
    assert str(err.value).startswith("the run cannot start (2 problems):\n  - ")


def test_an_unknown_role_is_named_with_its_line_counted_from_1(tmp_path, no_ray):
    path = write_jsonl(tmp_path / "pairs.jsonl", [
        {"role": "actor", "prompt": "p", "chosen": "a", "rejected": "b"},
        "",  # a blank line still counts as a line
        {"role": "judge", "prompt": "p", "chosen": "a", "rejected": "b"},
        "{not json",
        {"role": "actr", "prompt": "p", "chosen": "a"},
    ])
    assert problems_of(phase_config(tmp_path, "dpo", path)) == [
        f"{path}:3: role: 'judge' is not an agent of this run; agents: ['actor', 'critic']",
        f"{path}:4: not valid JSON (Expecting property name enclosed in double quotes)",
        f"{path}:5: role: 'actr' is not an agent of this run (did you mean 'actor'?); agents: ['actor', "
        "'critic']",
        f"{path}:5: rejected: missing",
    ]


def test_a_message_role_no_chat_template_renders_is_named(tmp_path, no_ray):
    path = write_jsonl(tmp_path / "pairs.jsonl", [
        {"role": "actor", "prompt": [{"role": "usr", "content": "1+1?"}], "chosen": "2", "rejected": "3"},
        {"role": "actor", "prompt": [{"role": "wizard", "content": "1+1?"}], "chosen": "2", "rejected": "3"},
        {"role": "actor", "prompt": [{"role": "user", "content": "1+1?"}], "chosen": "2", "rejected": "3"},
    ])
    assert problems_of(phase_config(tmp_path, "dpo", path)) == [
        f"{path}:1: prompt[0].role: is 'usr'; a message's role is one of system, user, assistant, tool "
        "(did you mean 'user'?)",
        f"{path}:2: prompt[0].role: is 'wizard'; a message's role is one of system, user, assistant, tool",
    ]


def test_every_bad_row_is_counted_and_the_first_20_are_listed(tmp_path, no_ray):
    rows = [{"role": "actor", "prompt": f"p{i}", "chosen": "a", "rejected": " " if i % 2 else "b"}
            for i in range(60)]
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    found = problems_of(phase_config(tmp_path, "dpo", path))
    assert found[:20] == [f"{path}:{line}: rejected: is empty" for line in range(2, 41, 2)]
    assert found[20:] == [f"... and 10 more problems in {path} (30 in all)"]


def test_sft_rows_are_checked_like_dpo_rows(tmp_path, no_ray):
    user = {"role": "user", "content": "Problem: 1+1"}
    empty_user = {"role": "user", "content": ""}
    path = write_jsonl(tmp_path / "sft.jsonl", [
        {"role": "actor", "messages": [user, {"role": "assistant", "content": "\\boxed{2}"}]},
        {"role": "actor", "messages": [user]},
        {"role": "critic", "messages": [empty_user, {"role": "assistant", "content": "x"}]},
        {"role": "critic", "prompt": "Problem: 1+1", "completion": "   "},
        {"messages": [user, {"role": "assistant", "content": "2"}]},
        {"role": "actor", "text": "no known columns"},
    ])
    assert problems_of(phase_config(tmp_path, "sft", path)) == [
        f"{path}:2: messages[0].role: is 'user'; 'messages' must end with the assistant's reply (the loss "
        "is on it)",
        f"{path}:3: messages[0].content: is empty",
        f"{path}:4: completion: is empty",
        f"{path}:5: role: missing: the column naming the agent this row trains (sft.agent_key); the row has "
        "['messages']",
        f"{path}:6: messages: missing: an SFT row has a 'messages' list (sft.messages_key) or prompt and "
        "completion columns; the row has ['role', 'text']",
    ]


def test_a_reply_longer_than_the_models_positions_is_refused(tmp_path, no_ray):
    long = " ".join(["7"] * 600)  # one token per digit: past the tiny model's 512 positions
    path = write_jsonl(tmp_path / "pairs.jsonl", [
        {"role": "actor", "prompt": "Problem: 1+1", "chosen": "\\boxed{2}", "rejected": long},
    ])
    (problem,) = problems_of(phase_config(tmp_path, "dpo", path))
    assert problem.startswith(f"{path}:1: rejected: ")
    assert problem.endswith("exceed the model's 512 positions (max_position_embeddings); shorten it")


def test_a_phase_file_that_trains_no_agent_of_its_phase_is_refused(tmp_path, no_ray):
    path = write_jsonl(tmp_path / "pairs.jsonl", [
        {"role": "critic", "prompt": "p", "chosen": "a", "rejected": "b"},
    ])
    raw_phases = [{"name": "actor_dpo", "objective": "dpo", "agents": ["actor"],
                   "dpo": {"source": "file", "path": path}}]
    cfg = build_config({"model": {"path": "builtin:tiny"}, "agents": AGENTS,
                        "env": {"name": "math_reflection", "max_rounds": 2}, "phases": raw_phases,
                        "trainer": {"output_dir": str(tmp_path / "out")}})
    assert problems_of(cfg) == [
        f"phases[0].dpo.path: none of the 1 rows of {path} names an agent that phase 'actor_dpo' trains "
        "(['actor']); nothing would train"
    ]


def test_a_missing_data_file_is_named_with_its_key(tmp_path, no_ray):
    missing = str(tmp_path / "nowhere.jsonl")
    assert problems_of(phase_config(tmp_path, "sft", missing)) == [
        f"sft.path: {missing} is not a file (roll_ma never downloads data; give a local path)"
    ]


def test_problem_files_of_the_env_are_checked_row_by_row(tmp_path, no_ray):
    path = write_jsonl(tmp_path / "problems.jsonl", [
        {"question": "1+1", "answer": "#### 2"},
        {"question": "", "answer": "#### 3"},
        {"question": "2+2"},
        {"question": "3+3", "answer": None},
    ])
    cfg = build_config({"model": {"path": "builtin:tiny"},
                        "agents": [{"name": "solver"}, {"name": "critic"}, {"name": "refiner"}],
                        "env": {"data": {"source": path, "preset": "gsm8k"}},
                        "trainer": {"output_dir": str(tmp_path / "out")}})
    assert problems_of(cfg) == [f"{path}:2: question: is empty", f"{path}:3: answer: missing",
                                f"{path}:4: answer: is null (no text)"]


def test_an_explicit_null_is_said_as_null_not_missing(tmp_path, no_ray):
    path = write_jsonl(tmp_path / "sft.jsonl", [
        {"role": "actor", "messages": [{"role": "user", "content": None},
                                       {"role": "assistant", "content": "2"}]},
        {"role": "actor", "messages": [{"role": "user"}, {"role": "assistant", "content": "2"}]},
        {"role": "actor", "messages": [{"role": None, "content": "1+1"},
                                       {"role": "assistant", "content": "2"}]},
        {"role": "actor", "prompt": None, "completion": "2"},
        {"role": None, "prompt": "1+1", "completion": "2"},
    ])
    assert problems_of(phase_config(tmp_path, "sft", path)) == [
        f"{path}:1: messages[0].content: is null (no text)",
        f"{path}:2: messages[0].content: missing",
        f"{path}:3: messages[0].role: is null (no text)",
        f"{path}:4: prompt: is null (no text)",
        f"{path}:5: role: is null (no text)",
    ]


def test_good_files_pass(tmp_path, no_ray):
    path = write_jsonl(tmp_path / "pairs.jsonl", [
        {"role": "actor", "prompt": [{"role": "system", "content": ""}, {"role": "user", "content": "1+1"}],
         "chosen": [{"role": "assistant", "content": "\\boxed{2}"}], "rejected": "\\boxed{3}"},
    ])
    run_preflight(phase_config(tmp_path, "dpo", path))  # an empty system message is allowed
