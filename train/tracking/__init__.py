"""MLflow tracking, an optional part: imported only when MLFLOW_TRACKING_URI is set.

mlflow_run.py  a run's settings, per-epoch metrics, tags and files in an MLflow run
"""
