"""The one piece of metadata pyproject.toml cannot carry: a plain ``License:`` field.

setuptools writes a license given in ``[project]`` as ``License-Expression:`` only (PEP 639), and the pip
that ships with Python 3.10 and 3.11 (23.x) shows the ``License:`` field alone, so ``pip show tierkv``
printed an empty license there. Given here (``dynamic = ["license"]`` in pyproject.toml), the license is
written as ``License:``, which every pip shows.
"""

from setuptools import setup

setup(license="Apache-2.0")
