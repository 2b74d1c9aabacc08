"""The command line, the project's one composition root: the only place (with ``api`` and
``eval``) that imports every layer. ``heedrank`` and ``python -m heedrank`` run :data:`app`."""

from heedrank.cli.app import app, main

__all__ = ["app", "main"]
