"""Video parts in the Qwen-VL policy (a list of frames or a file, sampled by qwen-vl-utils): the log-probs of a batch
with videos of different frame counts, an image and a video in one prompt, and a text-only prompt equal an unpadded
full-logits forward of each sequence alone; each video encoded once per prompt equals encoding it per copy; the
frame budget; bad video input is a clear error."""

from __future__ import annotations

import pytest
import torch
from support.conversations import mixed_video_conversations, moving_dot_frames, write_video
from support.families import QWEN_VL
from test_qwen_vl import assert_encoded_once_equals_per_copy, reference_logprobs

from mmgpg.models.load import load_policy
from mmgpg.models.qwen_vl import video_part

BOUNDS = dict(min_pixels=32 * 32, max_pixels=64 * 64)


@pytest.mark.parametrize("family", QWEN_VL)
def test_video_logprobs_equal_the_unpadded_reference(tiny_dirs, family):
    policy = load_policy(str(tiny_dirs[family]), dtype="float32", device="cpu", **BOUNDS)
    torch.manual_seed(0)
    batch = policy.encode_prompts(mixed_video_conversations())
    frames = [int(v["video_grid_thw"][0, 0]) for v in batch.vision if "video_grid_thw" in v]
    assert frames == [2, 3] and "image_grid_thw" in batch.vision[1] and batch.vision[2] == {}
    assert (batch.mm_token_type_ids == 2).any() and not batch.attention_mask[2, 0]  # video tokens; left padding
    rollout = policy.generate(batch, 3, max_new_tokens=12)
    policy.model.train()
    logp = policy.completion_logprobs(rollout, chunk_size=7)
    torch.testing.assert_close(logp.detach(), reference_logprobs(policy, batch, rollout), atol=1e-5, rtol=0)
    logp.sum().backward()
    assert sum(float(p.grad.abs().sum()) for n, p in policy.model.named_parameters()
               if "visual" in n and p.grad is not None) > 0


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_videos_encoded_once_equal_encoded_per_copy(tiny_dirs, family):
    policy = load_policy(str(tiny_dirs[family]), dtype="float32", device="cpu", **BOUNDS)
    assert_encoded_once_equals_per_copy(policy, mixed_video_conversations(), group_size=3, max_new_tokens=8)


def test_frame_budget_and_rate(tiny_dirs):
    policy = load_policy(str(tiny_dirs["qwen2_5_vl"]), dtype="float32", device="cpu", **BOUNDS)
    policy.video_max_frames = 4
    conv = [{"role": "user", "content": [{"type": "video", "video": moving_dot_frames(10)},
                                         {"type": "text", "text": "?"}]}]
    vision = policy.encode_prompts([conv]).vision[0]
    assert int(vision["video_grid_thw"][0, 0]) == 2  # 10 frames sampled evenly to 4 -> 2 temporal patches
    # Qwen2.5-VL's temporal positions: 2 frames per patch at the frames' rate (default video_fps 2 -> 1 s per patch)
    assert vision["second_per_grid_ts"].tolist() == [1.0]
    slow = [{"role": "user", "content": [{"type": "video", "video": moving_dot_frames(4), "fps": 0.5},
                                         {"type": "text", "text": "?"}]}]
    assert policy.encode_prompts([slow]).vision[0]["second_per_grid_ts"].tolist() == [4.0]
    assert video_part({"type": "video", "video": list(range(9))}, 2.0, 3, 1, 2)["video"] == [0, 4, 8]
    # the frames are resized by the policy's bounds only: a checkpoint's video processor (whose own bounds are far
    # larger in the released Qwen-VL models) does not resize them again
    before = policy.encode_prompts([slow]).vision[0]["video_grid_thw"].tolist()
    policy.processor.video_processor.size = {"shortest_edge": 128 * 28 * 28, "longest_edge": 768 * 28 * 28}
    assert policy.encode_prompts([slow]).vision[0]["video_grid_thw"].tolist() == before == [[2, 4, 4]]


@pytest.mark.parametrize(("frames", "total"), [(8, 0), (8, 300_000), (8, 120_000), (7, 140_000), (8, 2_000)])
def test_a_videos_pixel_budget_sizes_its_frames_as_qwen_vl_utils_does(frames, total):
    """The frames' size under a video pixel budget (``total_pixels``; 0: the default) equals qwen-vl-utils' own
    ``fetch_video`` (imported) on the same list of frames: 448 x 336 frames (multiples of 56, so its frame-list path's
    first resize, with twice the factor, keeps them), shrunk by budgets of 75,000 and 30,000 pixels per frame, a
    7-frame list padded to 8 before the budget is shared (140,000 / 8 x 2 = 35,000 per frame, not 40,000), and a budget below the floor (1.05 x min_pixels)."""
    from qwen_vl_utils import fetch_video

    from mmgpg.models.video import load_video

    pics = moving_dot_frames(frames, size=(448, 336))
    bounds = dict(min_pixels=3136, max_pixels=401408)
    ours, _ = load_video(video_part({"type": "video", "video": pics}, 2.0, 16, **bounds, total_pixels=total), 14)
    theirs = fetch_video({"video": pics, **bounds, **({"total_pixels": total} if total else {})}, image_patch_size=14)
    assert ours.shape == theirs.shape
    assert ours.shape[2] * ours.shape[3] <= (max(total / 8 * 2, 3136 * 1.05) if total else 448 * 336)


