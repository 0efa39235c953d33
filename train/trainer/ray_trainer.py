"""verl's ``RayPPOTrainer`` with what a Search-R1 run adds to a step: the agent statistics
(:mod:`train.search_r1.metrics`), the LLDS metrics and the collapse warning (:mod:`train.monitor.detectors`,
its probe :mod:`train.trainer.probe`),
complete checkpoints (a manifest and the tracker after verl's save, retention, free space checked
first) and the stop after a saved step on SIGTERM (:mod:`train.trainer.sigterm`)."""

from __future__ import annotations

import os
import time

from omegaconf import OmegaConf
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from train.search_r1.metrics import behaviour_metrics, search_metrics
from train.trainer.sigterm import COLLAPSE_FLAG, StopAfterSave, stop_requested

#: 1 on a step whose actor update ``flat_steps.skip_update`` skipped, else 0
UPDATE_SKIPPED = "actor/update_skipped"


def no_learning_signal(batch) -> bool:
    """Whether every response token of ``batch`` (a DataProto) has advantage 0: with GRPO, every group's rewards
    are all equal (each question's samples all right or all wrong), so the policy gradient is 0 everywhere."""
    adv, mask = batch.batch["advantages"], batch.batch["response_mask"]
    return not bool(((adv.abs() > 0) & (mask > 0)).any())


class CollapseStop(Exception):
    def __init__(self, decision, step):
        super().__init__(step)
        self.decision, self.step = decision, step


