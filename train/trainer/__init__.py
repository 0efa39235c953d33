"""Driving verl's trainer (``python -m train.main``), in the order a run goes through it.

- ``launch``            a run from its config, top to bottom
- ``config_checks``     our config blocks, the batch split, moved names, verl's validation
- ``preflight``         the machine, model and data checked before Ray
- ``checkpoint_store``  complete checkpoints, resume, retention, free space
- ``metrics_file``      the run's metrics jsonl (appended across restarts) and its one reader
- ``ray_setup``         Ray for the run (own instance or a cluster)
- ``sigterm``           SIGTERM: exit 143, or finish and save the step first (and the collapse stop's flag)
- ``task_runner``       the Ray actor that builds and runs the trainer, installs the LLDS / drift loss
- ``ray_trainer``       verl's RayPPOTrainer plus our step metrics, the collapse warning and checkpoints
- ``probe``             the collapse warning's displacement probe: fixed trajectories re-scored each step
- ``batch_geometry``    batch sizes that give the released runs' 10 updates per batch
- ``plots``             the PNGs of ``python -m train.plot``
"""
