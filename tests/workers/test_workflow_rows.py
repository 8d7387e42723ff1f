"""Workflow episodes against a scripted rollout: exactly the rows, rewards, metrics and batches expected."""

from pathlib import Path

import numpy as np
import pytest
import torch
from scripted import ScriptedRollout, make_worker, specs

from roll_ma.config.schema import AlgorithmConfig
from roll_ma.metrics import episode_env_metrics, rollout_metrics
from roll_ma.protocol.requests import GenerateRequest
from roll_ma.workers.env_worker import sample_seed
from roll_ma.workers.workflow_worker import WorkflowError

FLOWS = Path(__file__).parents[1] / "helpers" / "flows.py"  # shared by the workflow and worker tests
SOLVER, CHECKER = 0, 1
ANSWERS = {SOLVER: "\\boxed{7}", CHECKER: "Correct"}


def scripted(worker, version=3):
    return ScriptedRollout(worker.tokenizer, lambda agent_id, prompt: ANSWERS[agent_id], version)


def test_each_rollout_call_asks_its_sampling_in_a_typed_request_and_nothing_in_meta_info():
    worker = make_worker(f"{FLOWS}:ScriptedTrio", ["solver", "checker"])
    rollout = scripted(worker)
    worker.run_episodes(rollout, specs([{"n": 1}, {"n": 2}]), step=4)
    worker.run_episodes(rollout, specs([{"n": 1}]), step=5, greedy=True)  # evaluation
    # the run seed (0) and the step make the call's seed; the rows' own seeds come from (episode, turn)
    assert rollout.sampling == [GenerateRequest(seed=4)] * 3 + [GenerateRequest(greedy=True, seed=5)] * 3
    assert rollout.metas == [{}] * 6


def test_scripted_workflow_gives_exactly_the_expected_rows_rewards_and_metrics():
    worker = make_worker(f"{FLOWS}:ScriptedTrio", ["solver", "checker"], kwargs={"checker_reward": 0.5})
    rollout = scripted(worker)
    batch = worker.run_episodes(rollout, specs([{"n": 1}, {"n": 2}, {"n": 3}]), step=4)

    # three ticks, each ONE rollout call holding that call of every episode
    assert rollout.calls == [[SOLVER] * 3, [CHECKER] * 3, [SOLVER] * 3]
    assert batch.meta_info["rounds"] == 3
    # each call samples with its own seed from (episode, turn), whatever tick it falls in
    assert rollout.seeds == [sample_seed(f"g-e{e}", t) for t in range(3) for e in range(3)]
    nt = batch.non_tensor
    assert len(batch) == 9
    for e in range(3):
        rows = np.flatnonzero(nt["episode_id"] == f"g-e{e}")
        assert nt["turn"][rows].tolist() == [0, 1, 2]
        assert nt["agent_id"][rows].tolist() == [SOLVER, CHECKER, SOLVER]
        assert nt["player"][rows].tolist() == [SOLVER, CHECKER, SOLVER]  # each agent is its own seat
        # per-call rewards for the solver (0.25, 1.0), the checker's trajectory reward on its last call
        assert batch.batch["scores"][torch.as_tensor(rows)].tolist() == [0.25, 0.5, 1.0]
        assert nt["done"][rows].tolist() == [False, False, True]
        assert nt["response_text"][rows].tolist() == ["\\boxed{7}", "Correct", "\\boxed{7}"]
    assert set(nt["adapter_version"].tolist()) == {3}  # what the engine reported
    assert set(nt["group_id"].tolist()) == {"g"}
    assert all(not t for t in nt["prompt_truncated"]) and all(c == [] for c in nt["action_choices"])
    # the prompt is the chat template of the workflow's messages
    prompt = worker.tokenizer.decode(
        batch.batch["prompts"][0][batch.batch["attention_mask"][0, : batch.batch["prompts"].shape[1]].bool()]
    )
    assert prompt.endswith("<|im_start|>user\ntask 1: first<|im_end|>\n<|im_start|>assistant\n")
    mask = batch.batch["response_mask"]
    assert torch.equal(batch.batch["rollout_log_probs"], -0.5 * mask)

    episodes = batch.meta_info["episodes"]
    assert [e["returns"] for e in episodes] == [[1.25, 0.5]] * 3
    assert [e["metrics"]["n"] for e in episodes] == [1.0, 2.0, 3.0]
    assert all(e["metrics"]["workflow_failed"] == 0.0 and e["metrics"]["calls"] == 3.0 for e in episodes)
    assert all(e["model_turns"] == {"solver": 2, "checker": 1} and not e["truncated"] for e in episodes)
    env_metrics = episode_env_metrics(episodes, "rollout/env")
    assert env_metrics["rollout/env/n"] == 2.0 and env_metrics["rollout/env/workflow_failed"] == 0.0
    m = rollout_metrics(batch, episodes, ["solver", "checker"], {SOLVER: 3, CHECKER: 3})
    assert m["agent/solver/turns"] == 6 and m["agent/checker/turns"] == 3
    assert m["agent/solver/reward"] == pytest.approx(0.625) and m["agent/checker/reward"] == 0.5
    assert m["rollout/stale_rows"] == 0 and m["rollout/return_seat0"] == 1.25


def test_trajectory_reward_reaches_every_call_of_the_agent_through_the_returns():
    from roll_ma.algorithms.advantages import add_advantages

    worker = make_worker(f"{FLOWS}:ScriptedTrio", ["solver", "checker"])
    batch = worker.run_episodes(scripted(worker), specs([{"n": 1}]), step=1)
    out = add_advantages(batch, AlgorithmConfig(gamma=1.0))
    returns = (out.batch["returns"] * out.batch["response_mask"]).amax(-1).tolist()
    # the solver's first call is credited its own 0.25 plus its later 1.0; the checker its 0.5
    assert returns == pytest.approx([1.25, 0.5, 1.0])


