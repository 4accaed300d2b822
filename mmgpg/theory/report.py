"""The ``mmgpg diagnose`` report: assemble :mod:`mmgpg.theory.diagnose`'s analyses for a run directory and write
``diagnose.json``, ``diagnose.txt`` and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

from mmgpg.jsonl import atomic_writer, write_text_atomic
from mmgpg.theory import diagnose as D
from mmgpg.theory import predict as theory


def trajectories(visits: list[D.Visit], probes: dict, p_ref: dict[str, float], cfg, limit: int = 12) -> list[dict]:
    """The ``limit`` most-visited prompts: per visit (and probe) p̂ with a Jeffreys interval, and the predicted
    limit of the configured objective from the prompt's p_ref."""
    counts: dict[str, int] = {}
    for v in visits:
        counts[v.prompt_id] = counts.get(v.prompt_id, 0) + 1
    chosen = sorted(counts, key=lambda pid: (-counts[pid], pid))[:limit]
    out = []
    for pid in chosen:
        points = []
        for v in sorted((v for v in visits if v.prompt_id == pid), key=lambda v: (v.step, v.attempt)):
            mean, lo, hi = D.jeffreys(v.successes, v.group_size)
            points.append({"step": v.step, "successes": v.successes, "n": v.group_size, "p_hat": v.successes /
                           v.group_size, "lo": lo, "hi": hi, "source": "visit"})
        for step in sorted(probes):
            if pid in probes[step]:
                k, n = probes[step][pid]
                mean, lo, hi = D.jeffreys(k, n)
                points.append({"step": step, "successes": k, "n": n, "p_hat": k / n, "lo": lo, "hi": hi,
                               "source": "probe"})
        pr = p_ref.get(pid)
        out.append({"prompt_id": pid, "p_ref": pr, "predicted_limit": theory.predicted_limit(cfg, pr)
                    if pr is not None else None, "points": points})
    return out


def run_diagnose(run_dir: str | Path, out_dir: str | Path | None = None,
                 success_threshold: float | None = None) -> dict:
    """Everything for one run; writes ``diagnose.json``, ``diagnose.txt`` and ``*.png`` to ``out_dir``
    (default ``RUN_DIR/diagnose``) and returns the report."""
    from mmgpg.rundir import PROBES, SUCCESS, read_config, read_metrics

    run = Path(run_dir)
    cfg, ignored, _ = read_config(run, lenient=True, use_task=False)  # success is in the records: no task code runs
    metrics = read_metrics(run)
    visits = D.read_visits(run / SUCCESS, success_threshold)
    probes = D.read_probes(run / PROBES, cfg.train.split)
    G = cfg.rollout.group_size
    p_ref, ref_source = D.reference_estimates(visits, probes)
    final, final_source = D.final_estimates(visits, probes, ref_source)
    p_now, now_source = D.current_p(visits, probes)
    a = cfg.algo
    report = {
        "run_dir": str(run),
        "objective": {"advantage": a.advantage, "std_eps": a.std_eps, "group_size": G, "kl_coef": a.kl_coef,
                      "kl_estimator": a.kl_estimator, "alpha_correction": a.alpha_correction,
                      "predicted_limit": ("none (no KL: p drifts up, 0 absorbing)" if a.kl_coef <= 0
                                          or a.kl_estimator == "k1" else
                                          ("k3: β(p - p_ref) = p(1-p)Ω_G(p)" if a.kl_estimator == "k3"
                                           else "k2: logit p = logit p_ref + Ω_G(p)/β"))},
        "sources": {"p_ref": ref_source, "final": final_source, "current_p": now_source,
                    "success": f"threshold rewards >= {success_threshold:g}" if success_threshold is not None
                    else "the task's success field"},
        "ignored_config_keys": ignored,
        "counts": {"visits": len(visits), "prompts": len({v.prompt_id for v in visits}), "probe_steps": sorted(probes)},
        "valid_fraction": D.valid_fraction_check(visits, p_now),
        "amplification": D.amplification_table(p_ref, final, cfg),
        "selection": D.selection_table(visits, p_now),
        "drift": D.drift_fit(visits, metrics, p_ref, G, ref_source.startswith("first visit")) if a.kl_coef <= 0 or a.kl_estimator == "k1" else None,
        "trajectories": trajectories(visits, probes, p_ref, cfg),
    }
    out = Path(out_dir) if out_dir else run / "diagnose"
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "diagnose.json", json.dumps(report, indent=2))
    text = render_text(report)
    write_text_atomic(out / "diagnose.txt", text)
    report["files"] = [str(out / "diagnose.json"), str(out / "diagnose.txt"), *map(str, write_plots(report, out))]
    return report


