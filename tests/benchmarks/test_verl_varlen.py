"""verl's packed rows through torch's varlen flash kernel (benchmarks/peers/verl_varlen.py, issue 60).

verl packs a micro-batch's rows into one sequence (use_remove_padding) and passes the model the packed
position ids, no mask. Without flash-attn (no wheel for the GPU's torch / CUDA) the rows went through
transformers' sdpa on a block-diagonal mask over the whole packed length. A row naming ``roll_ma_varlen``
gets its registration imported in every verl process (VERL_USE_EXTERNAL_MODULES): these tests check that
a model so loaded scores packed rows as each row alone, and that the runners' environments name the module
for exactly those rows. verl's own engine under it: tests/benchmarks/test_atgrpo_multilora.py (needs verl).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

PEERS = Path(__file__).resolve().parents[2] / "benchmarks" / "peers"
sys.path[:0] = [str(PEERS), str(PEERS.parent)]

import job as peer_job  # noqa: E402
import run_atgrpo  # noqa: E402
import run_verl  # noqa: E402

MODULES = "VERL_USE_EXTERNAL_MODULES"


@pytest.fixture(scope="module")
def job():
    return peer_job.load_job(PEERS / "job.yaml")


@pytest.fixture(scope="module")
def relay():
    return peer_job.load_job(PEERS / "relay.yaml")


def test_a_model_loaded_with_it_scores_verls_packed_rows_as_each_row_alone(tiny_model_dir):
    """verl's packed forward: input ids (1, L) of several rows end to end, position ids restarting at 0 at
    each row, no attention mask. Under roll_ma_varlen each row's logits are its own forward's."""
    import verl_varlen
    from transformers import AutoModelForCausalLM

    assert verl_varlen.NAME == run_verl.VARLEN  # the name the rows write is the one registered
    packed_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=run_verl.VARLEN)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa")
    assert packed_model.config._attn_implementation == run_verl.VARLEN
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 200, (n,), generator=gen) for n in (7, 3, 11)]
    ids = torch.cat(rows)[None]  # (1, 21)
    positions = torch.cat([torch.arange(len(r)) for r in rows])[None]  # (1, 21)
    with torch.no_grad():
        packed = packed_model(input_ids=ids, position_ids=positions).logits[0]  # (21, V)
        alone = [plain(input_ids=r[None]).logits[0] for r in rows]  # (n, V) each
        # the same packed input without the rows' boundaries: the later rows would see the earlier ones
        unbounded = plain(input_ids=ids, position_ids=torch.arange(ids.shape[1])[None]).logits[0]
    torch.testing.assert_close(packed, torch.cat(alone), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(unbounded[7:10], alone[1], atol=1e-3)  # the test can tell rows apart


def test_the_rows_naming_it_import_it_in_every_verl_process(job, relay, monkeypatch):
    """verl_best and the AT-GRPO rows name roll_ma_varlen: their runs' environments add verl_varlen to
    VERL_USE_EXTERNAL_MODULES (after the caller's, once) and the folders it imports from to PYTHONPATH's
    end; a row on sdpa keeps verl's environment as it is."""
    monkeypatch.delenv(MODULES, raising=False)
    monkeypatch.setenv("PYTHONPATH", "/staged/verl")
    best, padded = job.rows["verl_best"], job.rows["verl"]
    assert best.native[run_verl.ATTN_KEY] == run_verl.VARLEN
    # verl_best takes verl's fused log-probs too: their untied-head wrapping (verl_fused_head.py) after it
    assert run_verl.external_modules(best) == ["verl_varlen", "verl_fused_head"]
    assert all((PEERS / f"{m}.py").is_file() for m in (run_verl.VARLEN_MODULE, run_verl.FUSED_HEAD_MODULE))
    env = run_verl.verl_env(run_verl.external_modules(best))
    assert env[MODULES] == "verl_varlen,verl_fused_head"
    paths = ["/staged/verl", str(PEERS), str(PEERS.parent), str(PEERS.parents[1])]
    assert env["PYTHONPATH"].split(":") == paths
    assert run_verl.external_modules(padded) == [] and MODULES not in run_verl.verl_env([])
    # a fused row on padded rows takes the head's wrapping alone; the key as a command line writes it counts
    assert run_verl.external_modules(job.rows["verl_best_padded"]) == ["verl_fused_head"]
    as_typed = dataclasses.replace(padded, native={**padded.native, run_verl.FUSED_KEY: "True"})
    assert run_verl.external_modules(as_typed) == ["verl_fused_head"]
    assert run_verl.verl_env([])["PYTHONPATH"] == "/staged/verl"  # verl's own paths untouched
    monkeypatch.setenv(MODULES, "mine,verl_varlen")
    assert run_verl.verl_env(["verl_varlen"])[MODULES] == "mine,verl_varlen"
    monkeypatch.delenv(MODULES)
    # AT-GRPO: the per-agent row adds the multi-LoRA driver module after the attention's; atgrpo_sdpa only it
    per_agent, sdpa = relay.rows["atgrpo"], relay.rows["atgrpo_sdpa"]
    assert run_atgrpo.row_env(per_agent)[MODULES] == "verl_varlen,verl_fused_head,atgrpo_multilora"
    assert run_atgrpo.row_env(sdpa)[MODULES] == "atgrpo_multilora"
    assert sdpa.native[run_verl.ATTN_KEY] == "sdpa"
    assert run_atgrpo.row_env(relay.rows["atgrpo_shared_unfused"])[MODULES] == "verl_varlen"
    assert run_atgrpo.row_env(relay.rows["atgrpo_unfused"])[MODULES] == "verl_varlen,atgrpo_multilora"
    # atgrpo_sdpa is the per-agent row as it first ran: sdpa and unfused log-probs, nothing else apart
    model = "actor_rollout_ref.model"
    now = {**sdpa.native, run_verl.ATTN_KEY: run_verl.VARLEN, f"{model}.use_fused_kernels": True,
           f"{model}.fused_kernel_options.impl_backend": "torch"}  # fmt: skip
    assert dataclasses.replace(sdpa, name="atgrpo", about=per_agent.about, native=now) == per_agent


def test_a_verl_process_in_a_fused_rows_environment_imports_both_modules(job):
    """The route the rows' modules take on the GPU: a process started in verl_best's environment that imports
    verl (as every verl process does) has roll_ma_varlen registered and verl's FSDP2 wrap selection replaced
    by verl_fused_head's (the tests of the modules themselves import them by hand)."""
    pytest.importorskip("verl", reason="verl 0.9.1 and its pins")
    probe = ("import verl, verl.utils.fsdp_utils as f; from transformers import AttentionInterface as A; "
             "print(f._select_fsdp2_wrap_targets.__name__, 'roll_ma_varlen' in A._global_mapping)")
    env = run_verl.verl_env(run_verl.external_modules(job.rows["verl_best"]))
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["wrap_targets_head_in_root", "True"]


def test_packed_rows_without_flash_attn_name_the_varlen_kernel_in_the_refusal(job):
    if peer_job.flash_attn_installed():
        pytest.skip("flash-attn is installed: verl's own kernel runs packed rows")
    bare = dataclasses.replace(job.rows["verl_best"], native={
        k: v for k, v in job.rows["verl_best"].native.items() if k != run_verl.ATTN_KEY})  # fmt: skip
    with pytest.raises(ValueError, match=r"name another in native .*: roll_ma_varlen \(torch's varlen flash"):
        run_verl.check_row(job, bare)
