"""The Search-R1 task (no verl import except in the agent loop and its manager).

- ``protocol``         the text protocol: tags, turn parsing, observations, answers, the format rule, the
                       outcomes of a turn, a search and a trajectory (the one module that knows the tag strings)
- ``prompts``          the prompts built from those tags: the agent's, the baselines', question normalisation
- ``config``           the ``search_r1:`` config block (search settings and their defaults)
- ``agent_loop``       verl's agent loop for the task (registered as ``search_r1``), a state machine over a
                       per-trajectory :class:`~train.search_r1.agent_loop.Trajectory`
- ``rollout_manager``  verl's agent-loop manager: outage redo, failure-rate stop, LLDS tensors
- ``reward``           exact match / F1 reward (verl's ``custom_reward_function``)
- ``metrics``          the per-step ``search_r1/*`` statistics
- ``dataset``          FlashRAG records -> verl parquet rows (``python -m train.data_prep``)
"""
