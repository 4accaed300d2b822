"""The configuration schema: one dataclass per section. The string literal under each field is its docstring, the
only place a field is documented (``mmgpg config show --doc`` prints them as comments)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from mmgpg.models import Dtype
from mmgpg.models.lora import LORA_LANGUAGE_TARGETS
from mmgpg.typed import bounded

# --------------------------------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class LoraConfig:
    rank: int = 0
    """LoRA rank r: 0 (the default) trains every weight of the model; r > 0 freezes the model and trains low-rank
    adapters W + (alpha/r) B A (PEFT) on the layers chosen below, plus model.lora.trainable_modules in full."""
    alpha: float = 32.0
    """Adapter scale numerator: the update is (alpha / rank) B A."""
    dropout: float = 0.0
    """Dropout on the adapters' input during the training forward. 0 keeps the scored log-probs exactly those of the
    sampling policy (dropout > 0 makes RL slightly off-policy)."""
    target_modules: list[str] = field(default_factory=lambda: list(LORA_LANGUAGE_TARGETS))
    """Linear layers of the language model that get adapters, by their last name (q_proj, k_proj, v_proj, o_proj,
    gate_proj, up_proj, down_proj: every projection of every decoder layer). The output head is never adapted; train
    it in full with trainable_modules=[lm_head]."""
    vision: bool = False
    """Also put adapters on every linear layer of the vision tower's blocks (attention qkv/proj and MLP)."""
    merger: bool = False
    """Also put adapters on the vision-language merger MLP (model.visual.merger)."""
    trainable_modules: list[str] = field(default_factory=list)
    """Modules trained in full beside the adapters (PEFT modules_to_save), by name or last name: lm_head, merger..."""


@dataclass
class ModelConfig:
    name_or_path: str = "tiny"
    """Policy checkpoint: a Hugging Face hub id (e.g. Qwen/Qwen2-VL-2B-Instruct, or a text-only Qwen2 / Qwen2.5 such as
    Qwen/Qwen2.5-Math-7B), a local directory, or `tiny` / `tiny:qwen2_5_vl` / `tiny:qwen2` (text-only) for a
    ~1M-parameter model that mmgpg builds offline and caches in ~/.cache/mmgpg."""
    dtype: Dtype = "auto"
    """Parameter dtype; `auto` is bfloat16 on a GPU that supports it, float32 otherwise."""
    attn_implementation: str = "sdpa"
    """transformers attention backend: sdpa, eager or flash_attention_2 (the latter needs flash-attn on a GPU)."""
    min_pixels: int = bounded(3136, ge=1, why="Images need a positive area.")
    """Smallest image area after resizing, in pixels (3136 = 56*56 = 4 visual tokens). Same value in rollout and training."""
    max_pixels: int = 401408
    """Largest image area after resizing, in pixels; 401408 = 512*28*28 = at most 512 visual tokens (the GPG scripts)."""
    max_prompt_length: int = bounded(1024, ge=1, why="Prompts need at least one token.")
    """Longest prompt in tokens, image tokens included. A longer prompt is an error, never silently truncated."""
    logprob_chunk_size: int = bounded(1024, ge=1, why="Chunks need at least one token.")
    """Completion tokens scored per chunk; peak log-prob memory is about chunk x vocab x 4 bytes x 3."""
    packed_sequences: Literal["auto", "always", "never"] = "auto"
    """Score the update's rows without padding, packed into one sequence per micro-batch (text-only policies):
    always, never, or auto = always with attn_implementation=flash_attention_2 (its varlen kernel makes attention cost the sum of
    the rows' squared lengths). With sdpa/eager a packed row needs a block mask over the whole packed length, so
    auto does not pack there; micro-batches are then length-grouped and trimmed to their longest row."""
    video_fps: float = bounded(2.0, gt=0, why="Frames are sampled at a positive rate.")
    """Video parts (Qwen-VL families): a video file is sampled at this many frames per second (qwen-vl-utils' default,
    2); for a list of frames, the rate they were taken at (Qwen3-VL's timestamps, Qwen2.5-VL's temporal positions).
    A part's own `fps` wins."""
    video_max_frames: int = bounded(16, ge=2, why="Qwen-VL encodes frames in pairs (temporal patch 2).")
    """Video parts: at most this many frames per video (a longer file or frame list is sampled evenly); each frame is
    resized within min_pixels .. max_pixels like an image, so a video costs about frames / 2 x an image's tokens."""
    video_total_pixels: int = bounded(0, ge=0, why="A pixel budget; 0 is qwen-vl-utils' default.")
    """Video parts: one video's pixel budget over its frames (qwen-vl-utils' `total_pixels`): each frame keeps at most
    min(max_pixels, max(video_total_pixels / frames x 2, 1.05 x min_pixels)) pixels, so a long video gets smaller
    frames instead of overrunning max_prompt_length. 0: qwen-vl-utils' default, 128,000 tokens' worth x 0.9
    (90,316,800 pixels at a 14-pixel patch), which caps no frame of a 16-frame video. A part's own `total_pixels` wins."""
    encode_images_once: bool = True
    """Run the vision tower once per prompt and share the features among its group_size completions when scoring."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters (rank 0: off). GRPO's reference is then the model with its adapter switched off."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra variables for the checkpoint's chat template, in every prompt it renders (training, evaluation, both
    engines), e.g. `model.chat_template_kwargs.enable_thinking=false` for Qwen3 / Qwen3.5 without thinking. A
    variable the template does not read changes nothing."""


