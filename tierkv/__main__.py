"""``python -m tierkv`` is the ``tierkv`` command."""

from tierkv.cli import run

run()
