"""The ``hfai`` command (``hfai.cli.main``) and its commands' modules.

Importing this package has no side effects: how the process's own command saves time (the
collector paused while its module loads, the quick exit of a query) is decided in
:mod:`hfai.cli.main`, where the command runs.
"""
