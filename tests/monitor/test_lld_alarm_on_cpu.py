"""The collapse alarm the trainer ran before the collapse warning (train/monitor/lld_alarm.py, kept as a
baseline that ``python -m train.collapse replay`` scores) on synthetic metric series."""

import math
import random

import pytest

from train.monitor.lld_alarm import ALARM_KEY, FALLING_KEY, AlarmConfig, CollapseMonitor

SIGNAL = "actor/llds/logp_pos"


def run(series: list[dict], **cfg) -> tuple[list[float], list[str], CollapseMonitor]:
    monitor = CollapseMonitor(AlarmConfig.from_dict(cfg))
    alarms, messages = [], []
    for step, metrics in enumerate(series, 1):
        out, msgs = monitor.update(step, metrics)
        alarms.append(out.get(ALARM_KEY))
        messages += msgs
    return alarms, messages, monitor


def healthy(steps=40, seed=0):
    """Learning that goes well: the likelihood of good tokens rises (noisily), stats stay level."""
    rng = random.Random(seed)
    return [{SIGNAL: -1.5 + 1.2 * (1 - math.exp(-s / 10)) + rng.gauss(0, 0.05),
             "actor/grad_norm": 1.0 + rng.uniform(-0.3, 0.3), "actor/ppo_kl": 0.002 * (1 + rng.uniform(-0.5, 0.5))}
            for s in range(steps)]


def collapsing(steps=40, start=20, seed=0):
    """GRPO's death spiral: after `start`, the likelihood of positive-advantage tokens sinks
    while updates continue, then the gradient norm explodes."""
    out = healthy(steps, seed)
    for s in range(start, steps):
        out[s][SIGNAL] = out[start - 1][SIGNAL] - 0.08 * (s - start + 1)
        if s >= start + 8:
            out[s]["actor/grad_norm"] = 30.0 * (s - start - 7)
    return out


def test_quiet_on_a_healthy_run():
    for seed in range(20):
        alarms, messages, _ = run(healthy(seed=seed))
        assert alarms == [0.0] * 40, (seed, messages)


def test_fires_on_a_collapse_naming_signal_and_step():
    alarms, messages, monitor = run(collapsing())
    first = alarms.index(1.0) + 1
    # the signal starts falling at step 21 (1-based): the 4th consecutive fall is step 24
    assert first == 24
    assert f"at step {first}" in messages[0] and SIGNAL in messages[0] and "fell 4 steps in a row" in messages[0]
    assert all(a == 1.0 for a in alarms[first - 1:])  # it keeps warning while the fall goes on
    spikes = [m for m in messages if "actor/grad_norm" in m]
    assert spikes and "spiked" in spikes[0] and "at step 29" in spikes[0]
    assert monitor.alarms[0][0] == 24


def test_a_spike_alone_fires_and_then_becomes_the_baseline():
    series = [{"actor/grad_norm": 1.0, "actor/ppo_kl": 0.001} for _ in range(10)]
    series[7]["actor/ppo_kl"] = 0.05  # 50x the median of the previous 5 steps
    alarms, messages, _ = run(series)
    assert alarms == [0.0] * 7 + [1.0] + [0.0] * 2
    assert "actor/ppo_kl" in messages[0] and "at step 8" in messages[0]


def test_falling_counter_metric_and_min_drop():
    series = [{SIGNAL: -1.0 - 0.005 * s} for s in range(10)]  # a slow drift below min_drop
    alarms, _, monitor = run(series)
    assert alarms == [0.0] * 10 and monitor.falling == 0
    out, _ = CollapseMonitor(AlarmConfig(min_drop=0.001)).update(1, {SIGNAL: -1.0})
    assert out == {ALARM_KEY: 0.0, FALLING_KEY: 0.0}
    alarms, _, monitor = run(series, min_drop=0.001, falling_steps=3)
    assert alarms[:3] == [0.0] * 3 and alarms[3:] == [1.0] * 7 and monitor.falling == 9


def test_per_minibatch_lists_and_missing_keys():
    monitor = CollapseMonitor(AlarmConfig(falling_steps=2))
    assert monitor.update(1, {})[0][ALARM_KEY] == 0.0  # no signal logged yet: quiet
    for step, v in enumerate(([-1.0, -1.2], [-1.3, -1.5], [-1.6, -1.8]), 2):
        out, msgs = monitor.update(step, {SIGNAL: v})
    assert out[ALARM_KEY] == 1.0 and "-1.100 -> -1.400 -> -1.700" in msgs[0]


def test_disabled_logs_nothing():
    alarms, messages, _ = run(collapsing(), enable=False)
    assert alarms == [None] * 40 and messages == []


@pytest.mark.parametrize("bad, match", [
    ({"falling_step": 3}, "unknown keys"),
    ({"falling_steps": 0}, "falling_steps"),
    ({"spike_factor": 1.0}, "spike_factor"),
    ({"min_drop": -1}, "min_drop"),
    ({"spike_keys": "actor/grad_norm"}, "spike_keys"),
    ({"spike_window": 0}, "spike_window"),
])
def test_bad_config_names_the_key(bad, match):
    with pytest.raises(ValueError, match=match):
        AlarmConfig.from_dict(bad)


def test_steps_without_positive_tokens_are_skipped_not_read_as_zero():
    """A step where every reward is 0 has no positive-advantage tokens: its logp_pos is NaN, which
    must neither reset nor extend the falling run (0.0 would read as a sudden rise)."""
    nan = float("nan")
    series = [{SIGNAL: v} for v in (-0.5, -0.6, nan, -0.7, nan, -0.8, -0.9)]
    alarms, messages, monitor = run(series)
    assert alarms == [0.0] * 6 + [1.0] and monitor.falling == 4
    assert monitor.history[SIGNAL] == [-0.5, -0.6, -0.7, -0.8, -0.9]