@dataclass
class RolloutConfig:
    group_size: int = bounded(8, ge=1, why="Each prompt needs at least one completion.")
    """Completions sampled per prompt (G in the papers)."""
    max_new_tokens: int = bounded(256, ge=1, why="Completions need at least one token.")
    """Longest completion in tokens; a completion cut here has no EOS and counts as truncated."""
    temperature: float = 1.0
    """Sampling temperature (> 0; training needs different completions per prompt). Log-probs are scored at the
    same temperature. Evaluation decodes greedily on its own."""
    top_p: float = bounded(1.0, gt=0, le=1, why="top_p is a probability mass in (0, 1].")
    """Nucleus sampling mass; 1.0 keeps the full distribution (exactly on-policy)."""
    top_k: int = bounded(0, ge=0, why="top_k counts tokens (0 disables it).")
    """Keep only the k most likely tokens; 0 disables it (exactly on-policy). The GPG authors' code sampled with 50."""
    engine: str = "hf"
    """Rollout engine that generates completions (training, evaluation, `mmgpg sample`): hf = Hugging Face generate
    with the policy's own weights; vllm = vLLM, weights synced after every optimizer step (docs/install.md)."""
    vllm_server: str = ""
    """URL of a running `mmgpg vllm-serve` (http://127.0.0.1:PORT); empty = one vLLM engine in each trainer process."""
    vllm_server_timeout: float = 600.0
    """Seconds to wait for the vLLM server's health check at start-up and for each of its replies."""
    vllm_sync_dir: str = ""
    """Server mode: folder both processes see for the weights of each sync; empty = a new one under /dev/shm."""
    vllm_sync_channel: Literal["dist", "ipc", "files"] = "dist"
    """Server mode: how each sync reaches the server. dist = trainer rank 0 broadcasts the weights over a
    process group of its own with the server: NCCL when the weights and the server are on two GPUs (the buckets stay
    on the devices), gloo through host memory when either is on the CPU; ipc = CUDA IPC handles of the buckets, for
    a trainer and server sharing one GPU; files = a safetensors file in rollout.vllm_sync_dir, reloaded by the
    server. NCCL and IPC have not run on a GPU yet (docs/distributed.md, "vLLM weight sync")."""
    vllm_sync_bucket_mb: float = 256.0
    """Most MiB of weights per transfer of a sync (one vLLM load call; one broadcast in server mode): bounds the extra
    memory a sync needs on both sides."""
    vllm_dtype: Dtype = "auto"
    """Weights dtype inside vLLM (colocated): auto = bfloat16 under mixed precision, else the policy's own dtype."""
    vllm_max_model_len: int = 0
    """Longest prompt + completion vLLM accepts; 0 = model.max_prompt_length + rollout.max_new_tokens."""
    vllm_gpu_memory_utilization: float = 0.3
    """Fraction of GPU memory vLLM may take (weights + KV cache) beside training; ignored on CPU."""
    vllm_tensor_parallel_size: int = 1
    """GPUs one colocated vLLM engine shards the model over."""
    vllm_max_images: int = 4
    """Most images in one prompt vLLM accepts (limit_mm_per_prompt)."""
    vllm_max_videos: int = bounded(1, ge=0, why="A number of videos per prompt.")
    """Most videos in one prompt vLLM accepts (limit_mm_per_prompt), for the families whose policy takes videos (the
    Qwen-VL line; others get 0). A server takes its own `mmgpg vllm-serve --max-videos`."""
    max_staleness: int = bounded(0, ge=0, why="A number of weight versions (0: synchronous).")
    """Rollouts that overlap the update: the engine samples the batches of the next steps while the current one
    updates, each batch with weights at most this many optimizer steps old (batch b with version max(start, b - K);
    no sample is dropped for being slow). 0: today's synchronous loop. Needs the vLLM server engine
    (rollout.engine=vllm with rollout.vllm_server). Pair it with algo.rollout_correction (e.g. token_tis)."""
    vllm_sleep: bool = False
    """Colocated on GPU: vLLM sleeps (weights offloaded, KV cache freed) during the update; no effect on CPU."""
    logprob_check: bool = True
    """Post-sync check (vllm): log |engine - trainer| log-prob of the sampled tokens each step, stop above the limits."""
    logprob_check_mean: float | None = None
    """Limit on the step's mean |difference| (> 0); null = 1e-3 when both sides run float32, else 5e-2."""
    logprob_check_max: float | None = None
    """Limit on the largest |difference| of one token (> 0); null = logged, not checked."""


