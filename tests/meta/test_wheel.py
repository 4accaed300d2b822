"""A wheel built from the repository, installed into a fresh virtual environment, imports mmgpg and finds the
built-in tasks (as `mmgpg_tasks`, never a top-level `tasks`) and the packaged config groups."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv

from support import REPO  # noqa: E402

CHECK = r"""
import importlib.util, json, sys
from importlib.metadata import entry_points
from importlib.resources import files
import mmgpg
from mmgpg.task import TASKS, build_task
from mmgpg.config import resolve
task = build_task("shapes", {"num_train": 2})
example = task.load("train")[0]
# validate_config=False: full validation reads the algorithm registries, which import torch, and this venv has
# deliberately no dependencies beyond the two below (the groups and their files are what is checked here).
cfg = resolve(["task=shapes", "model=qwen2_vl_2b"], validate_config=False).config
print(json.dumps({
    "mmgpg": mmgpg.__file__,
    "tasks_module": importlib.util.find_spec("mmgpg_tasks.shapes").origin,
    "entry_point": TASKS.describe("shapes"),
    "generic_tasks_package": importlib.util.find_spec("tasks") is not None,
    "configs": sorted(p.name for p in (files("mmgpg.configs") / "model").iterdir()),
    "example_answer": example.answer,
    "model": cfg.model.name_or_path,
    "max_new_tokens": cfg.rollout.max_new_tokens,
    "geoqa_test_lines": len((files("mmgpg_tasks") / "data/geoqa/geoqa_test_prompts.jsonl").read_text().splitlines()),
    "pets_classes": len((files("mmgpg_tasks") / "data/fine_grained/pets.classes.txt").read_text().split("\n")),
    "paper_tasks": sorted(n for n in TASKS if n in ("cv_bench", "geoqa", "fine_grained", "lisa_grounding")),
}))
"""


def test_wheel_installs_into_a_fresh_venv(tmp_path):
    # Build from a copy of the sources so no build/ or *.egg-info is written into (or reused from) the checkout.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "runs", "__pycache__", ".*_cache", ".hypothesis"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = dist.glob("mmgpg-*.whl")
    import zipfile

    # every module of the source tree is in the wheel (sub-packages are listed one by one in pyproject.toml)
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    missing = [str(p.relative_to(REPO)) for p in (REPO / "mmgpg").rglob("*.py")
               if "__pycache__" not in p.parts and str(p.relative_to(REPO)) not in in_wheel]
    assert not missing, f"modules missing from the wheel (add their package to pyproject.toml): {missing}"
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # The wheel itself with no dependencies, plus the two the check needs (PIL for the shapes images, PyYAML for
    # configs) — from the local wheel cache / index, so this stays fast and offline-friendly.
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel), "pillow", "pyyaml"], check=True,
                   capture_output=True, timeout=600)
    out = subprocess.run([str(py), "-c", CHECK], check=True, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    import json

    info = json.loads(out.stdout)
    assert info["mmgpg"].startswith(str(env_dir)), info
    assert info["tasks_module"].startswith(str(env_dir)) and info["tasks_module"].endswith("mmgpg_tasks/shapes.py")
    assert info["entry_point"] == "mmgpg_tasks.shapes:ShapesTask"
    assert info["generic_tasks_package"] is False
    assert "qwen2_vl_2b.yaml" in info["configs"] and "tiny.yaml" in info["configs"]
    assert 1 <= info["example_answer"] <= 5
    assert info["model"] == "Qwen/Qwen2-VL-2B-Instruct" and info["max_new_tokens"] == 48
    # the shipped benchmark lists travel in the wheel
    assert info["geoqa_test_lines"] == 754 and info["pets_classes"] == 37
    assert info["paper_tasks"] == ["cv_bench", "fine_grained", "geoqa", "lisa_grounding"]
