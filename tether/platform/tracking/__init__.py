"""MLflow tracking of a run: the tracker, its spool and what a long run keeps."""
