"""Supervised runs' config: phases, sft / dpo blocks, the teacher; users' SFT and DPO files; batching."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from roll_ma.config import ConfigError
from roll_ma.config.phase_plan import plan_phases
from roll_ma.data.chat_files import prompt_ids, read_dpo_file, read_sft_file, reply_ids
from roll_ma.data.rows import pair_rows, sft_rows
from roll_ma.pipelines.phases.context import agent_schedule
from roll_ma.preflight import validate as validate_module
from roll_ma.preflight.config_loader import load_config

REPO = Path(__file__).resolve().parents[2]


def problems_of(name, overrides=(), **kwargs):
    with pytest.raises(ConfigError) as err:
        load_config(name, overrides=list(overrides), **kwargs)
    return [str(p) for p in err.value.problems]


def test_the_tiny_reflection_config_plans_its_phases():
    cfg = load_config("math_reflection_tiny")
    assert cfg.env.name == "math_reflection" and cfg.env.max_rounds == 5 and cfg.rollout.backend == "hf"
    phases = plan_phases(cfg)
    assert [(p.name, p.objective) for p in phases] == [
        ("before", "eval"),
        ("sft", "sft"),
        ("after_sft", "eval"),
        ("dpo", "dpo"),
        ("after", "eval"),
    ]
    assert phases[1].sft.source == "teacher" and cfg.teacher.model.path == "builtin:tiny"
    assert all(p.agents == ["actor", "critic"] for p in phases)
    # console lines name a phase once: 'dpo', not 'dpo dpo'; a name that does not say its objective gets it
    assert [p.label for p in phases[1::2]] == ["sft", "dpo"]
    two_phases = "phases=[{name: warmup, objective: sft}, {objective: dpo}]"
    cfg = load_config("math_reflection_tiny", overrides=[two_phases])
    assert [p.label for p in plan_phases(cfg)] == ["sft warmup", "1_dpo"]


def test_a_single_objective_is_one_phase_and_overrides_apply():
    cfg = load_config("math_reflection_tiny", overrides=["phases=[]", "train.objective=dpo", "dpo.beta=0.5"])
    (phase,) = plan_phases(cfg)
    assert phase.objective == "dpo" and phase.dpo.beta == 0.5
    cfg = load_config(
        "math_reflection_tiny",
        overrides=[
            "phases=[{objective: sft, agents: [actor], lr: 0.001, sft: {source: rejection, epochs: 3}}]"
        ],
    )
    (phase,) = plan_phases(cfg)
    assert phase.agents == ["actor"] and phase.lr == 0.001 and phase.sft.source == "rejection"
    assert phase.sft.epochs == 3 and phase.sft.batch_size == cfg.sft.batch_size


def test_phase_problems_are_all_reported():
    found = problems_of(
        "math_reflection_tiny",
        [
            "phases=[{objective: sft, agents: [actress], sft: {epochs: zero, sorce: file}}, "
            "{objective: dpo}]",
            "dpo.source=file",
            "teacher.model.path=",
            "train.lr_schedule=cosine",
        ],
    )
    assert any(p.startswith("phases[0].agents:") and "did you mean 'actor'" in p for p in found)
    assert any(p.startswith("phases[0].sft.epochs:") and "integer" in p for p in found)
    assert any(p.startswith("phases[0].sft.sorce:") and "did you mean 'source'" in p for p in found)
    assert any(p.startswith("dpo.path:") and "dpo.source=file needs dpo.path" in p for p in found)
    assert any(p.startswith("train.lr_schedule:") for p in found)
    # the teacher is needed by no phase any more (phases[0] has no valid sft), so no teacher problem here
    found = problems_of("math_reflection_tiny", ["teacher.model.path="])
    assert any(
        p.startswith("teacher.model.path:") and "sft.source=teacher needs a teacher" in p for p in found
    )
    found = problems_of("math_reflection_tiny", ["teacher.model.path=builtin:tiny-habbits"])
    assert any("unknown built-in model" in p for p in found)


def test_built_pairs_and_generated_sft_data_need_the_reflection_game():
    found = problems_of(
        "math_reflection_tiny",
        [
            "env.name=math_selfplay",
            "env.kwargs={rounds: 1}",
            "agents=[{name: solver}, {name: critic}, {name: refiner}]",
        ],
    )
    assert any(p.startswith("sft.source:") for p in found) and any(p.startswith("dpo.source:") for p in found)
    found = problems_of("math_reflection_tiny", ["env.kwargs.max_rounds=3"])
    assert any(p.startswith("env.kwargs.max_rounds:") and "env.max_rounds" in p for p in found)


def test_the_7b_config_is_valid_on_a_machine_without_gpus(monkeypatch):
    monkeypatch.setattr(validate_module, "local_gpu_count", lambda: 2)
    cfg = load_config("math_reflection_7b")
    assert cfg.model.path == "Qwen/Qwen2.5-7B-Instruct" and cfg.model.dtype == "bfloat16"
    assert (
        cfg.rollout.backend == "vllm" and not cfg.rollout.per_row_seeds and cfg.model.gradient_checkpointing
    )
    assert cfg.lora.rank == 16 and cfg.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert cfg.resources.device_mapping["teacher"] == [1]  # the teacher on its own GPU
    out = subprocess.run(
        [sys.executable, str(REPO / "start_pipeline.py"), "--config_name", "math_reflection_7b", "--cfg"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr


def test_sft_and_dpo_files(tmp_path, tiny_model_dir):
    from roll_ma.config.schema import ModelConfig
    from roll_ma.models.loading import load_tokenizer

    sft = tmp_path / "sft.jsonl"
    sft.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {
                    "role": "actor",
                    "messages": [
                        {"role": "user", "content": "Problem: 1+1"},
                        {"role": "assistant", "content": "\\boxed{2}"},
                    ],
                },
                {
                    "role": "critic",
                    "prompt": [{"role": "user", "content": "Problem: 1+1\nSolver: \\boxed{3}"}],
                    "completion": [{"role": "assistant", "content": "1+1=2 Incorrect"}],
                },
            ]
        )
        + "\n"
    )
    examples = read_sft_file(str(sft), ["actor", "critic"])
    assert [(e.agent, e.replies) for e in examples] == [
        ("actor", ("\\boxed{2}",)),
        ("critic", ("1+1=2 Incorrect",)),
    ]
    assert examples[0].prompt == [{"role": "user", "content": "Problem: 1+1"}]
    dpo = tmp_path / "dpo.jsonl"
    dpo.write_text(
        json.dumps(
            {
                "role": "actor",
                "prompt": "Problem: 1+1",
                "chosen": "\\boxed{2}",
                "rejected": [{"role": "assistant", "content": "\\boxed{3}"}],
            }
        )
        + "\n"
    )
    (pair,) = read_dpo_file(str(dpo), ["actor", "critic"])
    assert pair.replies == ("\\boxed{2}", "\\boxed{3}") and pair.prompt == "Problem: 1+1"
    bad = tmp_path / "bad.jsonl"
    with pytest.raises(ValueError, match=f"{bad}:1: role: 'judge' is not an agent"):
        bad.write_text(json.dumps({"role": "judge", "prompt": "x", "chosen": "a", "rejected": "b"}) + "\n")
        read_dpo_file(str(bad), ["actor", "critic"])
    with pytest.raises(ValueError, match=r"bad.jsonl:1: messages\[0\].role: is 'user'; 'messages' must end "
                                         "with the assistant's reply"):
        bad.write_text(json.dumps({"role": "actor", "messages": [{"role": "user", "content": "x"}]}) + "\n")
        read_sft_file(str(bad), ["actor"])

    tok = load_tokenizer(ModelConfig(path=tiny_model_dir))
    chat = prompt_ids(tok, examples[0].prompt, 512)
    assert chat == tok.apply_chat_template(
        examples[0].prompt, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert (
        prompt_ids(tok, "Problem: 1+1", 3) == tok("Problem: 1+1", add_special_tokens=False)["input_ids"][-3:]
    )
    assert reply_ids(tok, "\\boxed{2}")[-1] == tok.eos_token_id


def test_rows_layouts():
    rows = sft_rows([[5, 6, 7], [8]], [[9], [10, 11]], [1, 0], pad_id=0)
    assert rows.batch["prompts"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert rows.batch["response_mask"].tolist() == [[1.0, 0.0], [1.0, 1.0]]
    assert rows.non_tensor["agent_id"].tolist() == [1, 0]
    pairs = pair_rows([[5, 6], [7]], [[9], [10, 11, 12]], [[13, 14], [15]], [0, 1], pad_id=0)
    # chosen and rejected share the prompt and are padded to the same widths
    assert pairs.batch["chosen_input_ids"].shape == pairs.batch["rejected_input_ids"].shape == (2, 5)
    assert (
        pairs.batch["chosen_prompts"].tolist() == pairs.batch["rejected_prompts"].tolist() == [[5, 6], [0, 7]]
    )
    assert pairs.batch["rejected_response_mask"].tolist() == [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="at least one token"):
        sft_rows([[1]], [[]], [0], pad_id=0)


def test_agent_schedule():
    agents = np.array([0] * 5 + [1] * 2)
    steps = agent_schedule(agents, batch_size=2, epochs=2, seed="s")
    # agent 0: 5 rows -> 3 pieces per epoch; agent 1: 2 rows -> 1 piece per epoch;
    # each epoch sees every row once
    assert len(steps) == 6
    seen0 = np.concatenate([s[s < 5] for s in steps])
    assert sorted(seen0.tolist()) == sorted(list(range(5)) * 2)
    assert sorted(np.concatenate([s[s >= 5] for s in steps]).tolist()) == [5, 5, 6, 6]
    assert [len(s) for s in steps] == [4, 4, 1, 2, 2, 1]  # 5 rows in pieces of 2, 2, 1; agent 1 done after 2
    fixed = agent_schedule(agents, batch_size=2, epochs=1, seed="s", steps=4)
    assert len(fixed) == 4 and all(len(s) == 4 for s in fixed)  # both agents cycle through their rows
    assert all(np.array_equal(a, b) for a, b in zip(fixed, agent_schedule(agents, 2, 1, "s", steps=4)))
