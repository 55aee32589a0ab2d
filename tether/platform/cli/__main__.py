"""``python -m tether.platform.cli.main``: the ``tether`` command line."""

from .main import app

app()