def _f(x, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def render_text(r: dict) -> str:
    lines = [f"mmgpg diagnose {r['run_dir']}", "objective: " + ", ".join(f"{k}={v}" for k, v in r["objective"].items()),
             "sources: " + "; ".join(f"{k}: {v}" for k, v in r["sources"].items()),
             f"{r['counts']['visits']} groups over {r['counts']['prompts']} prompts; probe steps: "
             f"{r['counts']['probe_steps'] or 'none'}"]
    if r["ignored_config_keys"]:
        lines.append("config.yaml keys this mmgpg version does not know (ignored): " + ", ".join(r["ignored_config_keys"]))
    lines.append("")
    vf = r["valid_fraction"]
    lines += ["(a) attempt-0 groups with mixed success: observed vs predicted Σ(1 - p^G - (1-p)^G)",
              f"    total {vf['total_observed']:.0f} observed vs {vf['total_predicted']:.1f} predicted, "
              f"z = {_f(vf['z_total'], '+.2f')}",
              "    step  groups  observed  predicted      z"]
    for s in vf["steps"]:
        lines.append(f"    {s['step']:>4}  {s['groups']:>6}  {s['observed']:>8.3f}  {s['predicted']:>9.3f}  "
                     f"{_f(s['z'], '+6.2f')}")
    lines += ["", "(c) amplification by p_ref bin", "    bin          prompts  mean p_ref  mean final  share > p_ref  "
              "predicted p*"]
    for row in r["amplification"]:
        lines.append(f"    {row['bin']:<12} {row['prompts']:>7}  {row['mean_p_ref']:>10.3f}  {row['mean_final']:>10.3f}"
                     f"  {row['share_amplified']:>12.2f}  {_f(row['mean_predicted']):>12}")
    if not r["amplification"]:
        lines.append("    (no prompt has both a p_ref and a later estimate: revisit prompts (a small train split, more "
                     "steps) or probe the checkpoints with mmgpg probe)")
    if r["drift"] is None:
        lines += ["", "(d) drift: " + ("not applicable: the objective has a KL fixed point (see (c))"
                                       if r["objective"]["kl_coef"] > 0 and r["objective"]["kl_estimator"] != "k1"
                                       else "fewer than 3 steps with usable revisits; nothing to fit")]
    else:
        d = r["drift"]
        lines += ["", "(d) drift fitted against x_t = Σ α_s lr_s (1 - 1/G) "
                  f"(x_final = {d['x_final']:.3g}); weighted SSE of a constant: {d['constant_sse']:.4g}"]
        for name in ("natural", "euclidean"):
            lines.append(f"    {name:<10} c = {d[name]['c']:.4g} per unit x, SSE {d[name]['sse']:.4g}")
    lines += ["", "(e) selection by current-p bin: drawn vs in the update",
              "    bin          drawn  in update  share  observed mixed  predicted mixed"]
    for row in r["selection"]:
        lines.append(f"    {row['bin']:<12} {row['drawn']:>5}  {_f(row['in_update'], 'd'):>9}  "
                     f"{_f(row['update_share'], '.2f'):>5}  "
                     f"{row['observed_mixed']:>14.2f}  {row['predicted_mixed']:>15.2f}")
    return "\n".join(lines) + "\n"


def write_plots(r: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    steps = r["valid_fraction"]["steps"]
    if steps:
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([s["step"] for s in steps], [s["observed"] for s in steps], "o-", label="observed (attempt 0)")
        ax.plot([s["step"] for s in steps], [s["predicted"] for s in steps], "s--", label="predicted 1 - P0(p)")
        ax.set(xlabel="step", ylabel="share of groups with mixed success", ylim=(-0.02, 1.02),
               title=f"valid fraction, z = {_f(r['valid_fraction']['z_total'], '+.2f')}")
        ax.legend()
        paths.append(_save(fig, out / "valid_fraction.png"))
    if r["trajectories"]:
        n = len(r["trajectories"])
        cols = min(4, n)
        fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(3.2 * cols, 2.6 * ((n + cols - 1) // cols)),
                                 squeeze=False)
        for ax, t in zip(axes.flat, r["trajectories"]):
            for source, style in (("visit", "o"), ("probe", "s")):
                pts = [p for p in t["points"] if p["source"] == source]
                if pts:
                    ax.errorbar([p["step"] for p in pts], [p["p_hat"] for p in pts], fmt=style, ms=3,
                                yerr=[[p["p_hat"] - p["lo"] for p in pts], [p["hi"] - p["p_hat"] for p in pts]],
                                label=source)
            if t["p_ref"] is not None:
                ax.axhline(t["p_ref"], ls=":", c="gray", label="p_ref")
            if t["predicted_limit"] is not None:
                ax.axhline(t["predicted_limit"], ls="--", c="red", label="predicted p*")
            ax.set(ylim=(-0.05, 1.05), title=str(t["prompt_id"])[:24])
            ax.title.set_fontsize(8)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=6)
        paths.append(_save(fig, out / "trajectories.png"))
    if r["amplification"]:
        rows = r["amplification"]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([x["mean_p_ref"] for x in rows], [x["mean_final"] for x in rows], "o-", label="observed final")
        pred = [(x["mean_p_ref"], x["mean_predicted"]) for x in rows if x["mean_predicted"] is not None]
        if pred:
            ax.plot(*zip(*pred), "s--", label="predicted p*")
        ax.plot([0, 1], [0, 1], c="gray", lw=0.8, label="p = p_ref")
        ax.set(xlabel="p_ref (bin mean)", ylabel="success", title="amplification", xlim=(0, 1), ylim=(0, 1.02))
        ax.legend()
        paths.append(_save(fig, out / "amplification.png"))
    if r["drift"]:
        d = r["drift"]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(d["steps"], d["observed"], "o", label="observed attempt-0 success")
        for name in ("natural", "euclidean"):
            ax.plot(d["steps"], d[name]["fitted"], "-", label=f"{name} fit, c = {d[name]['c']:.3g}")
        ax.set(xlabel="step", ylabel="success rate", title="GPG drift against Σ α lr (1 - 1/G)")
        ax.legend()
        paths.append(_save(fig, out / "drift.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    with atomic_writer(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
