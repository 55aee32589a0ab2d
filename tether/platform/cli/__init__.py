"""The ``tether`` command line."""
