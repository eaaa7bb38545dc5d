"""Data versions through DVC: when the data a run reads is tracked by DVC in a git repository, the
manifest records where (the repository's commit, the tracked path, its hash, the remote), and
`reproduce` fetches that version from the DVC remote when this machine lacks it (docs/data-versions.md).

tracked.py   which DVC entry tracks the data (.dvc files and dvc.lock read as text), the remote, the record
tool.py      the dvc command: found (.venv-dvc, PATH, DVC_COMMAND) and run
callback.py  the record and the one warning at the start of a run
fetch.py     `reproduce`: the recorded version fetched into a folder of its own, refusals in one line

Optional and deletable: remove this folder and its line in train/extras.py; runs then record no data
version and `reproduce` refuses missing data as before. DVC itself is a command in an environment of
its own (requirements/dvc.lock, `scripts/venv-dvc.sh` makes .venv-dvc), never in the training one.
The core reaches it only through train.extras: its settings and callback, and `extras.part("dvc", "fetch")`.
"""
