"""Typed, validated, frozen run configuration (omegaconf structured configs).

The YAML (``--config``, default ``trainer/configs/demo.yaml``) plus ``key=value`` overrides hold the
model, data, training, decoding and logging settings. What DeepSpeed owns (optimizer, LR schedule,
precision, clipping, batch sizes) and the parallel layout live in the DeepSpeed JSON instead, and
are never repeated here.
"""
from __future__ import annotations

import io
import os
import stat
from dataclasses import dataclass, field
from typing import Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trainer.metrics import TOKENIZE_CHOICES, tokenizer_problem

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(REPO_ROOT, "trainer", "configs", "demo.yaml")
MAX_CONFIG_BYTES = 1 << 20  # a config is a few hundred bytes; this bounds what a hostile one can make us parse


class ConfigError(ValueError):
    """A bad configuration value; the message names the key."""


@dataclass
class ModelConfig:
    emb_dim: int = 256
    hidden: int = 256
    layers: int = 2
    bidirectional_bottom: bool = False
    attention: str = "general"  # dot | general | concat
    dropout: float = 0.2
    label_smoothing: float = 0.1
    tie_embeddings: bool = False


@dataclass
class DataConfig:
    dir: str = "data/demo"
    max_tokens: int = 0  # cap on padded src+tgt tokens of a global micro-batch; 0 = sentences only
    bucket_batches: int = 100  # length-sort windows of this many batches, then shuffle batches
    min_batch_sentences: int = 8  # smallest batch; the same in every layout so runs stay comparable


@dataclass
class TrainConfig:
    seed: int = 1
    max_steps: int = 1000
    max_epochs: int = 0  # 0 = no limit
    max_time_min: float = 0.0  # stop (validate, save) after this much training wall time; 0 = no limit
    eval_every: int = 200
    save_every: int = 0  # 0 = only at validation and at the end
    keep_last: int = 2
    early_stop_patience: int = 0  # validations without dev BLEU improvement; 0 = off
    log_every: int = 10
    threads: int = 0  # torch threads per rank; 0 = cores on this host / local ranks
    resume: str = ""  # "" = a new run (refused if run.dir has checkpoints) | auto = newest good one | a path
    resume_force: bool = False  # resume even if the model config, data or batching differ (says what)
    comm_timeout_s: int = 300  # give up on a peer that does not answer for this long (gloo's default: 30 min)
    max_bad_steps: int = 10  # stop after this many optimizer steps in a row skipped for non-finite loss/grads
    timeline_every: int = 0  # every N steps: every rank's instruction spans to RUN_DIR/timeline/ (0 = off)
    profile_steps: int = 0  # torch.profiler over this many steps, per rank, to RUN_DIR/profile/ (0 = off)
    profile_from: int = 10  # ... starting after this step (past the warm-up)
    # per-instruction timing (timeline, per-rank fractions, timing files): auto = every step on a CPU; on an
    # accelerator only logged, sampled and profiled steps, which synchronise the device at every instruction
    # edge (the others never wait for it) | every = every step, synchronised
    step_timing: str = "auto"
    loss_chunk_rows: int = 0  # rows of logits the loss computes at a time; 0 = by device (128 on a CPU, 8192 else)
    compile_head: bool = False  # torch.compile the attention-softmax head (dynamic shapes)


@dataclass
class DecodeConfig:
    beam: int = 5
    max_len_ratio: float = 2.0
    max_len_add: int = 10
    length_penalty: float = 1.0
    batch_size: int = 64  # sentences per translation batch
    max_tokens: int = 6000  # and at most this many padded source pieces per batch (beam x inside); 0 = no cap
    dev_beam: int = 1  # beam used for dev BLEU during training (1 = greedy, fast)
    dev_max_sentences: int = 500
    bleu_tokenize: str = "auto"  # auto: by the data's target language (ja-mecab, zh, ko-mecab, else 13a)


@dataclass
class RunConfig:
    dir: str = "runs/demo"
    name: str = ""
    # A new run refuses a run.dir holding files the trainer did not write (it names one); true: write into it
    # anyway (only the trainer's own names are replaced, never its checkpoints; other files are left alone).
    overwrite: bool = False


@dataclass
class LoggingConfig:
    wandb_mode: str = "offline"  # online | offline | disabled; online without an API key -> offline
    wandb_project: str = "hybrid-nmt"
    progress: bool = True
    verbose: bool = False  # DeepSpeed's own start-up prints and notices (quiet by default)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    run: RunConfig = field(default_factory=RunConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


_CHOICES = {
    "model.attention": ("dot", "general", "concat"),
    "logging.wandb_mode": ("online", "offline", "disabled"),
    "train.step_timing": ("auto", "every"),
    "decode.bleu_tokenize": TOKENIZE_CHOICES,
}
_POSITIVE = ("model.emb_dim", "model.hidden", "model.layers", "train.max_steps", "train.eval_every",
             "train.log_every", "train.keep_last", "decode.beam", "decode.dev_beam", "decode.batch_size",
             "data.bucket_batches",
             "data.min_batch_sentences", "train.comm_timeout_s", "train.max_bad_steps")
