"""The RL loop (``loop.run_rl_loop``) and its step: synchronous (``step.py``), streamed
(``step_streamed.py``) or a study's step kind (``loop.STUDY_STEPS``: the joint search of
``roll_ma/studies``), each a short list of the
named stages of ``stages.py`` over one ``run.RLRun``; the adapter sync, the rollout queue and the
on-policy rule they use."""
