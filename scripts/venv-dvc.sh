#!/usr/bin/env bash
# Create or refresh .venv-dvc: DVC with its S3 remote (requirements/dvc.lock, hashes required) in an
# environment of its own, for data sets tracked with DVC (docs/data-versions.md): the template runs
# .venv-dvc/bin/dvc when it exists. Kept apart from .venv: DVC pins its own tree (an S3 client,
# Celery, Hydra ...) and none of that may enter the training environment or the image.
# Idempotent (scripts/venv-from-lock.sh).
exec "$(dirname "$0")/venv-from-lock.sh" requirements/dvc.lock .venv-dvc
