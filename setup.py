"""Only the package list lives here (everything else is in pyproject.toml).

``[tool.setuptools.packages.find]`` finds every sub-package of ``mmgpg/`` but not the two packages that
pyproject.toml maps from other folders (``tasks/`` installs as ``mmgpg_tasks``, ``configs/`` as ``mmgpg.configs``),
and a static ``packages = [...]`` list must be edited for every new folder. So: found folders + the two mapped ones.
"""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["mmgpg", "mmgpg.*"]) + ["mmgpg_tasks", "mmgpg.configs"])
