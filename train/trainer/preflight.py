"""Checks that run in ``train.main`` before Ray starts, so a misconfigured run fails (or adapts)
in seconds with the fix, not minutes later inside a worker.

- wandb without an account: log offline, with a one-line notice (``wandb.init`` would otherwise raise
  "No API key configured" at the start of ``fit()``).
- multi-node: the checkpoint directory must be an absolute path that every node shares.
- GPUs present but invisible to torch: almost always an NVIDIA driver older than the CUDA build of
  torch needs (verl 0.9.1's vLLM extra resolves torch 2.11.0 built for CUDA 13: driver >= 580).
- the corpus: a paper preset expects wiki-18 (``search_r1.expect_corpus``); a retriever serving another
  one is refused (:mod:`train.trainer.corpus_check`).
- GPU runs need a C compiler and the Python headers at run time: Triton (verl's ``torch.compile`` of
  the entropy, vLLM's compiled graphs) builds a small C launcher on first use.
"""

from __future__ import annotations

import netrc
import os
import shutil
import subprocess
import sysconfig
from typing import Mapping, MutableMapping, Optional

from train.errors import ConfigError, DataError, SetupError

#: The CUDA major version of the torch that ``.[gpu]`` installs, and the driver it needs.
TORCH_CUDA = "13"
MIN_DRIVER = 580


def as_list(value) -> list[str]:
    """A config value that may be one string or a list of them (trainer.logger, data.train_files)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(x) for x in value]


def has_wandb_credentials(environ: Mapping[str, str]) -> bool:
    if environ.get("WANDB_API_KEY"):
        return True
    path = environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        hosts = netrc.netrc(path).hosts
    except (OSError, netrc.NetrcParseError):
        return False
    base = environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    return base in hosts or "api.wandb.ai" in hosts


def wandb_preflight(trainer_logger, environ: MutableMapping[str, str]) -> Optional[str]:
    """Set ``WANDB_MODE=offline`` when wandb would need an account that is not configured; returns
    the notice to print (None when nothing changed)."""
    if "wandb" not in as_list(trainer_logger):
        return None
    mode = environ.get("WANDB_MODE", "").strip().lower()
    if mode in ("offline", "disabled", "dryrun") or has_wandb_credentials(environ):
        return None
    if mode == "online":
        raise SetupError("WANDB_MODE=online but no wandb API key is configured (WANDB_API_KEY or `wandb login`). "
                           "Log in, or unset WANDB_MODE to log offline (`wandb sync` uploads later).")
    environ["WANDB_MODE"] = "offline"
    return ("notice: no wandb API key (WANDB_API_KEY or `wandb login`): logging to wandb offline under ./wandb "
            "(upload later with `wandb sync wandb/offline-run-*`; WANDB_MODE=disabled turns it off).")


def checkpoint_preflight(nnodes: int, default_local_dir: str) -> None:
    """Multi-node runs write FSDP shards from every node into ``default_local_dir``: a relative path
    lands in each node's own working dir, so resume and merge would find only a part of them."""
    if int(nnodes) > 1 and not os.path.isabs(str(default_local_dir)):
        raise ConfigError(
            f"trainer.nnodes={nnodes} needs trainer.default_local_dir to be an absolute path on storage that "
            f"every node shares (e.g. an NFS or Lustre mount); got {default_local_dir!r}, which each node would "
            f"resolve inside its own working directory")


def _nvidia_gpus() -> list[str]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line for line in out.splitlines() if line.startswith("GPU ")]