@dataclass
class AlgoConfig:
    name: str = "gpg"
    """A label for logs and run names; the fields below define the algorithm (configs/algo/*.yaml set them together)."""
    advantage: str = "group_mean"
    """group_mean: r - mean (GPG, F_norm = 1); group_zscore: (r - mean)/(std + std_eps) (GRPO); group_stabilized:
    (r - mean)/sqrt(var + std_eps) (Mroueh's stabilised whitening); rloo: r - mean of the other G-1 samples;
    reinforce_pp: (r - mu)/sqrt(var + std_eps) with the mean and variance of the whole step's batch (all ranks, every
    token counted); reinforce_pp_baseline: the same whitening of r - group mean (REINFORCE++-baseline)."""
    std_eps: float = bounded(1e-4, ge=0)
    """The epsilon of group_zscore (added to the std), of group_stabilized and of reinforce_pp* (added to the
    variance)."""
    token_loss: str = "reinforce"
    """reinforce: -A log pi (GPG); clipped_ratio: the PPO/GRPO clipped surrogate with clip_eps (and clip_eps_high:
    DAPO's clip-higher); gspo / gspo_token: GSPO's length-normalised sequence ratio, clipped per sequence (its token
    variant); cispo: -sg[min(ratio, 1 + clip_eps_high)] A log pi (CISPO)."""
    clip_eps: float = bounded(0.2, gt=0, why="The clip range must be > 0.")
    """Clip range of clipped_ratio, gspo and gspo_token: the ratio is clipped to [1 - clip_eps, 1 + clip_eps_high].
    Only acts when updates_per_batch > 1 (with one update the ratio is exactly 1)."""
    clip_eps_high: float | None = None
    """Upper clip range of clipped_ratio, gspo and gspo_token (null: clip_eps, symmetric; DAPO 0.28, GSPO 4e-4), and
    CISPO's cap on its weight, 1 + clip_eps_high (needed by cispo: 4.0). Needs updates_per_batch > 1 to act."""
    cispo_eps_low: float | None = None
    """CISPO's lower bound on its weight, 1 - cispo_eps_low (null: none, as MiniMax-M1 and TRL; verl clips both)."""
    dual_clip: float | None = None
    """Dual-clip PPO's C for clipped_ratio (verl's clip_ratio_c, on by default there with 3.0): a token with a negative
    advantage adds at most -C x A to the loss, so a ratio above C stops pushing (> 1; needs updates_per_batch > 1).
    null: off, as the GRPO and DAPO papers and TRL."""
    rollout_correction: str = "none"
    """Importance weights against the log-probs the rollout engine sampled with (its behaviour policy: vLLM's own
    kernels and precision, or the HF engine's nucleus), multiplied into every algorithm's per-token loss, detached:
    none; token_tis: min(ratio, bound) per token (truncated IS, Yao et al. 2025); seq_tis: min(sequence ratio,
    bound); seq_mis: the sequence ratio, or 0 above the bound (masked IS, Liu, Li et al. 2025). The ratio is the
    trainer's log-prob at the weights the update starts from minus the engine's. Logged as rollout_is/*."""
    rollout_correction_bound: float = bounded(2.0, gt=1, why="The bound C truncates or masks ratios above it; at "
                                              "C <= 1 every sample would be cut down (TIS papers: C = 2).")
    """C of algo.rollout_correction (> 1)."""
    kl_coef: float = bounded(0.0, ge=0, why="A KL weight is >= 0 (GPG: 0, GRPO: 0.04).")
    """Weight of the KL penalty to a frozen reference policy (GRPO: 0.04). A reference model exists only when > 0."""
    kl_estimator: str = "k3"
    """Per-token KL estimator differentiated in the loss: k3 (TRL/GRPO; forward-KL gradient KL(ref||pi)), k2 (1/2
    (log ratio)^2; reverse-KL gradient KL(pi||ref), the success-amplification paper's objective), k1 (log ratio; zero
    expected gradient)."""
    aggregation: str = "seq_mean_token_mean"
    """How token losses become one number: token_mean (GPG paper: sum / all tokens), seq_mean_token_mean (GPG
    multimodal code: mean over sequences of per-sequence token means), constant_length (Dr. GRPO: sum / (sequences x
    rollout.max_new_tokens)). Denominators count the whole optimizer step, all ranks."""
    alpha_correction: bool = True
    """Multiply the policy loss by alpha = B/(B-M) (B samples in the update, M of them in zero-variance groups)."""
    min_valid_fraction: float = bounded(0.4, ge=0, le=1,
                                        why="It is a fraction of samples in [0, 1] (0 disables resampling).")
    """beta_th: draw more prompts while the valid fraction (B-M)/B of the update is below this; 0 disables resampling."""
    max_resample_attempts: int = bounded(20, ge=1, why="At least one rollout is needed.")
    """Most rollout attempts per step (the first included); after the last one the step proceeds with what it has."""
    zero_variance_tol: float = bounded(0.0, ge=0, why="A tolerance is >= 0.")
    """A group has zero variance when max(r) - min(r) <= this (0: exactly equal rewards)."""
    drop_zero_variance: bool = False
    """Leave zero-variance groups out of the update instead of filling it with them (DAPO's dynamic sampling, with
    min_valid_fraction 1): the update holds the informative groups only, fewer than train.prompts_per_step when the
    attempts run out, and B and the token counts of the denominators count those only."""
    overlong_buffer_fraction: float = 0.0
    """DAPO's soft overlong punishment (eq. 13): L_cache = round(this x L_max), L_max = rollout.max_new_tokens (DAPO:
    4096 of 20480 = 0.2). A completion longer than L_max - L_cache tokens gets (L_max - L_cache - L)/L_cache added to
    its reward (down to -1) before the advantages; zero-variance groups are judged on the task's reward alone (DAPO
    filters on accuracy). 0: off."""
    overlong_filter: bool = False
    """DAPO's overlong filtering: completions cut at rollout.max_new_tokens (no EOS) add nothing to the loss, and
    their tokens are left out of the token counts of the denominators (TRL's mask_truncated_completions)."""
    updates_per_batch: int = bounded(1, ge=1, why="At least one update per batch.")
    """Optimizer steps per rollout batch (GRPO's mu). Above 1, old log-probs are computed once and the ratio clips."""


