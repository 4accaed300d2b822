"""The code base passes ruff (configured in pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO as _REPO

REPO = _REPO


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.fail("ruff is not installed: install the dev extra (pip install -e '.[dev]')")
    proc = subprocess.run([ruff, "check", str(REPO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
