"""``mmgpg diagnose RUN_DIR``: a run's per-prompt success against the theory of its own objective (docs/theory.md).

Reads ``config.yaml``, ``metrics.jsonl``, ``prompt_success.jsonl`` and, when present, ``probe_success.jsonl``
(``mmgpg probe``), and computes

(a) per step, the observed number of attempt-0 groups with mixed success against the predicted ``Σ_i (1 - P0(p_i))``,
    ``P0 = p^G + (1-p)^G``, with a Poisson-binomial z-score;
(b) per-prompt trajectories with Jeffreys intervals against the configured objective's predicted limit;
(c) an amplification table: p_ref bin → final p̂, the share with p̂ > p_ref, the predicted p*;
(d) the drift rate fitted against the logged α and learning rate (natural and Euclidean readings);
(e) how often each p bin is drawn and how often it enters the update.

Every estimate names its source (probe, first visit, leave-one-out). Success is binary: the records' ``success``
field (the task's ``success`` hook) or, for a task without one, ``rewards >= --success-threshold``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import expit

from mmgpg.theory import predict as theory

P_BINS = (0.0, 1e-9, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0 - 1e-9, 1.0)
BIN_LABELS = ("0", "(0, 0.1]", "(0.1, 0.3]", "(0.3, 0.5]", "(0.5, 0.7]", "(0.7, 0.9]", "(0.9, 1)", "1")


@dataclass
class Visit:
    """One generated group of a training step."""

    step: int
    prompt_id: str
    attempt: int
    group_size: int
    successes: int
    in_update: bool | None
    zero_variance: bool | None

    @property
    def mixed(self) -> bool:
        return 0 < self.successes < self.group_size


def read_visits(path: str | Path, success_threshold: float | None = None) -> list[Visit]:
    """``prompt_success.jsonl`` (:class:`mmgpg.rundir.SuccessRecord`) → visits. Successes are
    ``rewards >= success_threshold`` when a threshold is given, else the task's ``success`` list; a record with
    neither is refused with the fix."""
    from mmgpg.rundir import SuccessRecord, read_records

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: diagnose needs the prompt_success.jsonl of an mmgpg train run")
    visits = []
    for line, rec in read_records(path, SuccessRecord, numbered=True):
        if success_threshold is not None and rec.rewards is not None:
            k = int(sum(float(r) >= success_threshold for r in rec.rewards))
        elif rec.success is not None:
            k = sum(rec.success)
        else:
            raise ValueError(f"{path}:{line}: the task declares no binary success (success is null); pass "
                             "--success-threshold T to count rewards >= T as successes")
        visits.append(Visit(rec.step, rec.prompt_id, rec.attempt, rec.group_size, k, rec.in_update, rec.zero_variance))
    if not visits:
        raise ValueError(f"{path} holds no records: the run has not finished a step yet")
    return visits


def read_probes(path: str | Path, split: str | None = None) -> dict[int, dict[str, tuple[int, int]]]:
    """``probe_success.jsonl`` (:class:`mmgpg.rundir.ProbeRecord`) → ``{step: {prompt_id: (successes, samples)}}``
    for ``split`` (absent file → empty)."""
    from mmgpg.rundir import ProbeRecord, read_records

    path = Path(path)
    probes: dict[int, dict[str, tuple[int, int]]] = {}
    if not path.exists():
        return probes
    for rec in read_records(path, ProbeRecord):
        if split is not None and rec.split not in ("", split):
            continue
        probes.setdefault(rec.step, {})[rec.prompt_id] = (rec.successes, rec.samples)
    return probes


def jeffreys(k: int, n: int) -> tuple[float, float, float]:
    """Jeffreys posterior mean ``(k + ½)/(n + 1)`` and its 95% interval (Beta(k + ½, n - k + ½) quantiles)."""
    from scipy.stats import beta

    lo = 0.0 if k == 0 else float(beta.ppf(0.025, k + 0.5, n - k + 0.5))
    hi = 1.0 if k == n else float(beta.ppf(0.975, k + 0.5, n - k + 0.5))
    return (k + 0.5) / (n + 1), lo, hi


def bin_label(p: float) -> str:
    return BIN_LABELS[int(np.searchsorted(P_BINS[1:-1], p, side="left"))]


# --------------------------------------------------------------------------------------------------------------------
# p_ref, final p̂ and current p estimates
# --------------------------------------------------------------------------------------------------------------------


def reference_estimates(visits: list[Visit], probes: dict) -> tuple[dict[str, float], str]:
    """p_ref per prompt: the step-0 probe when there is one (k = 0 → exactly 0, the absorbing case), else the first
    visit's k/G (a noisy estimate). Returns ``(p_ref by prompt, source)``."""
    if 0 in probes:
        return {pid: (k / N if k in (0, N) else (k + 0.5) / (N + 1)) for pid, (k, N) in probes[0].items()}, \
            "step-0 probe"
    first: dict[str, Visit] = {}
    for v in sorted(visits, key=lambda v: (v.step, v.attempt)):
        first.setdefault(v.prompt_id, v)
    return {pid: v.successes / v.group_size for pid, v in first.items()}, "first visit (k/G)"