_NON_NEGATIVE = ("data.max_tokens", "train.max_epochs", "train.save_every", "train.early_stop_patience",
                 "train.threads", "train.timeline_every", "train.profile_steps", "train.profile_from",
                 "train.loss_chunk_rows",
                 "decode.dev_max_sentences", "decode.max_len_add",
                 "decode.max_tokens")


def _get(cfg: DictConfig, key: str):
    return OmegaConf.select(cfg, key)


def validate(cfg: DictConfig) -> None:
    for key, choices in _CHOICES.items():
        if _get(cfg, key) not in choices:
            raise ConfigError(f"{key}={_get(cfg, key)!r}: must be one of {', '.join(choices)}")
    for key in _POSITIVE:
        if _get(cfg, key) <= 0:
            raise ConfigError(f"{key}={_get(cfg, key)}: must be > 0")
    for key in _NON_NEGATIVE:
        if _get(cfg, key) < 0:
            raise ConfigError(f"{key}={_get(cfg, key)}: must be >= 0")
    for key in ("model.dropout", "model.label_smoothing"):
        if not 0.0 <= _get(cfg, key) < 1.0:
            raise ConfigError(f"{key}={_get(cfg, key)}: must be in [0, 1)")
    if cfg.decode.max_len_ratio <= 0:
        raise ConfigError(f"decode.max_len_ratio={cfg.decode.max_len_ratio}: must be > 0")
    problem = tokenizer_problem(cfg.decode.bleu_tokenize)  # auto: checked once the data's language is known
    if problem:
        raise ConfigError(f"decode.bleu_tokenize={cfg.decode.bleu_tokenize}: {problem}")


def load_config(path: Optional[str] = None, overrides: list[str] = ()) -> DictConfig:
    """YAML at `path` (default demo.yaml) + `key=value` overrides -> validated, read-only config.

    Unknown keys and wrong types raise ConfigError naming the key, before anything is built. A config is
    data: YAML syntax errors name the line, and tags (`!!python/...`), interpolations (`${...}`, which could
    read environment variables) and non-UTF-8 or oversized files are refused.
    """
    path = path or DEFAULT_CONFIG
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value (e.g. train.max_steps=100)")
        if "${" in item:
            raise ConfigError(f"override {item!r}: interpolations (${{...}}) are not allowed in a config")
    loaded = read_yaml(path)
    try:
        cfg = OmegaConf.structured(Config)
        where = path
        cfg = OmegaConf.merge(cfg, loaded)
        where = "command-line override"
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        message = str(e.msg if hasattr(e, "msg") else e).splitlines()[0]  # the rest repeats the key and types
        raise ConfigError(f"{where}: bad config key {key!r}: {message}") from None
    validate(cfg)
    OmegaConf.set_readonly(cfg, True)
    OmegaConf.set_struct(cfg, True)
    return cfg


def read_yaml(path: str) -> DictConfig:
    """The YAML file at `path` as an untyped DictConfig, or a ConfigError naming the file (and line)."""
    if not os.path.exists(path):
        raise ConfigError(f"--config {path}: no such file")
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ConfigError(f"{path}: not a regular file")
    if os.path.getsize(path) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {os.path.getsize(path)} bytes; a config has at most {MAX_CONFIG_BYTES}")
    with open(path, "rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    try:
        loaded = OmegaConf.load(io.StringIO(text))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}{_yaml_where(e)}: {_yaml_problem(e)}") from None
    except OmegaConfBaseException as e:
        raise ConfigError(f"{path}: {str(getattr(e, 'msg', e)).splitlines()[0]}") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, data:, train:, ...), "
                          f"not a {type(OmegaConf.to_container(loaded)).__name__}")
    interpolated = _interpolations(OmegaConf.to_container(loaded, resolve=False))
    if interpolated:
        raise ConfigError(f"{path}: {interpolated}: interpolations (${{...}}) are not allowed in a config")
    return loaded


def _yaml_where(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    return f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""


def _yaml_problem(e: yaml.YAMLError) -> str:
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    if "python/" in problem or "constructor for the tag" in problem:
        return (f"YAML tags are not allowed in a config (configs hold plain values, nothing in them is run): "
                f"{problem}")
    context = getattr(e, "context", None)
    return f"YAML syntax error: {problem}" + (f" ({context})" if context else "")


def _interpolations(node, key: str = "") -> Optional[str]:
    """The first key whose value holds an interpolation, if any."""
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return key or "(top level)" if isinstance(node, str) and "${" in node else None
    for k, v in items:
        found = _interpolations(v, f"{key}.{k}" if key else str(k))
        if found:
            return found
    return None


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg)
