"""``mmgpg theory predict``, ``mmgpg diagnose`` and ``mmgpg probe``: the success-amplification tools
(docs/theory.md)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from mmgpg.cli.common import add_config_args, float_in, int_in
from mmgpg.rundir import PROBES


def _fmt_p(p: float, log10_one_minus_p: float | None = None) -> str:
    if p > 0.9999:
        k = -log10_one_minus_p if log10_one_minus_p is not None else -math.log10(max(1.0 - p, 1e-300))
        return f"1-10^-{k:.1f}"
    return f"{p:.4g}"


def _fmt_roots(roots: list[dict], extra: str) -> str:
    if not roots:
        return "—"
    parts = []
    for r in roots:
        text = _fmt_p(r["p"], r.get("log10_one_minus_p"))
        if extra == "flow_rate":
            text += f" (rate {r['flow_rate']:+.2g})"
        else:
            text += f" (h' {r['h_prime']:+.2g}, B {r['stability_bound']:.2g})"
        parts.append(text)
    return ", ".join(parts)


def parse_p_refs(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--p-ref must be comma-separated numbers in [0, 1], e.g. 0.01,0.2,0.5; got {text!r}") from None
    if not values:
        raise ValueError("--p-ref needs at least one value, e.g. --p-ref 0.01,0.2,0.5")
    return values


def cmd_theory_predict(args) -> int:
    from mmgpg.config import resolve
    from mmgpg.theory.predict import predict

    cfg = resolve(args.overrides, config_dirs=args.config_dir).config
    if args.visits < 1:
        raise ValueError(f"--visits must be >= 1; got {args.visits}")
    result = predict(cfg, parse_p_refs(args.p_ref), visits=args.visits, paper_eps=args.paper_eps)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print_prediction(result)
    return 0


def print_prediction(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    o = result["objective"]
    configured = o["configured_fixed_point"]
    star = {k: " ★" if k == configured else "" for k in ("k3", "k2")}
    title = (f"advantage={o['advantage']} std_eps={o['std_eps']:g} G={o['group_size']} kl_coef(β)={o['kl_coef']:g} "
             f"kl_estimator={o['kl_estimator']} (★ = the configured objective's fixed point)")
    table = Table(title=title)
    omega = "Ω_B" if o["weight"].startswith("Ω_B") else "Ω_G"
    columns = ["p_ref", omega, "P0", f"k3 p*{star['k3']}", f"k2/reverse-KL p*{star['k2']}",
               f"paper p* (ε={o['paper_eps']:g})", "GPG drift", f"drift α (P={o['prompts_per_step']})",
               f"coverage (V={o['visits']})"]
    for c in columns:
        table.add_column(c, justify="right")
    for r in result["rows"]:
        table.add_row(f"{r['p_ref']:g}", f"{r['omega_G']:.4f}", f"{r['zero_variance_probability']:.4f}",
                      _fmt_roots(r["k3"], "flow_rate"), _fmt_roots(r["k2"], "h"), _fmt_roots(r["paper"], "h"),
                      f"{r['gpg_drift']:.4g}", f"{r['gpg_drift_alpha']:.4g}", f"{r['coverage']:.4f}")
    console = Console() if sys.stdout.isatty() else Console(width=250)
    console.print(table)
    if o["kl_coef"] <= 0:
        print("kl_coef = 0: nothing pulls p back toward p_ref, so there is no interior fixed point; p drifts up at "
              "the GPG drift rate and p_ref = 0 is absorbing.")
    elif configured is None:
        print("kl_estimator = k1: its expected gradient is 0, so the configured objective has no interior fixed point.")
    print(f"weight: {o['weight']}")
    for note in result["not_covered"]:
        print(f"not covered: {note}")
    print("columns (formulas):")
    names = {omega: "omega_G", "P0": "zero_variance_probability", "k3 p*": "k3", "k2/reverse-KL p*": "k2",
             "paper p*": "paper", "GPG drift": "gpg_drift", "drift α": "gpg_drift_alpha", "coverage": "coverage"}
    for label, key in names.items():
        print(f"  {label}: {result['formulas'][key]}")


def cmd_probe(args) -> int:
    from mmgpg.config import resolve
    from mmgpg.rundir import read_config, replace_probe
    from mmgpg.theory.probe import locate, probe
    from mmgpg.utils import seed_everything

    run_dir, source, step = locate(args.ckpt, args.step)
    if run_dir is not None:
        cfg, _, task = read_config(run_dir, overrides=args.overrides, lenient=True)
    else:
        resolved = resolve(args.overrides, config_dirs=args.config_dir)
        cfg, task = resolved.config, resolved.task
    seed_everything(cfg.seed + 20_000 + step)
    records = probe(cfg, source, step=step, split=args.split, samples=args.samples, limit=args.limit,
                    success_threshold=args.success_threshold, batch_prompts=args.batch_prompts, task=task)
    out = Path(args.out) if args.out else (run_dir / PROBES if run_dir is not None else Path(PROBES))
    replace_probe(out, records)
    k = sum(r.successes for r in records)
    n = sum(r.samples for r in records)
    print(f"probed {len(records)} prompts of {args.split} x {args.samples} samples at step {step} "
          f"({source or cfg.model.name_or_path}): mean success {k / max(n, 1):.3f}; wrote {out}")
    return 0


def cmd_diagnose(args) -> int:
    from mmgpg.theory.report import run_diagnose

    report = run_diagnose(args.run_dir, args.out, args.success_threshold)
    sys.stdout.write(open(report["files"][1]).read())
    print("wrote " + ", ".join(report["files"]))
    return 0


MAX_VISITS, MAX_SAMPLES = 10**9, 100_000
"""Bounds of ``--visits`` and ``--samples``: the coverage formula is exact at any V, but 10**12 is a typo; a probe of
more than 100,000 completions per prompt would run for days (and its counts do not need it: the Jeffreys interval
at n = 100,000 is already ±0.3%)."""


def register(sub) -> None:
    """``theory predict``, ``diagnose`` and ``probe``."""
    p = sub.add_parser("theory", help="success-amplification theory of the configured objective (docs/theory.md)",
                       description="Theory of binary success under the configured objective.")
    tsub = p.add_subparsers(dest="theory_command", metavar="ACTION", required=True)
    t = tsub.add_parser("predict", help="fixed points, weights, drift and coverage per p_ref for a config",
                        description="For each --p-ref: the finite-group weight Ω_G of algo.advantage, the "
                        "zero-variance probability, the stationary points of the configured objective (k3 and "
                        "k2/reverse-KL, with stability), the paper's population fixed points, and GPG's drift and "
                        "coverage. Each column's formula is printed under the table. Example: mmgpg theory predict "
                        "algo=grpo algo.kl_coef=0.5 --p-ref 0.01,0.2,0.5")
    add_config_args(t)
    t.add_argument("--p-ref", required=True, help="comma-separated reference success probabilities, e.g. 0.01,0.2")
    t.add_argument("--visits", type=int_in(1, MAX_VISITS), default=10,
                   help=f"visits per prompt for the coverage column (default 10; 1-{MAX_VISITS:,})")
    t.add_argument("--paper-eps", type=float_in(0, 1, low_open=True), default=None,
                   help="ε of the paper's Ω_ε, in (0, 1] (default: algo.std_eps for group_stabilized, else 1e-5 as in "
                   "the paper)")
    t.add_argument("--json", action="store_true", help="print JSON instead of a table")
    t.set_defaults(func=cmd_theory_predict)

    p = sub.add_parser("diagnose", help="a run's per-prompt success against the theory of its objective",
                       description="Read RUN_DIR's config.yaml, metrics.jsonl, prompt_success.jsonl and "
                       "probe_success.jsonl (when present); print and write (RUN_DIR/diagnose or --out) observed vs "
                       "predicted attempt-0 valid fraction with z-scores, per-prompt trajectories, an amplification "
                       "table by p_ref bin, the GPG drift fit against logged alpha and lr, and how often each p bin "
                       "enters the update: diagnose.txt, diagnose.json and PNG plots. See docs/theory.md.")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="output folder (default RUN_DIR/diagnose)")
    p.add_argument("--success-threshold", type=float_in(-1e9, 1e9), default=None,
                   help="count total reward >= this as success (instead of the task's success hook; needed without one)")
    p.set_defaults(func=cmd_diagnose)

    p = sub.add_parser("probe", help="per-prompt success counts of a checkpoint at the rollout's sampling settings",
                       description="Sample --samples completions for each of the first --limit prompts of --split "
                       "with rollout.temperature/top_p/top_k/max_new_tokens, count successes (the task's success "
                       "hook, or total reward >= --success-threshold) and write probe_success.jsonl: into CKPT when it "
                       "is a training run directory (its config is used; --step 0 probes the starting model, which "
                       "gives p_ref), else to --out. Example: mmgpg probe runs/gpg --step 0 --samples 64 --limit 100")
    p.add_argument("ckpt", help="a training run directory, a model directory or hub id, or tiny")
    p.add_argument("--step", type=int_in(0, 10**12), default=None,
                   help="checkpoint step of a run directory (default the latest; 0 = the starting model)")
    p.add_argument("--split", default="train", help="task split (default train: the prompts the run trains on)")
    p.add_argument("--samples", type=int_in(1, MAX_SAMPLES), default=64,
                   help=f"completions per prompt (default 64; 1-{MAX_SAMPLES:,})")
    p.add_argument("--limit", type=int_in(1, 10**9), default=None, help="first N prompts only (default all)")
    p.add_argument("--batch-prompts", type=int_in(1, 4096), default=4, help="prompts per generate call (default 4)")
    p.add_argument("--success-threshold", type=float_in(-1e9, 1e9), default=None,
                   help="count total reward >= this as success (instead of the task's success hook; needed without one)")
    p.add_argument("--out", default=None, help=f"output file (default RUN_DIR/{PROBES} or ./{PROBES})")
    add_config_args(p)
    p.set_defaults(func=cmd_probe)