def final_estimates(visits: list[Visit], probes: dict, ref_source: str) -> tuple[dict[str, tuple[int, int]], str]:
    """Final success counts per prompt: the last probe after step 0, else every visit in the last third of the run
    (excluding a prompt's first visit when that visit is its p_ref)."""
    later = [s for s in probes if s > 0]
    if later:
        return dict(probes[max(later)]), f"probe at step {max(later)}"
    last = max(v.step for v in visits)
    start = last - max(last // 3, 1) + 1
    first_seen: dict[str, tuple[int, int]] = {}
    for v in sorted(visits, key=lambda v: (v.step, v.attempt)):
        first_seen.setdefault(v.prompt_id, (v.step, v.attempt))
    counts: dict[str, tuple[int, int]] = {}
    for v in visits:
        if v.step < start or (ref_source.startswith("first visit") and first_seen[v.prompt_id] == (v.step, v.attempt)):
            continue
        k, n = counts.get(v.prompt_id, (0, 0))
        counts[v.prompt_id] = (k + v.successes, n + v.group_size)
    return counts, f"visits in steps {start}..{last}"


def current_p(visits: list[Visit], probes: dict) -> tuple[list[float], str]:
    """Per visit, an estimate of its prompt's p at that step not using the visit itself: from the probes (Jeffreys
    means, interpolated linearly in log-odds between the probes before and after the step; the last one after it),
    else the prompt's other visits pooled (Jeffreys), else the run's pooled rate."""
    if probes:
        steps = sorted(probes)
        out = []
        pooled = _pooled(visits)
        for v in visits:
            have = [s for s in steps if v.prompt_id in probes[s]]
            before = [s for s in have if s <= v.step]
            after = [s for s in have if s > v.step]
            if not before:
                out.append(pooled)
                continue
            z0 = theory.logit(_jeffreys_mean(*probes[before[-1]][v.prompt_id]))
            if after:  # between two probes: linear in log-odds
                z1 = theory.logit(_jeffreys_mean(*probes[after[0]][v.prompt_id]))
                z0 += (v.step - before[-1]) / (after[0] - before[-1]) * (z1 - z0)
            out.append(float(expit(z0)))
        return out, "probes (Jeffreys), interpolated in log-odds between the probes around the step"
    totals: dict[str, list[int]] = {}
    for v in visits:
        t = totals.setdefault(v.prompt_id, [0, 0])
        t[0] += v.successes
        t[1] += v.group_size
    pooled = _pooled(visits)
    out = []
    for v in visits:
        k, n = totals[v.prompt_id][0] - v.successes, totals[v.prompt_id][1] - v.group_size
        out.append((k + 0.5) / (n + 1) if n > 0 else pooled)
    return out, "the prompt's other visits pooled over the run (leave-one-out, Jeffreys)"


def _jeffreys_mean(k: int, n: int) -> float:
    return (k + 0.5) / (n + 1)


def _pooled(visits: list[Visit]) -> float:
    return (sum(v.successes for v in visits) + 0.5) / (sum(v.group_size for v in visits) + 1)


# --------------------------------------------------------------------------------------------------------------------
# (a) valid fraction, (c) amplification, (d) drift, (e) selection
# --------------------------------------------------------------------------------------------------------------------


def valid_fraction_check(visits: list[Visit], p_now: list[float]) -> dict:
    """Attempt-0 groups per step: observed mixed-success groups vs ``Σ (1 - P0(p_i))``, z = (obs - mean)/sd."""
    per: dict[int, list[float]] = {}
    for v, p in zip(visits, p_now):
        if v.attempt != 0:
            continue
        q = 1.0 - theory.zero_variance_probability(p, v.group_size)
        s = per.setdefault(v.step, [0, 0.0, 0.0, 0])
        s[0] += v.mixed
        s[1] += q
        s[2] += q * (1 - q)
        s[3] += 1
    steps = []
    for step in sorted(per):
        obs, mean, var, n = per[step]
        steps.append({"step": step, "groups": n, "observed": obs / n, "predicted": mean / n,
                      "z": (obs - mean) / math.sqrt(var) if var > 0 else None})
    obs, mean, var = (sum(per[s][i] for s in per) for i in range(3))
    return {"steps": steps, "total_observed": obs, "total_predicted": mean,
            "z_total": (obs - mean) / math.sqrt(var) if var > 0 else None}


def amplification_table(p_ref: dict[str, float], final: dict[str, tuple[int, int]], cfg) -> list[dict]:
    """Per p_ref bin: prompts, mean p_ref, mean final p̂, share with p̂ > p_ref, mean predicted limit."""
    bins: dict[str, list[tuple[float, float, float | None]]] = {}
    cache: dict[float, float | None] = {}
    for pid, pr in p_ref.items():
        if pid not in final or final[pid][1] == 0:
            continue
        k, n = final[pid]
        key = round(pr, 4)
        if key not in cache:
            cache[key] = theory.predicted_limit(cfg, key)
        bins.setdefault(bin_label(pr), []).append((pr, k / n, cache[key]))
    rows = []
    for label in BIN_LABELS:
        items = bins.get(label, [])
        if not items:
            continue
        predicted = [x[2] for x in items if x[2] is not None]
        rows.append({"bin": label, "prompts": len(items), "mean_p_ref": float(np.mean([x[0] for x in items])),
                     "mean_final": float(np.mean([x[1] for x in items])),
                     "share_amplified": float(np.mean([x[1] > x[0] for x in items])),
                     "mean_predicted": float(np.mean(predicted)) if predicted else None})
    return rows


def selection_table(visits: list[Visit], p_now: list[float]) -> list[dict]:
    """Per current-p bin: groups drawn, groups in the update, their ratio, and the predicted P(mixed) = 1 - P0
    (in_update None for records of runs that did not log it)."""
    bins: dict[str, list] = {}
    for v, p in zip(visits, p_now):
        b = bins.setdefault(bin_label(p), [0, 0, 0.0, 0, True])
        b[0] += 1
        b[1] += bool(v.in_update)
        b[4] = b[4] and v.in_update is not None
        b[2] += 1.0 - theory.zero_variance_probability(p, v.group_size)
        b[3] += v.mixed
    return [{"bin": label, "drawn": b[0], "in_update": b[1] if b[4] else None,
             "update_share": b[1] / b[0] if b[4] else None,
             "observed_mixed": b[3] / b[0], "predicted_mixed": b[2] / b[0]}
            for label in BIN_LABELS if (b := bins.get(label))]


def drift_fit(visits: list[Visit], metrics: list[dict], p_ref: dict[str, float], G: int,
              exclude_first: bool = False) -> dict | None:
    """Fit ``c`` in the no-KL drift with x_t = Σ_{s<t} α_s lr_s (1 - 1/G) (the logged α and learning rate):
    natural reading ``z_q(t) = z_ref,q + c x_t``; Euclidean ``dz_q = c p_q(1 - p_q) dx``. Each predicts the mean
    attempt-0 success at step t over the prompts drawn then (those with a p_ref; without their first visit when
    that visit is the p_ref, ``exclude_first``); c minimises the sample-weighted squared error. None with < 3 steps.
    A skipped step (no informative group, no update: ``gpg/alpha`` is null in ``metrics.jsonl``) moves x by 0; its
    rollout is still an observation."""
    from scipy.optimize import minimize_scalar

    first: dict[str, tuple[int, int]] = {}
    for v in sorted(visits, key=lambda v: (v.step, v.attempt)):
        first.setdefault(v.prompt_id, (v.step, v.attempt))
    visits = [v for v in visits if v.prompt_id in p_ref
              and not (exclude_first and first[v.prompt_id] == (v.step, v.attempt))]
    by_step = {int(m["step"]): m for m in metrics if "gpg/alpha" in m and "lr" in m}
    steps = sorted({v.step for v in visits if v.attempt == 0} & set(by_step))
    if len(steps) < 3:
        return None
    x, acc = {}, 0.0
    for s in sorted(by_step):
        x[s] = acc  # the step's rollout happens before its update
        alpha, lr = by_step[s]["gpg/alpha"], by_step[s]["lr"]
        if alpha is not None and lr is not None:  # None: a skipped step, no update
            acc += alpha * lr * (1 - 1 / G)
    groups = {s: [v for v in visits if v.step == s and v.attempt == 0] for s in steps}
    z_ref = {pid: (theory.logit(min(max(p, 1e-6), 1 - 1e-6)) if 0 < p < 1 else (-np.inf if p == 0 else np.inf))
             for pid, p in p_ref.items()}
    observed = np.array([sum(v.successes for v in groups[s]) / sum(v.group_size for v in groups[s]) for s in steps])
    weights = np.array([sum(v.group_size for v in groups[s]) for s in steps], dtype=float)

    zr = [np.array([z_ref[v.prompt_id] for v in groups[s]], dtype=float) for s in steps]
    xs = [x[s] for s in steps]

    def natural(c: float) -> np.ndarray:
        return np.array([float(np.mean(expit(z + c * xi))) for z, xi in zip(zr, xs)])

    def euclid(c: float) -> np.ndarray:
        return np.array([float(np.mean(expit(_euclid_z(z, c * xi)))) for z, xi in zip(zr, xs)])

    result = {"x_final": acc, "steps": steps, "observed": observed.tolist()}
    scale = 1.0 / max(acc, 1e-300)
    for name, model in (("natural", natural), ("euclidean", euclid)):
        fit = minimize_scalar(lambda c, model=model: float(np.sum(weights * (model(c) - observed) ** 2)),
                              bounds=(-50 * scale, 200 * scale), method="bounded")
        result[name] = {"c": float(fit.x), "sse": float(fit.fun), "fitted": model(float(fit.x)).tolist()}
    result["constant_sse"] = float(np.sum(weights * (observed - np.average(observed, weights=weights)) ** 2))
    return result


def _euclid_z(z0: np.ndarray, dx: float, steps: int = 50) -> np.ndarray:
    """Integrate dz/dx = p(1-p) from z0 (an array) over dx (RK4); ±inf (p = 0 or 1) stay where they are."""
    z = np.array(z0, dtype=float)
    if dx == 0:
        return z
    h = dx / steps

    def f(z: np.ndarray) -> np.ndarray:
        return np.where(np.isfinite(z), expit(z) * expit(-z), 0.0)

    for _ in range(steps):
        k1 = f(z)
        k2 = f(z + h * k1 / 2)
        k3 = f(z + h * k2 / 2)
        k4 = f(z + h * k3)
        z = z + h * (k1 + 2 * k2 + 2 * k3 + k4) / 6
    return z
