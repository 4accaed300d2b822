"""Rewrites of run files are atomic: a kill at any moment of a rewrite leaves the old file or the new one, never a
truncated one. A process is killed in the middle of each real rewrite (SIGXFSZ from a file-size limit: the kernel
kills it inside a write, as kill -9 would); and no module of mmgpg writes a file in place outside the one atomic
writer (mmgpg.jsonl.atomic_writer)."""

from __future__ import annotations

import ast
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

from mmgpg.rundir import ProbeRecord, read_records, replace_probe

LIMIT = 16384  # bytes any file of the killed process may reach; every old file below is larger, every new one too


def _killed_mid_write(code: str) -> subprocess.CompletedProcess:
    script = ("import resource, signal\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it by default\n"
              f"resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, {LIMIT}))\n" + code)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGXFSZ, proc.stderr[-3000:]  # really killed in the middle of a write
    return proc


PROBES = """
from mmgpg.rundir import ProbeRecord
def probes(step, n):
    return [ProbeRecord(step=step, prompt_id=f"prompt-{i:05d}", split="train", samples=64, successes=i % 65,
                        temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=256, checkpoint="runs/x/step-1/policy")
            for i in range(n)]
"""
exec(PROBES)  # defines probes(step, n), here and (the same text) in the killed process


def test_a_kill_during_the_probe_rewrite_leaves_the_old_file(tmp_path):
    path = tmp_path / "probe_success.jsonl"
    replace_probe(path, probes(0, 600))  # noqa: F821 - the step-0 probe (p_ref) of 600 prompts
    original = path.read_bytes()
    assert len(original) > LIMIT
    _killed_mid_write(PROBES + f"from mmgpg.rundir import replace_probe\nreplace_probe({str(path)!r}, probes(10, 600))\n")
    assert path.read_bytes() == original, "a kill mid-rewrite damaged probe_success.jsonl"
    # The next rewrite completes and removes the killed one's temporary file.
    replace_probe(path, probes(10, 3))  # noqa: F821
    assert len(read_records(path, ProbeRecord)) == 603
    assert sorted(p.name for p in tmp_path.iterdir()) == ["probe_success.jsonl"]


@pytest.mark.parametrize("killed_in", ["predictions.jsonl", "metrics.json"])
def test_a_kill_during_an_evaluation_rewrite_leaves_whole_files(tmp_path, killed_in):
    from mmgpg.evaluation.predictions import write_evaluation

    big = [{"id": f"q{i}", "model_output": "x" * 100, "correct": 1} for i in range(300)]
    write_evaluation(tmp_path, {"accuracy": 1.0}, big, {"task": "t", "notes": "y" * 2 * LIMIT})
    old = {name: (tmp_path / name).read_bytes() for name in ("predictions.jsonl", "metrics.json")}
    # predictions.jsonl is written first: a large new one is killed there, a small one is written and the kill comes
    # in the (large) metrics.json.
    records, notes = (big, "") if killed_in == "predictions.jsonl" else ([], "z" * 2 * LIMIT)
    _killed_mid_write("from mmgpg.evaluation.predictions import write_evaluation\n"
                      f"write_evaluation({str(tmp_path)!r}, {{'accuracy': 0.5}}, {records!r}, {{'notes': {notes!r}}})\n")
    assert (tmp_path / killed_in).read_bytes() == old[killed_in], f"a kill mid-rewrite damaged {killed_in}"
    json.loads((tmp_path / "metrics.json").read_text())  # whole: the old one or the new one
    assert [json.loads(x) for x in (tmp_path / "predictions.jsonl").read_text().splitlines()] in (big, [])


# Calls that write a file in place, outside the modules allowed to (with why).
ALLOWED = {
    "mmgpg/jsonl.py": "the one atomic writer",
    "mmgpg/train/checkpoint.py": "writes inside .tmp-step-*/, renamed into place when complete",
    "mmgpg/utils.py": "PeakMemory writes '5' to /proc/self/clear_refs (a kernel control file, not a run file)",
}


