"""RUNS_DIR in object storage (s3://BUCKET/PREFIX, gs://, az://): runs staged locally and uploaded
beside training, leased so that two machines never write one run, continued from the bucket by a
fresh machine (docs/storage.md).

Optional and deletable: remove this folder and its line in train/extras.py; RUNS_DIR is then a
folder. Its package (obstore) comes from requirements/store.lock (`scripts/venv.sh --extra store`).
The core reaches it only through train.run.remote, which finds `train.store.remote` by name.
"""