def test_function_workflow_by_dotted_name_with_parallel_calls_in_one_tick():
    worker = make_worker("flows:parallel_flow", ["solver", "checker"], kwargs={"bonus": 0.5})
    rollout = scripted(worker)
    batch = worker.run_episodes(rollout, specs([{}, {}]), step=1)
    assert rollout.calls == [[SOLVER, CHECKER, SOLVER, CHECKER], [SOLVER, SOLVER]]
    solver_rows = batch.non_tensor["agent_id"] == SOLVER
    # a trajectory reward lands on the solver's last call (turn 2), the others get 0
    assert batch.batch["scores"][torch.as_tensor(solver_rows)].tolist() == [0.0, 1.5, 0.0, 1.5]
    assert batch.batch["scores"][torch.as_tensor(~solver_rows)].tolist() == [0.0, 0.0]
    assert [e["metrics"]["turn_of_last"] for e in batch.meta_info["episodes"]] == [2.0, 2.0]


def _flaky_line() -> int:
    return next(i for i, line in enumerate(FLOWS.read_text().splitlines(), 1) if "# RAISE HERE" in line)


def test_a_workflow_that_raises_stops_the_run_naming_its_file_and_line():
    worker = make_worker(f"{FLOWS}:Flaky", ["solver"])
    with pytest.raises(WorkflowError) as err:
        worker.run_episodes(scripted(worker), specs([{}, {"fail": True}, {}]), step=1)
    message = str(err.value)
    assert f"{FLOWS}:{_flaky_line()} in run" in message
    assert "ZeroDivisionError: division by zero" in message and "episode g-e1" in message
    assert "env.on_workflow_error=skip" in message


def test_with_skip_a_failed_episode_is_counted_and_the_others_go_on():
    worker = make_worker(f"{FLOWS}:Flaky", ["solver"], on_workflow_error="skip")
    batch = worker.run_episodes(scripted(worker), specs([{}, {"fail": True}, {}]), step=1)
    assert batch.non_tensor["episode_id"].tolist() == ["g-e0", "g-e2"]  # the failed episode's row is dropped
    assert batch.batch["scores"].tolist() == [1.0, 1.0]
    episodes = batch.meta_info["episodes"]
    assert [e["metrics"]["workflow_failed"] for e in episodes] == [0.0, 1.0, 0.0]
    assert f"{FLOWS}:{_flaky_line()}" in episodes[1]["error"] and episodes[1]["returns"] == [0.0]
    assert episode_env_metrics(episodes, "rollout/env")["rollout/env/workflow_failed"] == pytest.approx(1 / 3)


def test_max_turns_truncates_an_endless_workflow_and_keeps_its_rows():
    worker = make_worker(f"{FLOWS}:Chatty", ["solver"], max_turns=3)
    batch = worker.run_episodes(scripted(worker), specs([{}]), step=1)
    assert batch.non_tensor["turn"].tolist() == [0, 1, 2] and batch.batch["scores"].tolist() == [
        0.0,
        0.0,
        0.0,
    ]
    assert batch.non_tensor["done"].tolist() == [False, False, True]
    assert batch.meta_info["episodes"][0]["truncated"] is True


@pytest.mark.parametrize(
    "flow, expected",
    [
        ("BadReturn", "returned list"),
        ("WrongLength", "lists 2 per-call rewards but 'solver' made 1 calls"),
        ("UnknownAgent", "rewarded 'critic', which is not an agent of this run"),
    ],
)
def test_a_malformed_result_is_a_workflow_failure(flow, expected):
    worker = make_worker(f"{FLOWS}:{flow}", ["solver"])
    with pytest.raises(WorkflowError, match=expected) as err:
        worker.run_episodes(scripted(worker), specs([{}]), step=1)
    assert f"{FLOWS}: the value run() returned" in str(err.value)


def test_tools_run_between_ticks_and_their_failures_are_observations():
    tools = {
        "python": {"timeout_s": 60},
        "hang": {"tool": "flows:HangTool", "timeout_s": 0.2},
        "crash": {"tool": "flows:CrashTool"},
    }
    worker = make_worker(f"{FLOWS}:ToolUser", ["solver"], tools=tools)
    rollout = scripted(worker)
    batch = worker.run_episodes(rollout, specs([{"n": 2}, {"n": 3}, {"n": 4}]), step=1)
    assert rollout.calls == [[SOLVER] * 3]  # the tick waited for every episode's program
    assert batch.batch["scores"].tolist() == [1.0, 1.0, 1.0]  # each program printed n * 7
    assert "14" in rollout.prompts[0] and "21" in rollout.prompts[1]
    for e in batch.meta_info["episodes"]:
        m = e["metrics"]
        assert m["hang_limit_time"] == 1.0 and m["crash_error"] == 1.0
        assert (m["tool_calls"], m["tool_errors"], m["tool_timeouts"]) == (3.0, 2.0, 1.0)


def test_an_unknown_agent_name_fails_in_the_workflows_own_line():
    worker = make_worker(f"{FLOWS}:WrongName", ["solver"])
    with pytest.raises(WorkflowError, match=r"no agent 'critic' in this run; agents: \['solver'\]") as err:
        worker.run_episodes(scripted(worker), specs([{}]), step=1)
    assert f"{FLOWS}:" in str(err.value) and "in run" in str(err.value)