def _driver_version() -> Optional[str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


def cuda_preflight(gpus: Optional[list[str]] = None, cuda_available: Optional[bool] = None,
                   torch_cuda: Optional[str] = None, driver: Optional[str] = None) -> None:
    """Raise with the fix when the machine has NVIDIA GPUs that torch cannot use."""
    gpus = _nvidia_gpus() if gpus is None else gpus
    if not gpus:
        return
    if cuda_available is None or torch_cuda is None:
        import torch

        cuda_available = torch.cuda.is_available() if cuda_available is None else cuda_available
        torch_cuda = torch.version.cuda if torch_cuda is None else torch_cuda
    if cuda_available:
        return
    driver = driver or _driver_version() or "unknown"
    if torch_cuda is None:
        raise SetupError(f"nvidia-smi lists {len(gpus)} GPU(s) but the installed torch is a CPU build. "
                           "Install the GPU stack: pip install -e '.[gpu]' (torch 2.11.0 + vLLM 0.24.0).")
    raise SetupError(
        f"nvidia-smi lists {len(gpus)} GPU(s) but torch (CUDA {torch_cuda}) sees none: NVIDIA driver {driver} is "
        f"too old for it. torch {TORCH_CUDA}.x builds (what verl 0.9.1's vLLM extra installs) need driver >= "
        f"{MIN_DRIVER}; update the driver (docs/install.md, 'On a GPU machine').")


def compiler_preflight(environ: Mapping[str, str] = os.environ, which=shutil.which,
                       python_include: Optional[str] = None) -> None:
    """Raise with the fix when Triton could not build its launcher: it compiles C with ``$CC`` (else gcc,
    else clang from PATH) against the Python headers, in every GPU worker, minutes after Ray starts."""
    cc = environ.get("CC")
    found = (which(cc.split()[0]) if cc else None) or which("gcc") or which("clang")
    if not found:
        raise SetupError(
            "no C compiler: Triton (verl's torch.compile of the entropy, vLLM's compiled graphs) compiles a C launcher "
            "at run time and would fail in the workers with 'Failed to find C compiler'. Install one: conda env "
            "create -f environment.yml (conda-forge gcc_linux-64, sets CC), or apt-get install gcc; "
            "or set CC=<compiler>.")
    include = python_include if python_include is not None else sysconfig.get_paths()["include"]
    if not os.path.isfile(os.path.join(include, "Python.h")):
        raise SetupError(
            f"no Python headers ({include}/Python.h is missing): Triton compiles its launcher against them. Install "
            f"them (Debian/Ubuntu: apt-get install python3-dev, or the python3.X-dev of this Python; conda's Python "
            f"has them).")


def run_all(config, environ: MutableMapping[str, str] = os.environ, cpu: bool = False) -> list[str]:
    """The environment checks for a training config (``train.trainer.config_checks.check_config`` runs the config
    checks, :func:`checkpoint_preflight` among them); returns the notices printed."""
    from train.trainer.corpus_check import training_check

    notices = []
    notice = wandb_preflight(config.trainer.get("logger"), environ)
    if notice:
        notices.append(notice)
    training_check(config, log=notices.append)  # search_r1.expect_corpus against the retriever's /health
    if not cpu:
        cuda_preflight()
        compiler_preflight(environ)
    for n in notices:
        print(n, flush=True)
    return notices


def check_data_file(path: str, key: str, log=print) -> int:
    """One train or validation file, before Ray starts: it exists, is parquet with the columns the
    trainer reads, and every row's gold answers pass :func:`train.search_r1.reward.check_golds` (a blank gold
    would make an empty answer score 1.0; no gold crashes the reward mid-run). Raises ConfigError or
    DataError naming the file and row; returns the number of rows."""
    import pyarrow.parquet as pq

    from train.search_r1.reward import empty_once_normalised, gold_answers

    if "://" in path:  # hdfs:// and the like: verl copies them to local disk itself
        return 0
    if not os.path.isfile(path):
        raise ConfigError(f"{key}: {path} does not exist (make the parquet files with `python -m train.data_prep`)")
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001  (pyarrow raises several kinds for a file that is not parquet)
        raise ConfigError(f"{key}: {path} is not a parquet file ({type(e).__name__}: {e}); make it with "
                         f"`python -m train.data_prep`") from None
    names = pf.schema_arrow.names
    missing = [c for c in ("prompt", "reward_model") if c not in names]
    if missing:
        raise ConfigError(f"{key}: {path} lacks the columns {missing} (has {names}); make it with "
                         f"`python -m train.data_prep`")
    cols = ["reward_model"] + (["extra_info"] if "extra_info" in names else [])
    table = pf.read(columns=cols)
    infos = table.column("extra_info").to_pylist() if "extra_info" in cols else [None] * table.num_rows
    odd = []
    for i, (rm, info) in enumerate(zip(table.column("reward_model").to_pylist(), infos)):
        uid = (info or {}).get("uid") if isinstance(info, dict) else None
        where = f"{key}: {path} row {i}" + (f" (uid {uid!r})" if uid is not None else "")
        if not isinstance(rm, dict) or rm.get("ground_truth") is None:
            raise ConfigError(f"{where}: reward_model has no ground_truth ({rm!r})")
        try:
            golds = gold_answers(rm["ground_truth"], where)
        except ValueError as e:  # the reward's rule, named with the file and row
            raise DataError(str(e)) from None
        if empty_once_normalised(golds):
            odd.append((i, golds))
    if odd:
        i, golds = odd[0]
        log(f"notice: {key}: {path}: {len(odd)} rows have a gold answer that is empty once normalised (e.g. row {i}: "
            f"{golds}); an empty answer matches them, as in Search-R1's EM")
    return table.num_rows


def _limit(rows: int, max_samples) -> int:
    return min(rows, int(max_samples)) if max_samples is not None and int(max_samples) > 0 else rows


def check_batches(config, train_rows: int) -> None:
    """A train file smaller than one batch: verl drops the incomplete batch and only says "Train
    dataloader is empty!" after Ray starts. (Validation batches need no check: verl pads each to a
    multiple of the agent workers; the training batch's split over them is checked by
    ``train.trainer.batch_geometry.check_split``.)"""
    data = config.data
    train = _limit(train_rows, data.get("train_max_samples"))
    if train and train < int(data.train_batch_size):
        raise ConfigError(f"data.train_files hold {train} rows, fewer than one batch (data.train_batch_size="
                         f"{data.train_batch_size}): verl drops the incomplete batch and stops with 'Train dataloader "
                         f"is empty!'. Use more training rows or a smaller data.train_batch_size")


def data_preflight(config, log=print) -> None:
    """The train and validation files of a training config (see :func:`check_data_file`) and their
    batches (:func:`check_batches`)."""
    rows = {}
    for key in ("train_files", "val_files"):
        rows[key] = sum(check_data_file(path, f"data.{key}", log=log) for path in as_list(config.data.get(key)))
    check_batches(config, rows["train_files"])


def model_preflight(config) -> None:
    """A model name of ``python -m train.get_model --list`` becomes its converted folder in the config
    (every worker reads that folder); a model path that looks local must exist (else transformers asks
    the hub for it, minutes later in every worker, and fails there)."""
    from omegaconf import open_dict
    from verl.trainer.ppo.utils import need_critic

    from train.inference.backends import looks_local
    from train.models import registry as models

    with open_dict(config):
        model = config.actor_rollout_ref.model
        model.path = models.resolve(model.get("path"), "actor_rollout_ref.model.path")
        critic = config.get("critic") or {}
        if (critic.get("model") or {}).get("path") is not None:  # its own path (or an interpolation of the actor's)
            critic.model.path = models.resolve(critic.model.path, "critic.model.path")
    paths = [("actor_rollout_ref.model.path", config.actor_rollout_ref.model.get("path"))]
    if need_critic(config):
        paths.append(("critic.model.path", ((config.critic.get("model") or {}).get("path"))))
    for key, path in paths:
        if path and looks_local(str(path)) and not os.path.isdir(os.path.expanduser(str(path))):
            raise ConfigError(f"{key}={path} does not exist (a local model folder, or a hub id such as "
                             f"Qwen/Qwen2.5-3B-Instruct)")


def strategy_preflight(config, cpu: bool) -> None:
    """FSDP1 needs an accelerator: on CPU it fails in the workers ("module has CPU parameters ...
    sync_module_states"); FSDP2 runs there."""
    if not cpu:
        return
    for key, strategy in (("actor_rollout_ref.actor.strategy", config.actor_rollout_ref.actor.get("strategy")),
                          ("actor_rollout_ref.ref.strategy", config.actor_rollout_ref.ref.get("strategy")),
                          ("critic.strategy", (config.get("critic") or {}).get("strategy"))):
        if strategy == "fsdp":
            raise ConfigError(f"{key}=fsdp (FSDP1) cannot run on CPU (VERL_PLATFORM=cpu): it needs an accelerator "
                             f"device id. Use fsdp2, as REHEARSAL=cpu (configs/rehearsal/cpu.yaml) does")


def ray_resources_preflight(config, resources: Optional[dict] = None, nodes: Optional[list] = None) -> None:
    """After Ray starts, before any worker: the ranks asked for must exist in the cluster (otherwise the
    trainer waits forever for its placement groups while Ray's autoscaler logs "No available node
    types can fulfill resource request")."""
    import ray
    from verl.single_controller.ray.base import ResourcePoolManager

    per_node, nnodes = int(config.trainer.n_gpus_per_node), int(config.trainer.nnodes)
    resources = ray.cluster_resources() if resources is None else resources
    nodes = [n for n in ray.nodes() if n.get("Alive")] if nodes is None else nodes
    have = int(resources.get("GPU", 0))
    fitting = sum(1 for n in nodes if int(n.get("Resources", {}).get("GPU", 0)) >= per_node)
    # verl's placement bundle per GPU also holds max_colocate_count CPUs (3: one per colocated worker group)
    cpus = int(ResourcePoolManager.__dataclass_fields__["max_colocate_count"].default) * per_node
    with_cpus = sum(1 for n in nodes if int(n.get("Resources", {}).get("GPU", 0)) >= per_node
                    and int(n.get("Resources", {}).get("CPU", 0)) >= cpus)
    if fitting >= nnodes and with_cpus < nnodes:
        sizes = sorted((int(n.get("Resources", {}).get("CPU", 0)) for n in nodes), reverse=True)
        raise ConfigError(
            f"trainer.n_gpus_per_node={per_node} needs {cpus} CPUs on each of {nnodes} nodes (verl reserves "
            f"{cpus // per_node} per GPU), but the nodes with the GPUs have fewer "
            f"(CPUs per node: {sizes}): the trainer "
            f"would wait forever. Start the nodes with more CPUs (ray start --num-cpus)")
    if have < per_node * nnodes or fitting < nnodes:
        sizes = sorted((int(n.get("Resources", {}).get("GPU", 0)) for n in nodes), reverse=True)
        raise ConfigError(
            f"trainer.n_gpus_per_node={per_node} x trainer.nnodes={nnodes} = {per_node * nnodes} GPUs asked for, but "
            f"the Ray cluster has {have} (GPUs per node: {sizes}): the trainer would wait forever for them. Set "
            f"N_GPUS / trainer.n_gpus_per_node to what each node has, NNODES / trainer.nnodes to the nodes that have "
            f"them (GPUs visible to Ray: CUDA_VISIBLE_DEVICES, `ray status`)")