def test_the_pixel_budget_setting_and_a_parts_own(tiny_dirs):
    """model.video_total_pixels reaches the policy (load_policy) and shrinks every video's frames; a part's own
    total_pixels wins over it; a negative budget is a clear error."""
    conv = lambda **extra: [{"role": "user", "content": [  # noqa: E731
        {"type": "video", "video": moving_dot_frames(4), **extra}, {"type": "text", "text": "?"}]}]
    grid = lambda policy, **extra: policy.encode_prompts([conv(**extra)]).vision[0]["video_grid_thw"].tolist()  # noqa: E731
    free = load_policy(str(tiny_dirs["qwen2_5_vl"]), dtype="float32", device="cpu", **BOUNDS)
    tight = load_policy(str(tiny_dirs["qwen2_5_vl"]), dtype="float32", device="cpu", **BOUNDS, video_total_pixels=2048)
    assert tight.video_total_pixels == 2048
    assert grid(free) == [[2, 4, 4]] and grid(tight) == [[2, 2, 2]]  # 4 frames of 64 x 64 -> 1,024 pixels each
    assert grid(free, total_pixels=2048) == grid(tight) and grid(tight, total_pixels=10**6) == grid(free)
    with pytest.raises(ValueError, match="total_pixels is a pixel budget >= 0"):
        grid(free, total_pixels=-1)


def test_a_video_file_is_sampled_at_the_rate(tiny_dirs, tmp_path):
    """A file of 16 frames at 8 fps (2 s) sampled at model.video_fps = 2: 4 frames -> 2 temporal patches, evenly
    spaced (frames 0, 5, 10, 15); Qwen2.5-VL's temporal positions follow the sampled rate."""
    from mmgpg.models.qwen_vl import read_video

    path = tmp_path / "dot.mp4"
    write_video(path, moving_dot_frames(16, (64, 64), 3), 8)
    frames, meta = read_video(str(path), 2.0, 16)
    assert meta["frames_indices"] == [0, 5, 10, 15] and meta["fps"] == 8 and meta["total_num_frames"] == 16
    policy = load_policy(str(tiny_dirs["qwen2_5_vl"]), dtype="float32", device="cpu", **BOUNDS)
    conv = [{"role": "user", "content": [{"type": "video", "video": str(path)}, {"type": "text", "text": "?"}]}]
    vision = policy.encode_prompts([conv]).vision[0]
    assert int(vision["video_grid_thw"][0, 0]) == 2
    assert read_video(str(path), 100.0, 6)[1]["frames_indices"] == [0, 3, 6, 9, 12, 15]  # capped by max_frames


@pytest.mark.parametrize("video, words", [([], "empty list of frames"), (3, "file path, a URL or a list of frames"),
                                          ("/nonexistent/clip.mp4", "does not exist"),
                                          ("https://example.com/clip.mp4", "local video files only"),
                                          ("CORRUPT", "could not read video"),
                                          ("EMPTY", "could not read video"),
                                          ("AUDIO", "no video stream"),
                                          ("NOFRAMES", "no video stream|no frames")])
def test_bad_video_parts_are_clear_errors(tiny_dirs, tmp_path, video, words):
    if video == "CORRUPT":
        video = str(tmp_path / "corrupt.mp4")
        (tmp_path / "corrupt.mp4").write_bytes(b"not a video at all" * 100)
    elif video == "EMPTY":  # a zero-length file
        video = str(tmp_path / "empty.mp4")
        (tmp_path / "empty.mp4").write_bytes(b"")
    elif video == "NOFRAMES":  # a video container whose stream got no frame
        import av

        video = str(tmp_path / "noframes.mp4")
        out = av.open(video, "w")
        stream = out.add_stream("libx264", rate=4)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        out.start_encoding()  # writes the header: the file exists, with a stream and no frame in it
        for packet in stream.encode():
            out.mux(packet)
        out.close()
    elif video == "AUDIO":  # a real media file without a video stream (a codec mmgpg cannot show)
        import av
        import numpy as np

        video = str(tmp_path / "tone.wav")
        with av.open(video, "w") as out:
            stream = out.add_stream("pcm_s16le", rate=8000, layout="mono")
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), dtype=np.int16), format="s16", layout="mono")
            frame.rate = 8000
            for packet in stream.encode(frame):
                out.mux(packet)
    policy = load_policy(str(tiny_dirs["qwen2_vl"]), dtype="float32", device="cpu", **BOUNDS)
    conv = [{"role": "user", "content": [{"type": "video", "video": video}, {"type": "text", "text": "?"}]}]
    with pytest.raises((ValueError, FileNotFoundError), match=words):
        policy.encode_prompts([conv])


