"""Cross-run analyses of docs/methods.md, section 13 (pure functions of run histories) and
the report.

``runs`` (the data), ``stats`` (the numbers), ``views`` + ``render`` (the figures),
``report`` (files and HTML); ``source`` is the only module that reads MLflow.
"""
