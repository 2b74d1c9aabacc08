"""The command line, the project's one composition root: the only place (with ``api`` and
``eval``) that imports every layer. ``attnrank`` and ``python -m attnrank`` run :data:`app`."""

from attnrank.cli.app import app, main

__all__ = ["app", "main"]
