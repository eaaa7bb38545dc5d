"""One run's training: `fit.fit(settings)` and the epoch loop it drives (`train.train` adds the report and the export).

fit.py             fit(settings) -> Result: the parts in a fixed order, the manifest's ending
loop.py            the epoch loop: state, compiled steps, metrics, best weights, stop, NaN, OOM
steps.py           the compiled train and validation steps, through a tf.distribute strategy
schedules.py       LR_SCHEDULE=cosine over the share of training done
stop_flag.py       SIGTERM/SIGINT and MAX_MINUTES -> stop between two calls of steps
early_stopping.py  PATIENCE / MIN_DELTA, counted in the run's own state
flops.py           a step's arithmetic and the device's peak: MFU
test_split.py      the test split, once, at the end: the best and the final weights
callbacks.py       the run's moments, told to the report, the export, the extras and a caller's own
"""
