"""The reference trainer's configuration: one frozen dataclass, checked on creation."""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from trainwreck.rundir.errors import ConfigError  # re-exported: the error this module raises

BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("auto", "cpu", "cuda")
AMP_DTYPES = ("auto", "none", "bf16", "fp16")
PARALLELISMS = ("ddp", "fsdp")
CKPT_MODES = ("sync", "async")
LR_SCALINGS = ("none", "linear", "sqrt")
"""How the peak LR follows a global batch other than `global_batch` (only with `rank_batch`): unchanged,
in proportion to the batch (Goyal et al.), or with its square root (the rule argued for Adam-like optimizers)."""

# Fields that do not change the training trajectory, so a checkpoint stays usable
# when they change (world size is not a field at all: the trainer is elastic).
_DEFAULT_IDENTITY_FREE = {"rank_batch": 0, "lr_scaling": "none", "lr_rewarmup": 0}
"""Fields added after identities were first recorded: at their default they are left out of the hash, so
every earlier configuration (and its golden cache and checkpoints) keeps its identity."""
_NOT_IDENTITY = frozenset(
    {"ckpt_interval", "keep_last", "backend", "device", "instrument", "grad_accum", "max_world_size", "variant"}
    | {"ckpt_mode"}
    # Not hashed so that every DDP identity (and golden cache) stays what it was; a checkpoint
    # of the other parallelism is refused by name instead (trainer/sharded.py).
    | {"parallelism"}
)


def backend_fields(backend: str) -> dict[str, str]:
    """Config fields that run on `backend`: nccl means CUDA devices, gloo means the CPU,
    auto leaves both to the trainer."""
    if backend == "auto":
        return {}
    return {"backend": backend, "device": "cuda" if backend == "nccl" else "cpu"}


_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}
_TYPE_NAMES = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false"}


def _check_type(name: str, type_name: str, value: Any) -> None:
    """Refuse a wrong JSON type (a comparison below would raise TypeError) and a non-finite float."""
    ok = isinstance(value, _TYPES.get(type_name, (object,)))
    if ok and type_name != "bool" and isinstance(value, bool):
        ok = False  # true is an int in Python, never in a config
    if not ok:
        raise ConfigError(f"{name}={value!r} must be {_TYPE_NAMES[type_name]}")
    # NaN compares false with every bound, so it would pass them all.
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name}={value!r} is not a finite number; give a finite {name}")


def parse_set_items(items: list[str]) -> dict[str, Any]:
    """`--set FIELD=VALUE` values (repeatable) as typed config fields: the one parser both
    `python -m trainwreck.trainer` and `trainwreck run` use."""
    types = {f.name: str(f.type) for f in fields(TrainConfig)}
    values: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or name not in types:
            raise ConfigError(f"--set {item!r}: expected FIELD=VALUE with FIELD one of {', '.join(types)}")
        values[name] = _parse_value(raw, types[name], name)
    return values


def _parse_value(raw: str, type_name: str, name: str) -> Any:
    try:
        if type_name == "bool":
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        return {"int": int, "float": float}.get(type_name, str)(raw)
    except ValueError:
        raise ConfigError(f"--set {name}={raw!r}: not a valid {type_name}; give {_TYPE_NAMES.get(type_name, type_name)}") from None


def saves_after_step(step: int, ckpt_interval: int, total_steps: int) -> bool:
    """The save schedule, the one rule everybody asks: every ckpt_interval updates, and after the last."""
    return step % ckpt_interval == 0 or step == total_steps


UPPER_BOUNDS: dict[str, int] = {
    "input_dim": 1 << 14, "num_classes": 1 << 16, "width": 1 << 14, "depth": 64,
    "dataset_size": 1 << 26, "global_batch": 1 << 20, "grad_accum": 1 << 10,
    "total_steps": 1_000_000, "ckpt_interval": 1_000_000, "warmup_steps": 1_000_000,
    "keep_last": 1000, "max_world_size": 4096, "lr_rewarmup": 1_000_000,
}
"""The largest value each count may take: far beyond any test, benchmark or case study (a
width of 16384 is 1 GiB of fp32 weights per layer; a million steps of the tiny model take
hours), and far short of a value that exhausts memory or never ends (`width=2000000000`,
`total_steps=2e9`)."""


