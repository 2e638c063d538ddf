"""BaseConfig: the fields every run has. Experiments subclass it.

Experiment files define `Config(BaseConfig)` (frozen) with the paper's
defaults, and `PAPER`, a dict of overrides for `--scale=paper` (built on
`PAPER_COMMON`). Every field is also a command-line flag
(rlreason/train/flags.py). Only bool / int / float / str fields: lists are
comma-separated strings.
"""

import dataclasses
from typing import ClassVar

# Compute / parameter dtypes a run may name.
DTYPES = ("float32", "bfloat16", "float16")
# The model's choices, named here so this module imports no JAX; a test
# keeps them equal to attention.DECODE_IMPLEMENTATIONS, transformer's remat
# policies and tokenizer.TEMPLATES.
DECODE_ATTENTIONS = ("auto", "dense", "ragged")
ROLLOUT_LAYOUTS = ("auto", "replicated", "fsdp")  # mesh.ROLLOUT_LAYOUTS
REMAT_POLICIES = ("full", "dots", "offload")
TEMPLATES = ("plain", "r1", "boxed", "chat")


def require(ok: bool, message: str) -> None:
  """An experiment's validate(): 'Invalid config: message' unless ok (a
  usage error: exit 2, before any compute)."""
  if not ok:
    raise ValueError(f"Invalid config: {message}")


class ConfigError(ValueError):
  """A usage error: a flag out of range, a path that cannot be used, a
  prompt over the budget. Experiments exit with code 2 on it."""


# What every paper-scale run shares, whatever the paper: a pretrained
# checkpoint (no tiny warm start), math answers in \boxed{} checked by
# math-verify, no learning-rate warm-up, AdamW's beta2 0.999, bfloat16
# compute with rematerialised layers, FSDP over every device, TensorBoard. An
# experiment's PAPER starts from it and lists only its paper's values:
#   PAPER = dict(config.PAPER_COMMON, model=..., data=..., lr=1e-6, ...)
# (keyword arguments win, e.g. template="chat" or warmup_steps=20).
PAPER_COMMON = dict(
  warm_start_steps=0,
  template="boxed",
  reward="math",
  warmup_steps=0,
  dtype="bfloat16",
  remat=True,
  mesh_fsdp=-1,
  tensorboard=True,
  # torch.optim.AdamW's betas (0.9, 0.999), which verl, OpenRLHF and TRL
  # keep; the laptop runs keep BaseConfig's 0.99.
  adam_b2=0.999,
)


