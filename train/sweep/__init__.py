"""Hyperparameter sweeps on Optuna, `python -m train sweep SPACE.toml`: every trial an ordinary run.

An optional part. Training knows nothing of it: a trial's run gets the study's
loop callback (train.training.callbacks). To drop it from a fork, delete this folder, its tests (tests/sweep/,
tests/servers_pg.py and its line in tests/conftest.py) and its line in
`train/extras.py` (its settings, settings.py, and its command go with the folder).

  command.py   the `sweep` sub-command: its flags, the call into study.py, the closing lines
  space.py     SPACE.toml -> a checked SweepSpec (no Optuna, no TensorFlow)
  storage.py   SQLite in RUNS_DIR/sweeps or a database URL; opening and checking a study
  study.py     the study's loop: ask, run (or resume) one run each, retry, tell
  trials.py    a trial's parameters, sampler and epoch observer (pruning); which trials count
  report.py    RUNS_DIR/sweeps/<study>/report.html
"""