@dataclass
class TrainConfig:
    max_steps: int = bounded(100, ge=1)
    """Optimizer steps (a step skipped because no group had signal still counts)."""
    backend: str = "plain"
    """Training backend: plain = a full model copy per process, AdamW, gradients summed over ranks by all-reduce;
    deepspeed = DeepSpeed ZeRO (train.zero_stage), the same update as plain (needs `pip install 'mmgpg[deepspeed]'`)."""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage (train.backend=deepspeed): 0 = data parallel, 1 = optimizer state partitioned over ranks,
    2 = and gradients, 3 = and parameters (gathered layer by layer in every forward)."""
    offload_optimizer: bool = False
    """DeepSpeed: keep the optimizer state and step on the CPU (ZeRO stage 1-3; DeepSpeed's CPU Adam, built with g++)."""
    offload_params: bool = False
    """DeepSpeed ZeRO stage 3 only: keep the partitioned parameters in CPU memory between uses."""
    deepspeed_config: str | None = None
    """Optional DeepSpeed JSON merged into what mmgpg derives (ZeRO bucket sizes, communication options, ...); a key
    that mmgpg sets from its own config (stage, offload, clipping, bf16, batch sizes, optimizer) must agree or be
    "auto"."""
    prompts_per_step: int = bounded(8, ge=1)
    """Prompt groups in one optimizer step, over all ranks (must be divisible by the number of ranks)."""
    micro_batch_prompts: int = bounded(2, ge=1)
    """Prompt groups per forward/backward pass (gradient accumulation with global denominators)."""
    learning_rate: float = bounded(1e-6, gt=0)
    """AdamW learning rate (the GPG paper uses 1e-6)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW (beta1, beta2)."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float = bounded(1.0, ge=0, why="It must be >= 0 (0 disables clipping).")
    """Clip the global gradient norm to this; 0 disables clipping."""
    lr_scheduler: Literal["constant", "linear", "cosine", "cosine_with_min_lr"] = "constant"
    """Learning-rate schedule after warmup (transformers.get_scheduler; constant is HF's constant_with_warmup;
    cosine_with_min_lr stops at min_lr_rate)."""
    warmup_steps: int = bounded(0, ge=0)
    """Linear warmup steps."""
    min_lr_rate: float = 0.0
    """cosine_with_min_lr only: the final learning rate as a fraction of learning_rate (open-rs uses 0.1)."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory (transformers' gradient checkpointing)."""
    freeze_vision: bool = False
    """Keep the vision tower's weights fixed (no gradients, not in the optimizer)."""
    split: str = "train"
    """Task split to train on."""
    max_nonfinite_steps: int = bounded(3, ge=0)
    """Optimizer steps whose gradient norm is NaN/Inf are skipped (no update; counted as train/nonfinite_steps);
    after more than this many in a row, training stops with an error. 0: stop at the first."""
    save_every: int = bounded(50, ge=0)
    """Save a checkpoint every N steps (0: only at the end and on SIGTERM/SIGINT). The default bounds what a crash
    (a bad data row, a lost node) can cost to 50 steps; keep_last bounds the disk used."""
    keep_last: int = bounded(2, ge=1)
    """Intact checkpoints kept; older ones are deleted after a new one is complete (a damaged one is not counted)."""
    resume: bool = False
    """Continue from the newest complete, intact checkpoint in output_dir (metrics after it are rewritten; without a
    checkpoint the run starts over and earlier logs move to abandoned-<time>/)."""
    resume_config: Literal["refuse", "new"] = "refuse"
    """On resume with a config that differs from the checkpoint's: refuse (list the keys) or apply the new values
    (recorded in config_changes.jsonl). Logging and saving keys may always change."""
    tensorboard: bool = True
    """Write TensorBoard scalars to output_dir/tensorboard."""
    wandb: bool = False
    """Also log to Weights & Biases (needs `pip install wandb`)."""
    wandb_project: str = "mmgpg"
    """W&B project name."""
    progress: bool = True
    """Show a progress bar (rank 0). When stdout is not a terminal (SLURM, nohup, a pipe), where a bar would print
    nothing until the run ends, print a plain status line every ``status_every_s`` seconds instead."""
    status_every_s: float = bounded(60.0, ge=0, why="It must be a number of seconds >= 0 (0: no status lines).")
    """With ``progress`` on and stdout not a terminal: seconds between status lines (step, reward, valid fraction,
    α, s/step, ETA, memory); the first step and the last always print one. 0: none."""
    eval_every: int = bounded(0, ge=0)
    """Greedy evaluation on eval_split every N steps, logged as eval/<metric> (0: never)."""
    eval_split: str = "test"
    """Task split for evaluations during training."""
    eval_limit: int = bounded(200, ge=0)
    """Evaluate on the first N items of eval_split (0: all)."""
    eval_samples: int = 0
    """Also sample this many completions per eval item at rollout.temperature and log their mean scores as
    eval/sampled_<metric> (0: greedy only)."""
    probe_every: int = bounded(0, ge=0)
    """Probe per-prompt success every N steps and at step 0 (p_ref): train.probe_samples completions for each of
    the first train.probe_limit training prompts at the rollout's settings, appended to probe_success.jsonl for
    `mmgpg diagnose` (0: never; `mmgpg probe` does the same for any checkpoint afterwards)."""
    probe_samples: int = bounded(64, ge=1)
    """Completions per prompt of each probe (train.probe_every)."""
    probe_limit: int = bounded(64, ge=0)
    """Training prompts each probe covers, the first N of the split (0: all)."""


@dataclass
class SftConfig:
    max_steps: int = bounded(200, ge=1)
    """Optimizer steps of supervised fine-tuning on the task's gold completions."""
    batch_size: int = bounded(32, ge=1)
    """Examples per step."""
    learning_rate: float = bounded(1e-5, gt=0)
    """AdamW learning rate (the CPU demo uses 1e-3 on the tiny model)."""
    max_grad_norm: float = 1.0
    """Clip the gradient norm to this; 0 disables clipping."""
    weight_decay: float = 0.01
    """AdamW weight decay of supervised fine-tuning."""
    eval_every: int = bounded(0, ge=0)
    """Greedy evaluation every N steps, logged as eval/<metric> (0: only at the end)."""
    save_every: int = bounded(50, ge=0)
    """Save a checkpoint every N steps (0: only at the end and on SIGTERM/SIGINT); train.resume=true continues from
    the newest one and train.keep_last bounds how many are kept, as for `mmgpg train`."""


@dataclass
class TaskConfig:
    name: str = "shapes"
    """Task plugin: a registered name (`mmgpg tasks` lists them) or `path/to/file.py:ClassName`."""
    options: dict[str, Any] = field(default_factory=dict)
    """Task-specific options, written flat under `task:` (e.g. `task.num_train=500`); each task documents its own."""
    # The flat-options convention: keys under `task:` other than `name` belong to the task plugin.
    _open_field: ClassVar[str] = "options"


@dataclass
class DataConfig:
    on_bad_row: Literal["error", "skip"] = "error"
    """A data row that cannot be used (bad JSON, wrong field types, a damaged or missing image): stop with a message
    naming file, row and field (error), or skip it, warn and count it (skip: data/skipped_rows in metrics.jsonl)."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model and its image preprocessing."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """The task: its prompts, images and rewards."""
    data: DataConfig = field(default_factory=DataConfig)
    """What to do with bad data rows."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How completions are sampled."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """The RL algorithm: advantages, losses, alpha and resampling (defaults: GPG as in the multimodal reference)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimisation, checkpoints and logging of `mmgpg train`."""
    sft: SftConfig = field(default_factory=SftConfig)
    """Supervised fine-tuning (`mmgpg sft`), the paper's +SFT baseline and the demo's warm start."""
    output_dir: str = ""
    """Run directory; empty means runs/<command>-<YYYYmmdd-HHMMSS>. The resolved config is saved there as config.yaml."""
    seed: int = 0
    """Seed for Python, NumPy and torch (CPU and GPU) RNGs: 0 to 2^32 - 1 (NumPy and vLLM take 32-bit seeds)."""
    device: str = "auto"
    """Torch device: auto (cuda:LOCAL_RANK when a GPU exists, else cpu), cpu, cuda, cuda:1, ..."""
