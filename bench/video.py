"""Video on the tiny Qwen2.5-VL: frames decoded per second, and what a training step costs with 4, 8 and 16 frames
per clip, HF vs vLLM, in one table.

    python bench/video.py --out bench/results/video.md                    # decoding + the hf engine
    .venv-vllm/bin/python bench/video.py --engine vllm --no-decode        # the vLLM engine (vLLM environment)

Decoding: an H.264 file of 64 frames of 224 x 224 at 16 fps, written with PyAV, read by
:func:`mmgpg.models.qwen_vl.read_video` (decoded in order up to the last sampled frame, only the sampled ones
converted and kept) 5 times; frames decoded per second over all reads. Steps: ``bench/families.py``'s measurement (4 GRPO steps, the first a warm-up, 4 prompts x G = 4,
24 new tokens, fp32, each configuration in a process of its own) on the embedded ``moving_shapes`` task with
``task.frames`` = 4, 8, 16 (112 x 112 frames, each resized within the default pixel bounds) and
``model.video_max_frames`` = 16: rollout s and completion tokens/s, update s, peak RSS per phase. The machine load is
printed beside the table; read the ratios between rows, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRAMES = (4, 8, 16)


def decode_rate(workdir: Path, reads: int = 5) -> dict:
    import av
    from PIL import Image

    from mmgpg.models.qwen_vl import read_video

    path = workdir / "clip.mp4"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=16)
        stream.width, stream.height, stream.pix_fmt = 224, 224, "yuv420p"
        for t in range(64):
            frame = Image.new("RGB", (224, 224), (120, 120, 120))
            frame.paste((220, 30, 30), (3 * t, 100, 3 * t + 20, 120))
            out.mux(stream.encode(av.VideoFrame.from_image(frame)))
        out.mux(stream.encode())
    t0 = time.perf_counter()
    for _ in range(reads):
        frames, meta = read_video(str(path), 2.0, 16)
    seconds = time.perf_counter() - t0
    return {"frames_decoded_per_s": reads * meta["total_num_frames"] / seconds, "sampled": len(frames)}


def main() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--family", default="qwen2_5_vl")
    ap.add_argument("--no-decode", action="store_true", help="skip the decoding measurement")
    ap.add_argument("--out", help="also write the results (markdown) here")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one frame count in this process
    args = ap.parse_args()
    from families import child_result, emit, run_family, table

    if args.one:
        with tempfile.TemporaryDirectory() as tmp:
            result = run_family(args.family, args.engine, args.steps, Path(tmp),
                                ("task=moving_shapes", f"task.frames={args.one}", "model.video_max_frames=16"))
        print(json.dumps({**result, "family": f"{args.family}, {args.one} frames"}))
        return
    load = os.getloadavg()
    lines = []
    if not args.no_decode:
        with tempfile.TemporaryDirectory() as tmp:
            d = decode_rate(Path(tmp))
        lines.append(f"decoding (PyAV, H.264 224 x 224): {d['frames_decoded_per_s']:.0f} frames/s "
                     f"({d['sampled']} kept of 64 per read at 2 fps)\n")
    results = []
    for frames in FRAMES:
        print(f"{frames} frames ...", flush=True)
        cmd = [sys.executable, __file__, "--one", str(frames), "--engine", args.engine, "--steps", str(args.steps),
               "--family", args.family]
        results.append(child_result(cmd, f"{frames} frames"))
    lines.append(table(results))
    lines.append(f"\nmachine: {os.cpu_count()} CPUs, load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}; "
                 f"{args.steps - 1} measured steps per row (medians; tokens/s over all)\n")
    text = "\n".join(lines)
    emit(text, args.out)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
