"""`python -m train reproduce RUN`: rerun a run from its own record and say whether it matches.

rerun.py     the command: check the record, rerun, compare, the verdict
record.py    the record it reads (manifest.json, config.json, metrics.csv), checked in full first
worktree.py  the temporary git worktree and the training child, cleaned up on every path
image.py     the container side: the run's image, reused or built from its commit
"""
