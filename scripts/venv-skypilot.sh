#!/usr/bin/env bash
# Create or refresh .venv-skypilot: SkyPilot (requirements/skypilot.lock, hashes required) in an
# environment of its own, for the test that reads deploy/skypilot/train.yaml with SkyPilot's parser.
# Kept apart from .venv: SkyPilot pins its own FastAPI, SQLAlchemy, pydantic ... and none of that may
# enter the training environment or the image. Idempotent (scripts/venv-from-lock.sh).
exec "$(dirname "$0")/venv-from-lock.sh" requirements/skypilot.lock .venv-skypilot