class SearchR1Trainer(RayPPOTrainer):
    """verl's trainer; adds the agent statistics and the collapse warning to each step's metrics."""

    def _update_actor_with_metrics(self, batch):
        from train.llds.loss import finish_llds_metrics

        skip = bool((self.config.get("flat_steps") or {}).get("skip_update", False)) and no_learning_signal(batch)
        if skip:  # nothing to learn: no optimizer step (the KL and entropy terms and Adam's momentum would move it)
            from verl import DataProto

            print(f"step {self.global_steps}: every advantage is 0 (in each group all rewards are equal): the "
                  "actor's update is skipped (flat_steps.skip_update)", flush=True)
            out = DataProto.from_single_dict(data={}, meta_info={"metrics": {}})
        else:
            out = super()._update_actor(batch)
        metrics = out.meta_info.setdefault("metrics", {})
        metrics[UPDATE_SKIPPED] = [float(skip)]
        finish_llds_metrics(metrics)
        metrics.update(search_metrics(batch))
        metrics.update(behaviour_metrics(batch))
        metrics.update({k: [v] for k, v in self._probe_displacement(batch).items()})
        metrics.update({k: [v] for k, v in self._collapse_warning(metrics).items()})
        return out

    def _warning_config(self):
        from train.monitor.detectors import WarningConfig

        if not hasattr(self, "_warning_cfg"):
            self._warning_cfg = WarningConfig.from_dict(
                OmegaConf.to_container(self.config.get("collapse_warning") or {}, resolve=True))
        return self._warning_cfg

    def _collapse_warning(self, metrics) -> dict[str, float]:
        """The step's warning level and signal scores (:mod:`train.monitor.detectors`); a WATCH or ALARM
        prints why, and with ``collapse_warning.action`` stop or rollback an ALARM saves the step and stops
        the run (a rollback then resumes from before the warning began: :mod:`train.trainer.rollback`)."""
        from train.monitor import detectors

        cfg = self._warning_config()
        if not cfg.enable:
            return {}
        if not hasattr(self, "_warning"):
            self._warning = detectors.CollapseWarning(cfg.thresholds, signals=detectors.SIGNALS)
        decision = self._warning.update(self.global_steps, detectors.step_record(metrics))
        if decision.level < detectors.Level.WATCH:
            self._warning_began = None
        elif getattr(self, "_warning_began", None) is None:  # the first step of this warning
            self._warning_began = self.global_steps
        if decision.level >= detectors.Level.WATCH:
            print(f"collapse warning: {decision.describe()} (thresholds: collapse_warning.levels; "
                  f"docs/training.md#collapse-warning)", flush=True)
        if decision.level >= detectors.Level.ALARM and cfg.action != "warn" and not hasattr(self, "_alarm_stop"):
            self._alarm_stop = decision
            self._alarm_began = self._warning_began
        return {detectors.LEVEL_KEY: float(decision.level),
                **{detectors.SIGNAL_PREFIX + k: v for k, v in self._warning.last_scores.items()},
                **{detectors.SIGNAL_LEVEL_PREFIX + k: float(v) for k, v in self._warning.last_levels.items()}}

    def _probe_displacement(self, batch) -> dict[str, float]:
        """The fixed probe's likelihood after this step's update (:mod:`train.trainer.probe`)."""
        from train.trainer import probe

        saved = os.path.join(self.config.trainer.default_local_dir, probe.FILE)
        if not hasattr(self, "_probe"):
            self._probe = probe.DisplacementProbe(self._warning_config().probe_rows, self.actor_rollout_wg.world_size)
            if self._probe.restore(saved, resumed_at=self.global_steps - 1):  # this step is being trained
                print(f"collapse warning: the probe's {self._probe.held} trajectories restored from {saved}"
                      + ("" if self._probe.reference else "; their reference is scored again (it was taken after "
                         f"step {self.global_steps - 1}, where this run resumes)"), flush=True)
        self._probe.collect(batch)
        if not self._probe.full:
            return probe.empty()
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

        start = time.perf_counter()
        td = left_right_2_no_padding(self._probe.batch().to_tensordict())  # as verl's log-prob passes do
        tu.assign_non_tensor(td, calculate_entropy=False, compute_loss=False)
        output = self.actor_rollout_wg.compute_log_prob(td)
        fresh = not self._probe.reference
        scores = self._probe.score(no_padding_2_padding(tu.get(output, "log_probs"), td), step=self.global_steps)
        if fresh:  # its first scoring: kept for a resume or a rollback
            self._probe.save(saved)
        return {**scores, "timing_s/probe": time.perf_counter() - start}

    def _update_actor(self, batch):
        out = self._update_actor_with_metrics(batch)
        if hasattr(self, "_alarm_stop") and getattr(self, "_saved_step", None) != self.global_steps:
            print(f"collapse warning: stopping (collapse_warning.action={self._warning_config().action}): "
                  f"{self._alarm_stop.describe()}; "
                  f"saving step {self.global_steps} first", flush=True)
            self._save_checkpoint()
        elif stop_requested(self.config.trainer.default_local_dir):  # SIGTERM with trainer.save_on_sigterm
            print(f"SIGTERM: step {self.global_steps} is trained; saving its checkpoint, then stopping after "
                  f"the step (trainer.save_on_sigterm)", flush=True)
            self._save_checkpoint()
        return out

    def _start_profiling(self, do_profile: bool) -> None:
        """Called by verl's loop at the start of every step, before its rollout: where a run asked to
        stop (SIGTERM with trainer.save_on_sigterm) ends, after the step before was saved and logged."""
        if stop_requested(self.config.trainer.default_local_dir):
            raise StopAfterSave(getattr(self, "_saved_step", None))
        if hasattr(self, "_alarm_stop"):
            raise CollapseStop(self._alarm_stop, getattr(self, "_saved_step", None))
        return super()._start_profiling(do_profile)

    def fit(self):
        from train.trainer import metrics_file

        try:
            with metrics_file.appending():  # verl's file logger would truncate the run's metrics
                out = super().fit()
            if hasattr(self, "_alarm_stop"):  # the ALARM came on the last step: verl's loop ended before the
                # next step's start, where a stop is raised; the step is saved, and the run stops as on any other
                raise CollapseStop(self._alarm_stop, getattr(self, "_saved_step", None))
            return out
        except CollapseStop as stop:  # the driver rolls back, or exits 5 with this text (train.trainer.launch)
            from train.files import atomic_write
            from train.trainer.rollback import Stop

            began = getattr(self, "_alarm_began", None)
            text = (f"the collapse warning stopped the run at step {stop.decision.step} (collapse_warning.action="
                    f"{self._warning_config().action}): {stop.decision.describe()}; that step is saved as "
                    f"global_step_{stop.step}, the checkpoints before step {began} predate the warning "
                    f"(docs/training.md#collapse-warning)")
            print(f"collapse warning: {text}", flush=True)
            atomic_write(os.path.join(self.config.trainer.default_local_dir, COLLAPSE_FLAG),
                         Stop(text, stop.decision.step, began).to_json())
            if hasattr(self, "_shutdown_dump_executor"):
                self._shutdown_dump_executor()
        except StopAfterSave as stop:
            print(f"stopped (SIGTERM) after saving global_step_{stop.step}" if stop.step else
                  "stopped (SIGTERM) before the first step", flush=True)
            if hasattr(self, "_shutdown_dump_executor"):
                self._shutdown_dump_executor()

    def _save_checkpoint(self):
        """verl's save, then a manifest of the files (synced to disk) and the tracker written
        atomically, so that a resume only ever lands on a complete checkpoint; free space is checked
        first, and a failed save names the folder (and the free space when the disk is full)."""
        from train.trainer import checkpoint_store

        root, step = self.config.trainer.default_local_dir, self.global_steps
        if getattr(self, "_saved_step", None) == step:  # saved on SIGTERM already; verl's own save of the step
            return
        previous = [s for s in checkpoint_store.saved_steps(root) if s < step]
        checkpoint_store.check_free_space(root, step, previous[-1] if previous else None)
        try:
            super()._save_checkpoint()
        except Exception as e:
            raise checkpoint_store.CheckpointError(checkpoint_store.describe_save_failure(root, step, e)) from e
        ckpt = self.config.actor_rollout_ref.actor.get("checkpoint") or {}
        if not ckpt.get("async_save", False):  # async shards are still being written: verl skips the tracker too
            checkpoint_store.write_manifest(checkpoint_store.step_dir(root, step))
            checkpoint_store.write_tracker(root, step)
        self._saved_step = step
        keep_last, keep_steps = checkpoint_store.check_config(
            OmegaConf.to_container(self.config.get("checkpoints") or {}, resolve=True))
        if self._warning_config().action == "rollback":  # while a warning is open: the step a rollback needs
            from train.trainer.rollback import keep_for_rollback

            keep_steps = [*keep_steps, *keep_for_rollback(root, getattr(self, "_warning_began", None))]
        removed = checkpoint_store.prune(root, keep_last, keep_steps)
        if removed:
            print(f"checkpoints: removed global_step_{removed} (checkpoints.keep_last={keep_last}, "
                  f"keep_steps={keep_steps})", flush=True)

    def _load_checkpoint(self):
        from train.trainer import checkpoint_store

        try:
            return super()._load_checkpoint()
        except Exception as e:
            root = self.config.trainer.default_local_dir
            step, why = checkpoint_store.read_tracker(root)
            where = checkpoint_store.step_dir(root, step) if step is not None else f"{root} ({why})"
            raise checkpoint_store.CheckpointError(
                f"loading the checkpoint {where} failed: {type(e).__name__}: {str(e)[-2000:]}. Move that folder "
                f"aside to resume from the one before (trainer.resume_mode=auto picks the newest complete one)"
            ) from e
