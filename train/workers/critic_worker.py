"""The critic's Ray worker: verl's ``TrainingWorker`` (what verl's task runner uses for the critic),
registering :class:`train.workers.value_model.ValueHeadEngine` in its own process before verl looks the engine
up. Kept apart from :mod:`train.workers.value_model`, which the plugin imports in every process on CPU."""

from verl.workers.engine_workers import TrainingWorker

from train.workers.value_model import register


class CriticWorker(TrainingWorker):
    def __init__(self, *args, **kwargs):
        register()
        super().__init__(*args, **kwargs)
