"""model.liger_kernel: refused where it cannot run, wired to the train and reference models only, and
(on a GPU with liger-kernel) the same log-probs and gradients as transformers' own kernels."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch

from roll_ma.config.schema import ModelConfig
from roll_ma.models import liger
from roll_ma.models.loading import load_base_model


def test_cpu_runs_and_missing_installs_are_refused_in_config_words():
    assert "resources.num_gpus=0" in liger.liger_problem(0)
    if importlib.util.find_spec("liger_kernel") is None:
        assert "pip install 'roll_ma[liger]'" in liger.liger_problem(1)
    assert liger.liger_problem(1, check_installed=False) is None  # a GPU config checked on a laptop
    from roll_ma.config.schema import RunConfig
    from roll_ma.preflight.validate import validate

    cfg = RunConfig()  # a CPU run
    cfg.model.liger_kernel = True
    assert [p.key for p in validate(cfg, check_env=False)] == ["model.liger_kernel"]


@pytest.fixture
def fake_liger(monkeypatch):
    """liger-kernel's patch table with a recording patcher for qwen2 (no Triton here)."""
    calls = []

    def apply_liger_kernel_to_qwen2(rope=True, cross_entropy=False, fused_linear_cross_entropy=True,
                                    rms_norm=True, swiglu=True, model=None):
        calls.append(dict(rope=rope, cross_entropy=cross_entropy, rms_norm=rms_norm, swiglu=swiglu,
                          fused_linear_cross_entropy=fused_linear_cross_entropy, model=model))

    patch = types.ModuleType("liger_kernel.transformers.monkey_patch")
    patch.MODEL_TYPE_TO_APPLY_LIGER_FN = {"qwen2": apply_liger_kernel_to_qwen2, "llama": lambda **_: None}
    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", patch)
    return patch, calls


def test_train_and_reference_models_get_the_fused_kernels_and_roll_mas_lm_head(tiny_model_dir, fake_liger):
    _, calls = fake_liger
    cfg = ModelConfig(path=tiny_model_dir, liger_kernel=True)
    model = load_base_model(cfg, packed_rows=True)
    assert len(calls) == 1 and calls[0]["model"] is model
    assert calls[0]["rope"] and calls[0]["rms_norm"] and calls[0]["swiglu"]
    assert not calls[0]["cross_entropy"] and not calls[0]["fused_linear_cross_entropy"]
    load_base_model(cfg)  # a rollout / evaluation model (HF backend): untouched
    assert len(calls) == 1


def test_auto_turns_the_kernels_on_where_they_run_and_says_once_why_not_elsewhere(
    tiny_model_dir, fake_liger, capsys, monkeypatch
):
    monkeypatch.setattr(liger, "_SAID", set())
    qwen2, gpt2 = (
        types.SimpleNamespace(config=types.SimpleNamespace(model_type=t)) for t in ("qwen2", "gpt2")
    )
    assert liger.liger_enabled("auto", "cuda:0", qwen2)  # a GPU, liger installed, a type it patches
    assert capsys.readouterr().out == ""
    assert not liger.liger_enabled("auto", "cpu", qwen2)
    assert not liger.liger_enabled("auto", "cpu", qwen2)  # the same reason is said once a process
    assert not liger.liger_enabled("auto", "cuda", gpt2)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert all(line.startswith("[roll_ma] model.liger_kernel=auto: off, ") for line in lines)
    assert "no CUDA GPU" in lines[0] and "'gpt2'" in lines[1]
    assert liger.liger_enabled(True, "cpu", qwen2) and not liger.liger_enabled(False, "cuda", qwen2)
    _, calls = fake_liger
    load_base_model(ModelConfig(path=tiny_model_dir), packed_rows=True)  # the default, auto, on a CPU
    assert calls == []


def test_auto_says_how_to_install_where_liger_is_missing(capsys, monkeypatch):
    monkeypatch.setattr(liger, "_SAID", set())
    monkeypatch.delitem(sys.modules, "liger_kernel", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    model = types.SimpleNamespace(config=types.SimpleNamespace(model_type="qwen2"))
    assert not liger.liger_enabled("auto", "cuda", model)
    assert "pip install 'roll_ma[liger]'" in capsys.readouterr().out


def test_a_model_type_liger_does_not_patch_is_named(tiny_model_dir, fake_liger):
    patch, _ = fake_liger
    del patch.MODEL_TYPE_TO_APPLY_LIGER_FN["qwen2"]
    with pytest.raises(ValueError, match=r"no kernels for model type 'qwen2' \(it patches: llama\)"):
        load_base_model(ModelConfig(path=tiny_model_dir, liger_kernel=True), packed_rows=True)


def test_without_liger_installed_the_worker_says_how_to_install(tiny_model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # an import of it fails
    with pytest.raises(ImportError, match=r"pip install 'roll_ma\[liger\]'"):
        load_base_model(ModelConfig(path=tiny_model_dir, liger_kernel=True), packed_rows=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("liger_kernel") is None,
                    reason="needs CUDA and liger-kernel")
def test_liger_kernels_give_the_same_log_probs_and_gradients_on_gpu(tiny_model_dir):
    ids = torch.randint(3, 500, (2, 64), generator=torch.Generator().manual_seed(0)).cuda()

    def loss_and_grads(liger_kernel):
        cfg = ModelConfig(path=tiny_model_dir, dtype="bfloat16", liger_kernel=liger_kernel)
        model = load_base_model(cfg, "cuda", packed_rows=True)
        model.train()
        logits = model(input_ids=ids).logits.float()  # (B, T, V)
        loss = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).mean()
        loss.backward()
        return loss.detach(), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}

    ref_loss, ref_grads = loss_and_grads(False)  # first: liger patches transformers' modules process-wide
    loss, grads = loss_and_grads(True)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=2e-2)
    for name, g in ref_grads.items():
        cos = torch.nn.functional.cosine_similarity(g.flatten(), grads[name].flatten(), dim=0)
        assert cos > 0.98, (name, cos.item())
