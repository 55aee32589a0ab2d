"""Cross-run analyses of SPEC §9 (pure functions of run histories) and the report.

``runs`` (the data), ``stats`` (the numbers), ``views`` + ``render`` (the figures),
``report`` (files and HTML); ``source`` is the only module that reads MLflow.
"""