def _direct_writes(path: Path, root: Path = REPO) -> list[str]:
    """``open(..., "w"/"x"/"+")`` and ``.write_text``, ``.write_bytes``, ``.savefig``, ``torch.save``, ``json.dump``
    calls: writes that truncate or overwrite a file in place (appends do not and are allowed)."""
    tree = ast.parse(path.read_text())
    atomic = {item.optional_vars.id for node in ast.walk(tree) if isinstance(node, ast.With) for item in node.items
              if "atomic_writer" in ast.unparse(item.context_expr) and isinstance(item.optional_vars, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in atomic:
            continue  # into the atomic writer's file (fig.savefig(f, ...), json.dump(x, f) below take it second)
        if len(node.args) > 1 and isinstance(node.args[1], ast.Name) and node.args[1].id in atomic:
            continue
        func = ast.unparse(node.func)
        name = func.rpartition(".")[2]
        if name in ("open", "fdopen"):
            modes = node.args[1:2] + [k.value for k in node.keywords if k.arg == "mode"]
            mode = modes[0].value if modes and isinstance(modes[0], ast.Constant) else "r"
            if any(c in mode for c in "wx+"):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {func}(..., {mode!r})")
        elif name in ("write_text", "write_bytes", "savefig") or func in ("torch.save", "json.dump"):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {func}(...)")
    return found


def test_no_file_is_rewritten_in_place_outside_the_atomic_writer():
    offenders = []
    for path in sorted((REPO / "mmgpg").rglob("*.py")):
        if str(path.relative_to(REPO)) not in ALLOWED:
            offenders += _direct_writes(path)
    assert not offenders, ("files written in place (a kill mid-write truncates them); use mmgpg.jsonl's "
                           "atomic_writer, write_text_atomic or write_jsonl_atomic:\n  " + "\n  ".join(offenders))


@pytest.mark.parametrize(("source", "writes"), [
    ('open(p, "w")', 1), ('open(p, mode="wb")', 1), ('os.fdopen(fd, "r+")', 1), ('p.write_text("x")', 1),
    ("p.write_bytes(b)", 1), ("fig.savefig(p)", 1), ("torch.save(x, p)", 1), ("json.dump(x, f)", 1),
    ('open(p, "a")', 0), ("open(p)", 0), ('open(p, "rb")', 0), ("model.save(p)", 0),
    ('with atomic_writer(p, "wb") as out:\n        fig.savefig(out, format="png")', 0),
    ("with atomic_writer(p) as out:\n        json.dump(x, out)", 0),
    ("with atomic_writer(p) as out:\n        fig.savefig(p)", 1)])
def test_the_scan_sees_each_kind_of_in_place_write(tmp_path, source, writes):
    probe = tmp_path / "module.py"
    probe.write_text(f"def f(p, x, fig, fd, f, b, model):\n    {source}\n")
    assert len(_direct_writes(probe, tmp_path)) == writes


def test_two_probe_writers_at_once_keep_each_others_records(tmp_path):
    """`mmgpg probe RUN` while the run's train.probe_every probes: each read-merge-write of probe_success.jsonl runs
    alone, so no writer's records are lost (without the lock, two processes of 40 rewrites each lost most of them)."""
    path = tmp_path / "probe_success.jsonl"
    writer = (PROBES + "import sys, dataclasses\nfrom mmgpg.rundir import replace_probe\n"
              "split = sys.argv[1]\n"
              "for step in range(40):\n"
              f"    replace_probe({str(path)!r}, [dataclasses.replace(r, split=split) for r in probes(step, 200)])\n")
    procs = [subprocess.Popen([sys.executable, "-c", writer, split], stderr=subprocess.PIPE, text=True)
             for split in ("train", "test")]
    for proc in procs:
        assert proc.wait(timeout=600) == 0, proc.stderr.read()[-3000:]
    records = read_records(path, ProbeRecord)
    assert sorted({(r.split, r.step) for r in records}) == sorted((s, k) for s in ("train", "test") for k in range(40))
    assert len(records) == 2 * 40 * 200
