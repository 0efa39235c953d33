"""The collapse warning, pure Python over per-step records (no torch, no verl):

- ``records``   the keys a run's record keeps, reading a corpus of runs
- ``labels``    ground truth from outcomes only (collapse onset, transient dips)
- ``detectors`` the warning (WATCH / ALARM per signal), today's alarm and single-signal baselines
- ``scoring``   recall, false alarms, precision and lead of a detector over labelled runs
- ``lld_alarm`` the alarm the trainer ran before the warning, kept as a baseline

``python -m train.collapse`` is the command (label, replay); the trainer runs the warning live.
"""