@pytest.mark.parametrize("family, interval", [("qwen2_5_vl", 4), ("qwen2_vl", 1)])
def test_text_after_a_video_resumes_after_its_last_temporal_position(tiny_dirs, family, interval):
    """Qwen's M-RoPE rule, by hand: 3 text tokens, a video of 2 temporal patches of 2 x 2 merged tokens, 2 text
    tokens. The video takes temporal 3 + [0, 0, 0, 0, s, s, s, s] with s = tokens_per_second (4) x
    second_per_grid_ts (1 s) for Qwen2.5-VL, 1 for Qwen2-VL, height 3 + [0, 0, 1, 1, ...], width 3 + [0, 1, 0, 1, ...];
    the text after it resumes at the largest of those plus one: 3 + max(s, 1) + 1. Left padding is skipped. An image
    batch gets transformers' own positions."""
    policy = load_policy(str(tiny_dirs[family]), dtype="float32", device="cpu", **BOUNDS)
    model = policy.model.model
    ids = torch.tensor([[0, 5, 5, 5] + [7] * 8 + [5, 5]])
    types = torch.tensor([[0, 0, 0, 0] + [2] * 8 + [0, 0]])
    mask = torch.tensor([[0] + [1] * 13])
    pos, delta = model.get_rope_index(ids, types, video_grid_thw=torch.tensor([[2, 4, 4]]),
                                      second_per_grid_ts=torch.tensor([1.0]) if family == "qwen2_5_vl" else None,
                                      attention_mask=mask)
    s = interval
    assert pos[0, 0, 1:].tolist() == [0, 1, 2] + [3] * 4 + [3 + s] * 4 + [3 + s + 1 + k for k in (0, 1)]
    assert pos[1, 0, 4:12].tolist() == [3, 3, 4, 4] * 2 and pos[2, 0, 4:12].tolist() == [3, 4, 3, 4] * 2
    assert delta.tolist() == [[3 + s + 3 - 13]]
    images = policy.encode_prompts(mixed_video_conversations()[1:2])  # an image beside a video: the video rule
    image_only = policy.encode_prompts([[{"role": "user", "content": [
        {"type": "image", "image": moving_dot_frames(1)[0]}, {"type": "text", "text": "?"}]}]])
    grid = image_only.vision[0]["image_grid_thw"]
    ours = model.get_rope_index(image_only.input_ids, image_only.mm_token_type_ids, image_grid_thw=grid,
                                attention_mask=image_only.attention_mask)
    theirs = type(model).get_rope_index(model, image_only.input_ids, image_only.mm_token_type_ids,
                                        image_grid_thw=grid, attention_mask=image_only.attention_mask)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs)) and "video_grid_thw" in images.vision[0]


def test_the_families_that_take_videos_are_the_qwen_vl_policys():
    """``Family.takes_videos`` (what the vLLM engine's video limit and the frame budget follow) is declared for
    exactly the families of the policy that reads video parts."""
    from mmgpg.models import FAMILIES

    assert {f for f in FAMILIES if FAMILIES[f].takes_videos} == set(QWEN_VL) == \
        {f for f in FAMILIES if FAMILIES[f].policy.endswith(":QwenVLPolicy")}


def test_the_sampled_frames_are_the_files_frames_at_those_indices(tmp_path):
    """A file of 40 frames whose dot sits at column 4 + i in frame i, sampled to 5 frames: each returned frame shows
    the dot where the frame of its index had it (the decode keeps exactly those frames, in order)."""
    import numpy as np

    from mmgpg.models.qwen_vl import read_video

    path = tmp_path / "dot.mp4"
    write_video(path, moving_dot_frames(40, (64, 32), 1), 10)
    frames, meta = read_video(str(path), 1.25, 5)  # 4 s at 10 fps -> 5 frames
    assert meta["frames_indices"] == [0, 10, 20, 29, 39] and meta["total_num_frames"] == 40
    for index, frame in zip(meta["frames_indices"], frames):
        red = np.asarray(frame)[:, :, 0].astype(int) - np.asarray(frame)[:, :, 1].astype(int)
        columns = np.nonzero(red.max(axis=0) > 60)[0]
        assert abs(columns.min() - (4 + index)) <= 1, (index, columns.min())


def test_a_long_video_is_read_in_bounded_memory(tmp_path):
    """3,000 frames of 320 x 240 (about 690 MB as RGB images) sampled to 4: in a fresh process, peak memory grows by
    ~10 MiB while reading it (only the sampled frames are kept; keeping every decoded frame grew it by 0.4-1.5 GiB),
    measured from after the imports."""
    import subprocess
    import sys

    from PIL import Image

    path = tmp_path / "long.mp4"
    frames = [Image.new("RGB", (320, 240), (i % 256, 80, 160)) for i in range(3000)]
    write_video(path, frames, 30)
    del frames
    script = ("import resource, sys; from mmgpg.models.qwen_vl import read_video; import av, numpy, PIL.Image; "
              "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
              "frames, meta = read_video(sys.argv[1], 2.0, 4) if len(sys.argv) > 1 else ([], {}); "
              "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base, len(frames))")
    grown, kept = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True,
                                 check=True).stdout.split()
    assert int(kept) == 4
    assert int(grown) < 100 * 1024, f"peak RSS grew by {int(grown) / 1024:.0f} MiB reading a 3,000-frame video"