@dataclass(frozen=True)
class TrainConfig:
    input_dim: int = 32
    """Features per synthetic sample."""
    num_classes: int = 8
    """Classes of the synthetic labelling task."""
    width: int = 256
    """Hidden units per MLP layer."""
    depth: int = 3
    """Hidden layers of the MLP (each Linear, ReLU, Dropout)."""
    dropout: float = 0.1
    """Dropout probability; > 0 so that a forgotten RNG restore changes the result."""
    dataset_size: int = 32768
    """Samples in the synthetic dataset; ids are 0..dataset_size-1."""
    global_batch: int = 4096
    """Samples per optimizer step, all ranks together; fixed when the world size changes."""
    grad_accum: int = 1
    """Micro-batches per rank per step (gradients accumulate between them)."""
    drop_last: bool = True
    """Drop an epoch's final partial global batch (False: train on it as a smaller step)."""
    lr: float = 1e-3
    """Peak learning rate of AdamW."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    warmup_steps: int = 5
    """Linear warmup steps before the cosine decay."""
    min_lr_ratio: float = 0.1
    """The cosine decays to lr * min_lr_ratio at total_steps."""
    seed: int = 0
    """Seeds the model init, the data, the epoch shuffles and the dropout stream."""
    total_steps: int = 40
    """Optimizer updates in the whole job (steps are numbered 1..total_steps)."""
    ckpt_interval: int = 10
    """Save a checkpoint after every this many updates (and after the last one)."""
    keep_last: int = 3
    """Committed checkpoints kept by retention (at least 2, so a damaged newest one has a fallback)."""
    backend: str = "auto"
    """Process-group backend: auto (nccl with CUDA, else gloo), gloo or nccl."""
    device: str = "auto"
    """auto (cuda:LOCAL_RANK when this host has a GPU for every local rank, else cpu), cpu or cuda."""
    amp_dtype: str = "auto"
    """Autocast dtype: auto (bf16 on CUDA, none on CPU), none, bf16, or fp16 (with a GradScaler)."""
    instrument: bool = True
    """Write batch/step events with digests and phase timers (off only for overhead benchmarks)."""
    max_world_size: int = 64
    """Upper bound used when listing world sizes that divide the global batch."""
    variant: str = "reference"
    """Which trainer implementation runs: 'reference', or a planted defect from trainer/defects.py (self-tests)."""
    parallelism: str = "ddp"
    """ddp (every rank holds the full state; rank 0 writes it) or fsdp (FSDP2 fully_shard; every rank
    writes its own shards through torch.distributed.checkpoint, loadable on another world size)."""
    ckpt_mode: str = "sync"
    """sync: the save is written and committed inside the step; async: the step pays only for a
    snapshot to host memory and a background thread writes and commits it (trainer/async_ckpt.py)."""

    rank_batch: int = 0
    """0: `global_batch` is fixed and split over the ranks. N > 0: every rank takes N samples per update, so an
    update's global batch is N x world size and changes with it (a per-device batch); `global_batch` is then
    the batch the LR was tuned for, the one `lr_scaling` scales from."""
    lr_scaling: str = "none"
    """With rank_batch: none, linear or sqrt; the LR's multiplier for a global batch B is 1, B / global_batch or
    sqrt(B / global_batch), on top of the warmup and cosine schedule."""
    lr_rewarmup: int = 0
    """With rank_batch: after a resume onto another global batch, ramp the LR multiplier linearly from the
    checkpoint world's to the new world's over this many updates (0: switch at once)."""

    def __post_init__(self) -> None:
        positive = ("input_dim", "num_classes", "width", "depth", "dataset_size", "global_batch",
                    "grad_accum", "total_steps", "ckpt_interval", "max_world_size")
        # Counts first: their message ("a positive integer") also covers a wrong type.
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name}={value!r} must be a positive integer")
        for f in fields(self):
            _check_type(f.name, str(f.type), getattr(self, f.name))
        for name, limit in UPPER_BOUNDS.items():
            if getattr(self, name) > limit:
                raise ConfigError(f"{name}={getattr(self, name)} exceeds the limit of {limit}: "
                                  f"give a value of at most {limit}")
        if self.num_classes < 2:
            raise ConfigError(f"num_classes={self.num_classes} must be at least 2 for a classification task")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout={self.dropout} must be in [0, 1)")
        if self.lr <= 0:
            raise ConfigError(f"lr={self.lr} must be > 0")
        if self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps={self.warmup_steps} must be >= 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        if self.keep_last < 2:
            raise ConfigError(
                f"keep_last={self.keep_last}: retention must keep at least 2 checkpoints so that "
                "a damaged newest checkpoint has an intact predecessor; set keep_last >= 2"
            )
        if self.global_batch > self.dataset_size:
            raise ConfigError(
                f"global_batch={self.global_batch} exceeds dataset_size={self.dataset_size}: "
                "an epoch would hold no full batch; lower global_batch or raise dataset_size"
            )
        for name, allowed in (("backend", BACKENDS), ("device", DEVICES), ("amp_dtype", AMP_DTYPES),
                              ("parallelism", PARALLELISMS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name}={getattr(self, name)!r} is not one of {', '.join(allowed)}")
        if self.ckpt_mode not in CKPT_MODES:
            raise ConfigError(f"ckpt_mode={self.ckpt_mode!r} is not one of {', '.join(CKPT_MODES)}; use 'sync' "
                              "(save inside the step) or 'async' (snapshot, then persist in the background)")
        if self.backend == "nccl" and self.device == "cpu":
            raise ConfigError("backend='nccl' needs device='cuda' (or 'auto'); use backend='gloo' on CPU")
        if self.parallelism == "fsdp" and self.ckpt_mode == "async":
            raise ConfigError("ckpt_mode='async' with parallelism='fsdp': the async writer persists rank 0's full "
                              "state, not every rank's shards; use ckpt_mode='sync' with fsdp")
        if self.parallelism == "fsdp" and self.amp_dtype == "fp16":
            raise ConfigError("amp_dtype='fp16' with parallelism='fsdp': GradScaler does not unscale sharded "
                              "gradients; use amp_dtype='bf16' (or 'none') with fsdp")
        if self.rank_batch < 0 or self.rank_batch % self.grad_accum:
            raise ConfigError(f"rank_batch={self.rank_batch} must be 0 (a fixed global batch) or a positive "
                              f"multiple of grad_accum={self.grad_accum}")
        if self.lr_scaling not in LR_SCALINGS:
            raise ConfigError(f"lr_scaling={self.lr_scaling!r} is not one of {', '.join(LR_SCALINGS)}")
        if self.lr_rewarmup < 0 or (self.lr_rewarmup and not self.rank_batch):
            raise ConfigError(f"lr_rewarmup={self.lr_rewarmup} needs rank_batch > 0 and must be >= 0: only a "
                              "per-device batch changes the global batch on a resume")
        if self.lr_scaling != "none" and not self.rank_batch:
            raise ConfigError(f"lr_scaling={self.lr_scaling!r} needs rank_batch > 0: with a fixed global batch "
                              "there is no other batch to scale the LR for")
        if self.global_batch % self.grad_accum:
            raise ConfigError(
                f"global_batch={self.global_batch} is not divisible by grad_accum={self.grad_accum}"
            )

    def saves_after(self, step: int) -> bool:
        """Whether the trainer checkpoints after update `step` (see saves_after_step)."""
        return saves_after_step(step, self.ckpt_interval, self.total_steps)

    def save_steps(self) -> list[int]:
        """Every update after which the trainer checkpoints, in order."""
        return [s for s in range(1, self.total_steps + 1) if self.saves_after(s)]

    def step_batch(self, world_size: int) -> int:
        """Samples per update over all ranks: global_batch, or rank_batch x world size with a per-device batch."""
        return self.rank_batch * world_size if self.rank_batch else self.global_batch

    def lr_scale(self, world_size: int) -> float:
        """The LR multiplier lr_scaling gives this world size's global batch (1 without a per-device batch)."""
        ratio = self.step_batch(world_size) / self.global_batch
        return {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[self.lr_scaling]

    def valid_world_sizes(self) -> list[int]:
        """World sizes whose per-rank batch is a whole number of equal micro-batches."""
        return [w for w in range(1, self.max_world_size + 1)
                if self._fits(w)]

    def _fits(self, world_size: int) -> bool:
        if self.rank_batch:
            return self.step_batch(world_size) <= self.dataset_size
        return self.global_batch % (world_size * self.grad_accum) == 0

    def check_world_size(self, world_size: int) -> None:
        if self.rank_batch and world_size >= 1 and not self._fits(world_size):
            raise ConfigError(f"world size {world_size} x rank_batch={self.rank_batch} exceeds dataset_size="
                              f"{self.dataset_size}: an epoch would hold no full batch; use fewer ranks")
        if world_size < 1 or (not self.rank_batch and self.global_batch % (world_size * self.grad_accum)):
            raise ConfigError(
                f"world size {world_size} does not divide global_batch={self.global_batch} "
                f"into grad_accum={self.grad_accum} equal micro-batches per rank; "
                f"world sizes that do: {', '.join(map(str, self.valid_world_sizes()))}"
            )

    def identity(self) -> str:
        """A hash of the fields that shape the trajectory: checkpoints from another identity are refused."""
        shaping = {k: v for k, v in asdict(self).items() if k not in _NOT_IDENTITY
                   and not (k in _DEFAULT_IDENTITY_FREE and v == _DEFAULT_IDENTITY_FREE[k])}
        return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**data)

    @classmethod
    def tiny(cls, **overrides: Any) -> TrainConfig:
        """A fast configuration for tests and scenarios: small model, small batches."""
        base = dict(input_dim=16, num_classes=4, width=32, depth=2, dataset_size=256,
                    global_batch=16, total_steps=24, ckpt_interval=4, warmup_steps=2)
        base.update(overrides)
        return cls(**base)
