"""Studies: features that serve one research question, kept beside the core and plugged into it.

The joint policy search of tiny Hanabi (``docs/studies/tiny_hanabi``): the search over a game's tree
(``joint_policy_search.py``), its passes over the train worker's policies (``joint_search_train.py``) and the
RL step that runs it every ``study.joint_search_every`` steps (``joint_search_step.py``). The entropy bonus
over a game's legal actions (``action_entropy.py``, ``study.action_entropy_coef``): an extra term of the PPO
loss. Advantages balanced over the reward classes an env labels (``reward_classes.py``,
``study.balance_reward_classes``).

The core imports nothing of this package (pyproject.toml's import-linter contract); a study plugs into the
core's plug points instead. Importing ``roll_ma.studies`` registers them: the entry points (``roll_ma.train``,
``start_pipeline.py``, ``roll_ma/run.py``) import it before a run starts. A study's function that runs in a
Ray worker goes there with the call, or with the train worker's spec (a loss term): Ray imports its module
in the worker.
"""

from roll_ma.pipelines.clusters import STUDY_LOSS_TERMS
from roll_ma.pipelines.rl.loop import STUDY_STEPS
from roll_ma.pipelines.rl.rl_run import STUDY_ADVANTAGE_WEIGHTS
from roll_ma.studies.action_entropy import action_entropy_bonus
from roll_ma.studies.joint_search_step import joint_search_step
from roll_ma.studies.reward_classes import balance_reward_classes

STUDY_STEPS.register("joint_search", joint_search_step)
STUDY_LOSS_TERMS.register("action_entropy", action_entropy_bonus)
STUDY_ADVANTAGE_WEIGHTS.register("balance_reward_classes", balance_reward_classes)