@dataclasses.dataclass(frozen=True)
class BaseConfig:
  """Fields every RL run has. Defaults are the laptop-scale embedded run."""

  # An experiment's fields that name another model (a teacher, a judge):
  # {field: (its keywords, whether an RL run's workdir is taken too)}.
  # Each comma-separated item that is not a keyword or a preset must be a
  # directory that loads (train/preflight.py), checked before any compute.
  model_fields: ClassVar[dict[str, tuple[tuple[str, ...], bool]]] = {}
  # Fields added with a default that changed what a run does: {field: the
  # value that gives the behaviour of before it existed}. A run recorded
  # without the field ran so (run_info.differences: not reused as a run of
  # the new default). Each class lists its own; subclasses inherit them.
  absent_means: ClassVar[dict[str, object]] = {}

  # What to train.
  model: str = "tiny"  # preset name or a local HF checkpoint directory
  tokenizer: str = ""  # "" = "char" for presets, the model dir for HF dirs
  # Start from this policy instead of --model's (its architecture and
  # tokenizer too): another RL run's workdir (its latest checkpoint; local
  # or gs://) or one of its checkpoints/<step>, or a Hugging Face directory
  # (a warm start's cache, an export); "" = --model.
  init_from: str = ""
  # The prompts: task:NAME[:difficulty=1-3,n=...], hf:REPO[:config=...],
  # or a .jsonl / .json / .parquet file or folder, with field options
  # (the grammar: rlreason/data/sources.py).
  data: str = "task:arithmetic"
  eval_data: str = ""  # evaluation prompts, as --data; "" = its held-out split
  # How a question becomes a prompt (model/tokenizer.py): plain | r1 |
  # boxed | chat (the tokenizer's chat template).
  template: str = "plain"
  reward: str = "task"  # reward function by name (rlreason/rewards: names())

  # Supervised warm start (rlreason/train/sft.py), cached under cache_dir.
  warm_start_steps: int = 0  # supervised steps before RL; 0 = none
  warm_start_lr: float = 3e-3  # the warm start's learning rate
  warm_start_batch_size: int = 64  # the warm start's demonstrations per step
  warm_start_noise: float = 0.0  # fraction of off-by-one demonstrations
  # Fraction of demonstrations shown with a hint before the question
  # (sft.encode_pairs): the warm start learns to read guidance, as an
  # instruction-tuned model can; for the hint-guided methods.
  warm_start_hints: float = 0.0
  cache_dir: str = "workdirs/cache"  # warm starts, compiled programs, data
  # XLA's compiled programs kept across processes (JAX's persistent
  # compilation cache), so a resumed or repeated run loads its train step
  # and sampler instead of compiling them again (a 7B train step takes ~2
  # minutes to compile for a TPU slice): auto = <cache_dir>/xla, or
  # JAX_COMPILATION_CACHE_DIR where that is set; off; or a directory (local
  # or gs://). Programs that took under a second to compile are not kept
  # (JAX's default).
  compile_cache: str = "auto"

  # Scale of the run.
  scale: str = "laptop"  # laptop | paper (the experiment's PAPER overrides)
  steps: int = 100  # RL steps: a rollout and its updates each
  batch_size: int = 16  # B prompts per step
  group_size: int = 8  # G completions per prompt
  max_prompt_len: int = 64  # prompt budget in tokens (P's cap)
  max_new_tokens: int = 64  # completion budget in tokens (T)
  # Prompts over max_prompt_len: an error naming file and row (False), or
  # cut to their last max_prompt_len tokens and counted (True).
  truncate_prompts: bool = False
  # Rows of the prompt set checked before any compute; 0 = all of them.
  validate_rows: int = 0

  # Sampling.
  temperature: float = 1.0  # the rollouts' sampling temperature
  top_p: float = 1.0  # nucleus: sample within this probability mass; 1 = off
  top_k: int = 0  # sample among the k likeliest tokens; 0 = off
  # Sequences per sampler call (rollout.generate; multi-turn episodes and
  # tree rollouts too, a tree's prompt counting its leaves and its roots'
  # cache copy): 0 sizes calls from the devices' free memory (all N where
  # the backend reports none); more than that estimate holds is taken up
  # to 2.5 times its room (rollout_memory.call_rows, ESTIMATE_OVERCOUNT).
  rollout_rows: int = 0
  # continuous: when the N rows are more than --rollout_rows (or what memory
  # holds), those are decode slots refilled as rows finish
  # (sampling/continuous.py); static: calls of that many rows, each decoded
  # until its longest row stops. The samples are the same.
  rollout_batching: str = "continuous"
  # A decode step's attention (model/attention.py): dense reads every cache
  # slot of every row; ragged, each row's filled slots only (the Pallas GPU
  # decode kernel; not on TPU); auto, ragged on CUDA GPUs of compute
  # capability >= 8.0 and dense elsewhere (attention.resolve_decode).
  decode_attention: str = "auto"
  # The sampler's parameters over the mesh (mesh.rollout_rules): auto
  # replicates them over data / fsdp where they take at most 40% of a
  # device's memory, else splits them as training does; replicated or fsdp
  # choose (fsdp: room for more rows per call, a weight all-gather per
  # decode step; the planner sets it where only it fits).
  rollout_layout: str = "auto"
  # The sampler's own tensor split (mesh.rollout_mesh): 0 samples on the
  # run's mesh; N > 0 on its devices as (data, rest, N), the weights split
  # N ways and replicated over the rest (resharded from the train layout
  # once per rollout). For a model that trains over fsdp alone (no
  # --mesh_tensor) but whose replicas would not fit one device: without
  # it, its rollout all-gathers the weights every decode step.
  rollout_tensor: int = 0

  # Optimisation.
  lr: float = 1e-3  # peak learning rate (AdamW)
  # Linear learning-rate warm-up over this many optimizer updates (a step
  # makes ppo_epochs x minibatches); verl's lr_warmup_steps count steps.
  warmup_steps: int = 0
  schedule: str = "constant"  # constant | cosine (decay after the warm-up)
  weight_decay: float = 0.0  # AdamW's decoupled weight decay
  adam_b1: float = 0.9  # Adam's first-moment decay
  adam_b2: float = 0.99  # Adam's second-moment decay
  grad_clip: float = 1.0  # clip gradients to this global norm; 0 = off
  ppo_epochs: int = 1  # passes over each rollout batch
  minibatches: int = 1  # optimizer steps per epoch
  micro_batches: int = 1  # gradient accumulation within a minibatch

  # Numerics and parallelism.
  dtype: str = "float32"  # compute dtype (bfloat16 on accelerators)
  param_dtype: str = "float32"  # the parameters' (master weights') dtype
  # The single-turn sampler's compute dtype (rollout.generate); "" = dtype.
  # bfloat16 with an fp32 trainer is the rollout / trainer precision split
  # of the peers' engines (objective.PGConfig.rollout_correction).
  rollout_dtype: str = ""
  # Recompute each layer's activations in the backward pass instead of
  # keeping them (less memory, about a third more compute).
  remat: bool = False
  remat_policy: str = "full"  # full | dots | offload (model/transformer.py)
  # Split the residual stream's tokens over the tensor axis between layers
  # (ModelConfig.sequence_parallel): 1/--mesh_tensor of the saved inputs.
  sequence_parallel: bool = False
  # Run the layers as one lax.scan (ModelConfig.scan_layers): XLA compiles
  # one layer instead of n_layers (a 64-layer model's compile time and
  # host memory), the same numbers.
  scan_layers: bool = False
  # TPU: libtpu's bound on the train step's temporaries, in MiB (0 = none).
  # Its scheduler otherwise keeps more live when HBM allows; the planner
  # (experiments/plan.py) says what a run that needs it should pass.
  train_temp_budget_mib: int = 0
  # The same bound on the sampler's temporaries (single-turn rollouts).
  rollout_temp_budget_mib: int = 0
  # And on the whole-rollout forwards' (reference / old log-probs, critic
  # values, a teacher's or reward model's scores: Context.scoring).
  score_temp_budget_mib: int = 0
  # LoRA (model/lora.py): rank 0 = full fine-tuning. Otherwise only rank-r
  # adapters on --lora_targets (attention | mlp | all) are trained, scaled
  # by alpha / r, over a frozen base held in the compute dtype or
  # quantised (--lora_quantize int8 | nf4: QLoRA); the KL reference is
  # that base.
  lora_rank: int = 0
  lora_alpha: float = 32.0  # LoRA's scale numerator (alpha / rank)
  lora_targets: str = "all"  # attention | mlp | all: weights with adapters
  lora_quantize: str = ""  # the frozen base: "" (compute dtype), int8, nf4
  # The device mesh (mesh.py): data-parallel replicas x FSDP (parameters,
  # gradients and optimizer state split) x tensor parallel (each layer's
  # weights split).
  mesh_data: int = 1
  mesh_fsdp: int = -1  # the mesh's FSDP size; -1 = all remaining devices
  mesh_tensor: int = 1  # the mesh's tensor-parallel size
  # One process per host, joined by jax.distributed.initialize() (also
  # RLREASON_MULTIHOST=1; launch/tpu.sh sets it).
  multihost: bool = False

  # Bookkeeping.
  workdir: str = ""  # "" = workdirs/<experiment>
  seed: int = 0  # initialisation, data order, warm start and sampling
  log_every: int = 1  # print a metrics line every this many steps
  eval_every: int = 0  # evaluate every this many steps; 0 = before and after
  eval_size: int = 64  # evaluation problems
  eval_samples: int = 1  # samples per eval problem (greedy if 1)
  eval_max_new_tokens: int = 0  # eval completion budget; 0 = max_new_tokens
  checkpoint_every: int = 50  # checkpoint every this many steps (and last)
  keep_checkpoints: int = 2  # the latest checkpoints kept
  # Write checkpoints in the background once the state is on the host.
  async_checkpoint: bool = True
  # Stop with a checkpoint (exit 75, as SIGTERM) once the run has gone on
  # this long, e.g. within a notebook's or a reservation's time limit;
  # 0 = no limit. The same command resumes, with a limit of its own.
  stop_after_hours: float = 0.0
  tensorboard: bool = True  # TensorBoard events in the workdir
  wandb_project: str = ""  # also log to this Weights & Biases project
  # Resume a workdir whose config.json differs in more than
  # run_info.RESUMABLE_CHANGES (recorded in config_changes.jsonl).
  allow_config_change: bool = False

  @property
  def num_sequences(self) -> int:
    """N = B * G."""
    return self.batch_size * self.group_size

  def model_settings(self) -> dict:
    """The run's transformer.ModelConfig fields beside its dtypes."""
    return dict(
      remat=self.remat,
      remat_policy=self.remat_policy,
      sequence_parallel=self.sequence_parallel,
      scan_layers=self.scan_layers,
    )

  def validate(self) -> None:
    """Fails fast, with the flag names, on contradictory settings.

    Every problem is reported at once, one line each (ConfigError).
    """
    problems = []

    def check(ok, msg):
      if not ok:
        problems.append(msg)

    def at_least(name, low):
      value = getattr(self, name)
      check(value >= low, f"--{name}={value} must be >= {low}")

    check(
      self.scale in ("laptop", "paper"),
      f"--scale={self.scale!r}; expected laptop or paper",
    )
    for name in ("steps", "warm_start_steps", "warmup_steps"):
      at_least(name, 0)
    for name in (
      "batch_size",
      "group_size",
      "max_new_tokens",
      "max_prompt_len",
      "warm_start_batch_size",
      "log_every",
      "eval_size",
      "eval_samples",
      "keep_checkpoints",
    ):
      at_least(name, 1)
    for name in (
      "eval_every",
      "checkpoint_every",
      "eval_max_new_tokens",
      "validate_rows",
      "top_k",
      "rollout_rows",
      "lora_rank",
    ):
      at_least(name, 0)
    check(
      self.lora_targets in ("attention", "mlp", "all"),
      f"--lora_targets={self.lora_targets!r}; expected attention, mlp or all",
    )
    check(
      self.lora_quantize in ("", "int8", "nf4"),
      f"--lora_quantize={self.lora_quantize!r}; expected '', int8 or nf4",
    )
    check(
      self.lora_rank > 0 or not self.lora_quantize,
      f"--lora_quantize={self.lora_quantize} quantises LoRA's frozen base: "
      "it needs --lora_rank > 0",
    )
    check(self.lora_alpha > 0, f"--lora_alpha={self.lora_alpha} must be > 0")
    check(self.temperature >= 0, f"--temperature={self.temperature} < 0")
    for name in ("warm_start_noise", "warm_start_hints"):
      value = getattr(self, name)
      check(0 <= value <= 1, f"--{name}={value} not in [0, 1]")
    check(0 < self.top_p <= 1, f"--top_p={self.top_p} not in (0, 1]")
    for name in (
      "lr",
      "warm_start_lr",
      "weight_decay",
      "grad_clip",
      "stop_after_hours",
    ):
      value = getattr(self, name)
      check(value >= 0, f"--{name}={value} must be >= 0")
    for name in ("adam_b1", "adam_b2"):
      value = getattr(self, name)
      check(0 <= value < 1, f"--{name}={value} not in [0, 1)")
    check(
      self.schedule in ("constant", "cosine"),
      f"--schedule={self.schedule!r}; expected constant or cosine",
    )
    for name in ("dtype", "param_dtype"):
      value = getattr(self, name)
      check(value in DTYPES, f"--{name}={value!r}; expected one of {DTYPES}")
    check(
      self.rollout_dtype in ("",) + DTYPES,
      f"--rollout_dtype={self.rollout_dtype!r}; expected '' (= --dtype) or "
      f"one of {DTYPES}",
    )
    check(
      self.rollout_batching in ("static", "continuous"),
      f"--rollout_batching={self.rollout_batching!r}; expected static or "
      "continuous",
    )
    check(
      self.decode_attention in DECODE_ATTENTIONS,
      f"--decode_attention={self.decode_attention!r}; expected one of "
      f"{DECODE_ATTENTIONS}",
    )
    check(
      self.rollout_layout in ROLLOUT_LAYOUTS,
      f"--rollout_layout={self.rollout_layout!r}; expected one of "
      f"{ROLLOUT_LAYOUTS}",
    )
    check(
      self.template in TEMPLATES,
      f"--template={self.template!r}; expected one of {TEMPLATES}",
    )
    check(
      self.remat_policy in REMAT_POLICIES,
      f"--remat_policy={self.remat_policy!r}; expected one of {REMAT_POLICIES}",
    )
    for name in (
      "train_temp_budget_mib",
      "rollout_temp_budget_mib",
      "score_temp_budget_mib",
    ):
      value = getattr(self, name)
      check(value >= 0, f"--{name}={value}: >= 0")
    for name in ("mesh_data", "mesh_fsdp", "mesh_tensor"):
      value = getattr(self, name)
      check(value == -1 or value >= 1, f"--{name}={value}: -1 or >= 1")
    check(
      self.rollout_tensor >= 0,
      f"--rollout_tensor={self.rollout_tensor}: 0 (the mesh's) or >= 1",
    )
    check(
      not self.sequence_parallel
      or self.mesh_tensor != 1
      or self.rollout_tensor > 1,
      "--sequence_parallel splits tokens over the mesh's tensor axis: it "
      "needs --mesh_tensor > 1 (or --rollout_tensor > 1)",
    )
    check(
      self.ppo_epochs >= 1
      and self.minibatches >= 1
      and self.micro_batches >= 1,
      "--ppo_epochs, --minibatches and --micro_batches must be >= 1",
    )
    n = self.num_sequences
    if self.minibatches >= 1 and self.micro_batches >= 1 and n > 0:
      check(
        n % self.minibatches == 0,
        f"N = batch_size * group_size = {n} is not divisible by "
        f"--minibatches={self.minibatches}",
      )
      mb = n // self.minibatches
      check(
        mb % self.micro_batches == 0,
        f"minibatch of {mb} sequences is not divisible by "
        f"--micro_batches={self.micro_batches}",
      )
    if problems:
      raise ConfigError("\n".join(f"Invalid config: {p}" for p in problems))
