"""``mmgpg vllm-serve``: rollouts served by vLLM over loopback HTTP (the server itself is
:mod:`mmgpg.rollout.vllm_server`; it runs in the environment that has vLLM)."""

from __future__ import annotations

from mmgpg.cli.common import seed_flag
from mmgpg.models import DTYPES


def cmd_serve(args) -> int:
    from mmgpg.rollout.vllm_server import serve

    return serve(args)


def register(sub) -> None:
    p = sub.add_parser("vllm-serve", help="serve rollouts with vLLM for rollout.engine=vllm rollout.vllm_server=URL",
                       description="Load a model into vLLM and answer generation and weight-reload requests over "
                       "HTTP on this machine (run it in the environment that has vLLM; docs/install.md). The trainer "
                       "connects with rollout.engine=vllm rollout.vllm_server=http://HOST:PORT.")
    p.add_argument("--model", required=True, help="model directory or hub id (the policy's starting model), or tiny")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (0: any free port; the ready line prints it)")
    p.add_argument("--dtype", default="float32", choices=DTYPES[1:])
    p.add_argument("--max-model-len", type=int, default=2048, help="longest prompt + completion in tokens")
    p.add_argument("--min-pixels", type=int, default=3136, help="as model.min_pixels of the run")
    p.add_argument("--max-pixels", type=int, default=401408, help="as model.max_pixels of the run")
    p.add_argument("--max-images", type=int, default=4, help="most images per prompt")
    p.add_argument("--max-videos", type=int, default=1,
                   help="most videos per prompt (a family vLLM serves without video gets 0)")
    p.add_argument("--seed", type=seed_flag, default=0)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--cpu-kv-cache-gb", type=int, default=1, help="CPU only: GiB of KV cache")
    p.set_defaults(func=cmd_serve)
