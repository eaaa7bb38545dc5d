"""The run directory and everything written into it that a later process reads back.

rundir.py          the layout (RunDir) and its records (config.json, manifest.json)
files.py           atomic writes, JSON and text helpers, the StorageError of an OSError
find.py            run ids, creating a run directory, listing RUNS_DIR, resolving latest or an id
remote.py          where RUNS_DIR's runs are on this machine (itself, or a store's staging copy)
lock.py            run.lock: one writer per run directory
manifest.py        manifest.json: what is needed to trace and reproduce a run
resume.py          which run a fit writes to: new, or one being resumed, checked before writing
checkpoints.py     resumable states: atomic save, verified load with fallback, LATEST
weights.py         best/final weights files with their sha256 recorded, verified before use
metrics_files.py   metrics.csv and TensorBoard scalars
train_log.py       the console and train.log
"""
