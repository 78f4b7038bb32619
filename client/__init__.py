"""Spar's client: the ``spar`` command a team and its CI use against a Spar API
(``spar scenarios push``, ``spar batch run``, ``spar calibrate``, ``spar demo``), and the
root of ``spar`` itself (:mod:`client.cli`), which finds the server's commands with their
processes.  It installs light: nothing here imports Litestar, SQLAlchemy, Dramatiq or
psycopg (``tests/unit/test_client_package.py``)."""
