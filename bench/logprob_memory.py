"""Peak memory of completion log-probs: chunked (mmgpg) vs full logits, at Qwen2-VL-2B's real vocabulary.

Each configuration runs in a fresh child process that allocates the output embedding ``W [V, H]`` and the scored
hidden states ``h [K, H]`` first, records its peak resident memory, then runs forward + backward of
``sum_k c_k * log p(y_k)`` and records the peak again. The difference is the extra memory the log-prob computation
needs (it includes ``W.grad``, ``V x H x 4`` bytes, which every method allocates). The peer, run side by side, is the
naive ``log_softmax(h @ W.T)`` over all K tokens at once.

    python bench/logprob_memory.py                       # V=151936, H=1536 (Qwen2-VL-2B), K in {512, 2048}
    python bench/logprob_memory.py --tokens 512 4096 --chunks 256 1024

Expected shape: the naive peak grows with K (it holds several [K, V] float32 tensors); the chunked peak grows with
the chunk size and stays flat in K. Results are printed as a markdown table (and written with --out).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

MB = 1024 * 1024


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # ru_maxrss is KiB on Linux


def child(method: str, tokens: int, chunk: int, vocab: int, hidden_size: int, threads: int) -> dict:
    import torch

    from mmgpg.models.logprobs import chunked_token_logprobs

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    # Filled in place: no temporaries that would raise the baseline peak.
    weight = torch.empty(vocab, hidden_size).normal_(0, 0.02, generator=g).requires_grad_()
    hidden = torch.empty(tokens, hidden_size).normal_(0, 1, generator=g).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    coef = torch.randn(tokens, generator=g)
    # Warm up on a tiny problem so lazy imports and allocator set-up are not counted.
    w0, h0 = torch.randn(8, hidden_size, requires_grad=True), torch.randn(4, hidden_size, requires_grad=True)
    chunked_token_logprobs(h0, w0, torch.zeros(4, dtype=torch.long), chunk_size=2).sum().backward()
    torch.log_softmax(h0 @ w0.T, -1).sum().backward()
    before = _peak_mb()
    t0 = time.perf_counter()
    if method == "naive":
        logp = torch.log_softmax(hidden @ weight.T, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    else:
        logp = chunked_token_logprobs(hidden, weight, targets, chunk_size=chunk)
    (logp * coef).sum().backward()
    seconds = time.perf_counter() - t0
    extra = _peak_mb() - before
    return {"method": method, "tokens": tokens, "chunk": chunk if method != "naive" else None, "extra_mb": extra,
            "grad_w_mb": vocab * hidden_size * 4 / MB, "seconds": seconds, "logp_sum": float(logp.sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[512, 2048], help="scored completion tokens K")
    ap.add_argument("--chunks", type=int, nargs="+", default=[128, 512, 2048])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="also write the markdown table here")
    ap.add_argument("--child", nargs=3, metavar=("METHOD", "TOKENS", "CHUNK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        method, tokens, chunk = args.child[0], int(args.child[1]), int(args.child[2])
        print(json.dumps(child(method, tokens, chunk, args.vocab, args.hidden, args.threads)))
        return

    rows = []
    for tokens in args.tokens:
        for method, chunk in [("naive", 0)] + [("chunked", c) for c in args.chunks]:
            cmd = [sys.executable, __file__, "--vocab", str(args.vocab), "--hidden", str(args.hidden),
                   "--threads", str(args.threads), "--child", method, str(tokens), str(chunk)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"K={tokens:6d} {method:8s} chunk={chunk or '-':>5} extra {row['extra_mb']:8.0f} MB "
                  f"({row['seconds']:.1f} s)", flush=True)

    lines = [
        f"V={args.vocab}, H={args.hidden}, float32, forward+backward, {args.threads} threads. "
        f"`extra` = peak RSS growth during the computation; W.grad alone is {rows[0]['grad_w_mb']:.0f} MB.",
        "",
        "| K tokens | method | chunk | extra peak MB | extra minus W.grad MB | vs naive at same K | seconds |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for tokens in args.tokens:
        naive = next(r for r in rows if r["tokens"] == tokens and r["method"] == "naive")
        for r in (r for r in rows if r["tokens"] == tokens):
            lines.append(
                f"| {tokens} | {r['method']} | {r['chunk'] or '-'} | {r['extra_mb']:.0f} | "
                f"{r['extra_mb'] - r['grad_w_mb']:.0f} | {r['extra_mb'] / naive['extra_mb']:.2f}x | {r['seconds']:.1f} |")
        # consistency: the methods compute the same numbers
        for r in rows:
            if r["tokens"] == tokens:
                assert abs(r["logp_sum"] - naive["logp_sum"]) <= 1e-3 * abs(naive["logp_sum"]), (r, naive)
    table = "\n".join(lines)
    print()
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"# `python {' '.join(sys.argv)}`\n\n{table}\n")


if __name__ == "__main__":
    main()
