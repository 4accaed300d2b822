"""What the tests share: fixture tasks, the fault tests' helpers, the independent gradient reference, the judge
corpora and the authors' judges reimplemented for differential tests, a seam plugin, and small data fixtures
(``fixtures/``). Imported as ``support.<module>`` (pytest puts ``tests/`` on the path: ``pythonpath`` in
pyproject.toml)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root."""
FIXTURE_TASKS = Path(__file__).with_name("fixture_tasks.py")
"""The fixture task file, loaded by the tests as ``task=<FIXTURE_TASKS>:ParityShapes`` (which also exercises the
path/to/file.py:Class loader)."""
FIXTURES = Path(__file__).with_name("fixtures")
"""Small data files (``fixtures/README.md`` says where each comes from)."""

def run_mmgpg(*args: str, check: bool = True, ranks: int = 1, env: dict | None = None, cwd: Path | None = None,
              timeout: float = 900):
    """``python -m mmgpg ARGS`` in a subprocess (under ``torch.distributed.run --standalone --nproc_per_node ranks``
    when ``ranks > 1``), output captured; with ``check``, a non-zero exit fails the test with the command, its
    stdout and stderr. ``env`` (default: this process's) is the child's whole environment."""
    import subprocess
    import sys

    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)] if ranks > 1 else []
    proc = subprocess.run([sys.executable, *launcher, "-m", "mmgpg", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"mmgpg {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_mmgpg_nodes(*args: str, nodes: int = 2, procs_per_node: int = 1, env: dict | None = None,
                    timeout: float = 900) -> list:
    """``python -m mmgpg ARGS`` as ``nodes`` separate torchrun launchers on this machine, each
    ``--nnodes N --nproc_per_node P --node_rank i``, meeting through a c10d rendezvous on a free 127.0.0.1 port: a
    multi-node launch without a second machine. Waits for all; a non-zero exit of any fails the test with every
    launcher's output. Returns the finished processes (stdout/stderr as text)."""
    import subprocess
    import sys
    import tempfile

    from mmgpg.distributed import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    procs, logs = [], []
    for node in range(nodes):
        log = tempfile.TemporaryFile(mode="w+")
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc_per_node",
             str(procs_per_node), "--node_rank", str(node), "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
             "--rdzv_id", "mmgpg-test", "-m", "mmgpg", *args], stdout=log, stderr=subprocess.STDOUT, text=True,
            env=env))
    try:
        for proc in procs:
            proc.wait(timeout=timeout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    if any(p.returncode for p in procs):
        raise AssertionError("\n".join(f"node {i}: exit {p.returncode}\n{out}"
                                       for i, (p, out) in enumerate(zip(procs, outputs))))
    return [subprocess.CompletedProcess(p.args, p.returncode, out, "") for p, out in zip(procs, outputs)]


MEASURED = ("time/", "throughput/", "memory/", "plan/")
"""Metric namespaces that are measurements of this machine and process (wall times, throughput, peak memory) or
written once per process start (``plan/``): they differ between runs that compute the same thing."""


def comparable(metrics: list[dict]) -> list[dict]:
    """``metrics.jsonl`` records without the :data:`MEASURED` keys: what an exact resume must reproduce."""
    return [{k: v for k, v in m.items() if not k.startswith(MEASURED)} for m in metrics]


def assert_same_metrics(a: list[dict], b: list[dict]) -> None:
    """Two runs' :func:`comparable` records are the same steps with the same keys and equal values (rel 1e-5, abs
    1e-6: a resume reproduces the uninterrupted run); a metric without a value (None) must have none in both."""
    import pytest

    assert [m.get("step") for m in a] == [m.get("step") for m in b]
    for x, y in zip(a, b):
        assert x.keys() == y.keys(), x.get("step")
        for k in x:
            if x[k] is None or y[k] is None:
                assert x[k] is y[k], (x.get("step"), k)
            else:
                assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-6), (x.get("step"), k)


def comparable_run(run: Path) -> list[dict]:
    """:func:`comparable` of a run directory's ``metrics.jsonl``."""
    import json

    return comparable([json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()])


def start_vllm_server(model, *args: str):
    """``mmgpg vllm-serve --model MODEL --port 0 ARGS`` in a subprocess (one torch thread), as a user starts it in
    the vLLM environment; returns ``(process, url)`` once it prints its ready line. Its stdout is drained by a thread
    from then on (vLLM logs there: a full pipe would block the server at its next log line, and the request with
    it)."""
    import os
    import subprocess
    import sys
    import threading

    proc = subprocess.Popen([sys.executable, "-m", "mmgpg", "vllm-serve", "--model", str(model), "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = next((line.split()[4] for line in proc.stdout if line.startswith("mmgpg vllm-serve: ready at ")), None)
    if not url:
        proc.kill()
        raise AssertionError(f"the server did not start (exit {proc.poll()})")
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc, url
