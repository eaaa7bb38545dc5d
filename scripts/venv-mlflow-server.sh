#!/usr/bin/env bash
# Create or refresh .venv-mlflow-server: the MLflow tracking server (requirements/mlflow-server.lock,
# hashes required) in an environment of its own, for the tests that train against a real server.
# Kept apart from .venv: the full `mlflow` package pins its own numpy, pandas, SQLAlchemy ... and
# none of that may enter the training environment or the image. Idempotent (scripts/venv-from-lock.sh).
exec "$(dirname "$0")/venv-from-lock.sh" requirements/mlflow-server.lock .venv-mlflow-server
