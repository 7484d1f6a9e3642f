"""Typed, validated, frozen run configuration (omegaconf structured configs).

The YAML (``--config``, default ``trainer/configs/demo.yaml``) plus ``key=value`` overrides hold the
model, data, training, decoding and logging settings. What DeepSpeed owns (optimizer, LR schedule,
precision, clipping, batch sizes) and the parallel layout live in the DeepSpeed JSON instead, and
are never repeated here.
"""
from __future__ import annotations

import dataclasses
import io
import math
import os
import re
from dataclasses import dataclass, field
from typing import Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data_prep.dataformat import files, userfiles
from trainer.metrics import TOKENIZE_CHOICES, tokenizer_problem

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(REPO_ROOT, "trainer", "configs", "demo.yaml")
MAX_CONFIG_BYTES = 1 << 20  # a config is a few hundred bytes; this bounds what a hostile one can make us parse


class ConfigError(ValueError):
    """A bad configuration value; the message names the key."""


def _key(default, help: str):
    """A config key: its default and what it means (`launch/train.py --print-config` prints both)."""
    return field(default=default, metadata={"help": help})


@dataclass
class ModelConfig:
    emb_dim: int = _key(256, "embedding width (source and target)")
    hidden: int = _key(256, "LSTM width of every encoder/decoder layer and of the attention")
    layers: int = _key(2, "encoder/decoder pair layers (each pipeline stage holds at least one)")
    bidirectional_bottom: bool = _key(False, "the bottom encoder layer reads both directions")
    attention: str = _key("general", "Luong attention score: dot | general | concat")
    dropout: float = _key(0.2, "dropout between layers and before the output projection, in [0, 1)")
    label_smoothing: float = _key(0.1, "label smoothing of the training loss, in [0, 1)")
    tie_embeddings: bool = _key(False, "share the target embedding with the output projection (single/data only)")
    residual: bool = _key(False, "residual connections: each encoder/decoder layer above the bottom one adds its "
                                 "input to its output (never one multi-layer call with the layer below: "
                                 "train.stack_layers)")
    lstm_kernel: str = _key("fused", "LSTM layers: fused (torch's LSTM; oneDNN on CPU, cuDNN on GPU) | stepwise "
                                     "(trainer.model.lstm: one GEMM per step, chunk-invariant cost; CPU, wide "
                                     "models and time-chunked layouts) | auto (stepwise on a CPU at hidden >= "
                                     "1024 in bf16, or in fp32 when the layout cuts time into chunks, where it "
                                     "was measured faster; fused elsewhere)")


@dataclass
class DataConfig:
    dir: str = _key("data/demo", "DATA_DIR written by python -m data_prep.prepare")
    max_tokens: int = _key(0, "cap on padded src+tgt tokens of a global micro-batch; 0 = sentences only")
    bucket_batches: int = _key(100, "length-sort windows of this many batches, then shuffle batches")
    min_batch_sentences: int = _key(8, "smallest batch; the same in every layout so runs stay comparable "
                                       "(a layout needs replicas x max(units, head shards))")
    length_multiple: int = _key(1, "pad each batch's source and target width up to a multiple of this (1: no "
                                    "padding): fewer distinct shapes for kernels, graphs and compilers, at the cost "
                                    "of the padded positions' work (docs/gpu.md)")
    verify: str = _key("ids", "check the data at start: ids (pair counts and file sizes against the manifest; "
                              "cheap) | checksums (also each binarized file's sha256) | full (also the SentencePiece "
                              "models' and the manifest's checksum) | none. Whatever the mode, every token id is "
                              "checked against its vocabulary on the arrays loaded, and every batch's")


@dataclass
class TrainConfig:
    seed: int = _key(1, "seed of weights, batches and dropout masks (0 .. 2**32-1)")
    max_steps: int = _key(1000, "optimizer steps to train (the run stops here)")
    schedule_steps: int = _key(0, "steps the LR schedule spans (the DeepSpeed JSON's WarmupDecayLR/WarmupCosineLR "
                                  "total_num_steps); 0 = train.max_steps. Above max_steps: stop early, continue later")
    max_epochs: int = _key(0, "stop after this many epochs; 0 = no limit")
    max_time_min: float = _key(0.0, "stop (validate, save) after this much training wall time; 0 = no limit")
    eval_every: int = _key(200, "validate (dev loss, dev BLEU) and save every N steps")
    save_every: int = _key(0, "also save every N steps; 0 = only at validation and at the end")
    keep_last: int = _key(2, "checkpoints kept (newest), besides the best by dev BLEU")
    early_stop_patience: int = _key(0, "validations without dev BLEU improvement before stopping; 0 = off")
    log_every: int = _key(10, "a metrics.jsonl row every N steps")
    threads: int = _key(0, "torch threads per rank; 0 = OMP_NUM_THREADS where the environment sets it, else cores "
                           "on this host / local ranks")
    pin_cores: str = _key("auto", "keep each local rank's threads on cores of its own (its slice of the cores this "
                                  "process may use, by local rank): auto = on a CPU with several local ranks whose "
                                  "threads fit those cores | on | off (the OS places the threads)")
    resume: str = _key("", "'' = a new run (refused if run.dir has checkpoints) | auto = newest good one | a path")
    resume_force: bool = _key(False, "resume even if the model config, data or batching differ (says what)")
    resume_schedule: str = _key("keep", "a resume whose LR schedule spanned other steps than this run's (train."
                                        "max_steps or schedule_steps changed): keep = go on with the checkpoint's "
                                        "schedule | stretch = span it over this run's steps (the LR moves)")
    comm_timeout_s: int = _key(300, "give up on a peer that does not answer for this long (gloo's default: 30 min)")
    max_bad_steps: int = _key(10, "stop after this many optimizer steps in a row skipped for non-finite loss/grads")
    timeline_every: int = _key(0, "every N steps: every rank's instruction spans to RUN_DIR/timeline/ (0 = off)")
    profile_steps: int = _key(0, "torch.profiler over this many steps, per rank, to RUN_DIR/profile/ (0 = off)")
    profile_from: int = _key(10, "... starting after this step (past the warm-up)")
    step_timing: str = _key("auto", "per-instruction timing (timeline, per-rank fractions, timing files): auto = every "
                                    "step on a CPU; on an accelerator only logged, sampled and profiled steps, which "
                                    "synchronise the device at every instruction edge | every = every step, synchronised")
    loss_chunk_rows: int = _key(0, "rows of logits the loss computes at a time; 0 = on a CPU the fastest of 128-1024 "
                                   "measured on this machine at the start (cached: trainer/training/tuning.py), 8192 "
                                   "on an accelerator")
    loss_projection: str = _key("auto", "how the loss's output projection is cut: chunked = one GEMM per chunk of "
                                        "train.loss_chunk_rows rows | whole = one GEMM over all rows, then the chunks' "
                                        "passes in place | auto = on a CPU the faster of the two, measured on this machine "
                                        "at the start (cached), whole on an accelerator")
    stack_layers: str = _key("auto", "a stage's consecutive LSTM layers as one multi-layer call where no dropout "
                                     "sits between them (model.dropout=0, or evaluation): on | off (a call per "
                                     "layer) | auto (on for fp32 on CUDA, where cuDNN's stack was measured faster; "
                                     "off elsewhere: docs/gpu.md)")
    tf32: bool = _key(False, "on a CUDA GPU, fp32 matmuls and cuDNN (the LSTMs) in TF32 (10-bit mantissa, "
                             "several times faster); false: true fp32. Said at start; bf16/fp16 are not affected")
    cuda_graphs: str = _key("off", "CUDA graphs of the step per batch shape (the decoder stack and the head's loss, "
                                   "forward and backward; docs/gpu.md): on | auto (on CUDA, each new shape first "
                                   "proved equal to eager, else eager for good; eager elsewhere) | off. on without "
                                   "CUDA is refused. Not yet run on a GPU")
    compile_head: bool = _key(False, "torch.compile the attention-softmax head's forward (dynamic shapes)")
    count_ops: bool = _key(False, "the train.profile_steps window counts operator launches and would-be device "
                                  "syncs per step (by place) instead of running torch.profiler")


@dataclass
class DecodeConfig:
    beam: int = _key(5, "beam size of translate/evaluate (1 = greedy)")
    max_len_ratio: float = _key(2.0, "longest hypothesis: source pieces x this + decode.max_len_add")
    max_len_add: int = _key(10, "see decode.max_len_ratio")
    length_penalty: float = _key(1.0, "rank hypotheses by log-prob / length^this (0 = raw log-prob)")
    batch_size: int = _key(64, "sentences per translation batch")
    max_tokens: int = _key(6000, "and at most this many padded source pieces per batch (beam x inside); 0 = no cap")
    max_line_bytes: int = _key(65536, "translate: a longer input line is not translated (an empty output line, "
                                      "counted and reported); 0 = no cap")
    dev_beam: int = _key(1, "beam used for dev BLEU during training (1 = greedy, fast)")
    dev_max_sentences: int = _key(500, "dev pairs decoded per validation (0 = all)")
    bleu_tokenize: str = _key("auto", "sacreBLEU tokenizer; auto: by the data's target language "
                                      "(ja-mecab, zh, ko-mecab, else 13a)")


@dataclass
class RunConfig:
    dir: str = _key("runs/demo", "the run directory (config, checkpoints, metrics.jsonl, ...)")
    name: str = _key("", "wandb run name (default: the run directory's name)")
    # A new run refuses a run.dir holding files the trainer did not write (it names one); true: write into it
    # anyway (only the trainer's own names are replaced, never its checkpoints; other files are left alone).
    overwrite: bool = _key(False, "a new run writes into a run.dir holding files the trainer did not write "
                                  "(those are left alone)")


@dataclass
class LoggingConfig:
    wandb_mode: str = _key("offline", "online | offline | disabled (off = disabled); online without an API key "
                                      "-> offline; default: the environment's WANDB_MODE, else offline")
    wandb_project: str = _key("hybrid-nmt", "wandb project")
    progress: bool = _key(True, "a progress bar on a terminal")
    verbose: bool = _key(False, "DeepSpeed's own start-up prints and notices (quiet by default)")


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
    "model.lstm_kernel": ("fused", "stepwise", "auto"),
    "logging.wandb_mode": ("online", "offline", "disabled", "off"),
    "train.step_timing": ("auto", "every"),
    "train.loss_projection": ("auto", "chunked", "whole"),
    "train.pin_cores": ("auto", "on", "off"),
    "train.stack_layers": ("auto", "on", "off"),
    "train.cuda_graphs": ("auto", "on", "off"),
    "decode.bleu_tokenize": TOKENIZE_CHOICES,
    "data.verify": ("ids", "checksums", "full", "none"),
    "train.resume_schedule": ("keep", "stretch"),
}
_POSITIVE = ("model.emb_dim", "model.hidden", "model.layers", "train.max_steps", "train.eval_every",
             "train.log_every", "train.keep_last", "decode.beam", "decode.dev_beam", "decode.batch_size",
             "data.bucket_batches",
             "data.min_batch_sentences", "train.comm_timeout_s", "train.max_bad_steps")
_NON_NEGATIVE = ("data.max_tokens", "train.max_epochs", "train.save_every", "train.early_stop_patience",
                 "train.threads", "train.timeline_every", "train.profile_steps", "train.profile_from",
                 "train.loss_chunk_rows",
                 "decode.dev_max_sentences", "decode.max_len_add", "train.schedule_steps",
                 "decode.max_tokens", "decode.max_line_bytes")
MAX_LENGTH_MULTIPLE = 256  # data.length_multiple: more pads most batches to twice their length
MAX_SEED = 2 ** 32 - 1  # numpy's and torch's generators take it; larger ones overflow torch's
# The largest decoding sizes (decode.*, and the flags of translate, evaluate and score, trainer.inference.options):
# far above any useful value, far below one that asks for more memory than a machine has (--beam 100000000 asked
# for 48 GB at once, --max-len-ratio 1e9 for 720 GB). Each hypothesis is a row of vocabulary scores per step, and
# the longest one (source pieces x max_len_ratio + max_len_add) sizes the buffers of finished ones.
DECODE_LIMITS = {"beam": 1000, "dev_beam": 1000, "batch_size": 10_000, "max_tokens": 1_000_000,
                 "max_len_ratio": 10.0, "max_len_add": 1000}


def _get(cfg: DictConfig, key: str):
    return OmegaConf.select(cfg, key)


def validate(cfg: DictConfig) -> None:
    for key, choices in _CHOICES.items():
        if _get(cfg, key) not in choices:
            raise ConfigError(f"{key}={_get(cfg, key)!r}: must be one of {', '.join(choices)}")
    for section in ("model", "data", "train", "decode"):  # nan/inf pass every comparison below unnoticed
        for name, value in cfg[section].items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{section}.{name}={value}: must be a finite number")
    for key in _POSITIVE:
        if _get(cfg, key) <= 0:
            raise ConfigError(f"{key}={_get(cfg, key)}: must be > 0")
    for key in _NON_NEGATIVE:
        if _get(cfg, key) < 0:
            raise ConfigError(f"{key}={_get(cfg, key)}: must be >= 0")
    for key in ("model.dropout", "model.label_smoothing"):
        if not 0.0 <= _get(cfg, key) < 1.0:
            raise ConfigError(f"{key}={_get(cfg, key)}: must be in [0, 1)")
    if not 1 <= cfg.data.length_multiple <= MAX_LENGTH_MULTIPLE:
        raise ConfigError(f"data.length_multiple={cfg.data.length_multiple}: must be in 1 .. {MAX_LENGTH_MULTIPLE} "
                          f"(1: no padding)")
    for name, limit in DECODE_LIMITS.items():
        if cfg.decode[name] > limit:
            raise ConfigError(f"decode.{name}={cfg.decode[name]}: at most {limit}")
    if cfg.decode.max_len_ratio <= 0:
        raise ConfigError(f"decode.max_len_ratio={cfg.decode.max_len_ratio}: must be > 0")
    if cfg.train.max_time_min < 0:
        raise ConfigError(f"train.max_time_min={cfg.train.max_time_min}: must be >= 0 (minutes of training; "
                          f"0 = no limit)")
    if not 0 <= cfg.train.seed <= MAX_SEED:
        raise ConfigError(f"train.seed={cfg.train.seed}: must be in 0 .. {MAX_SEED}")
    if 0 < cfg.train.schedule_steps < cfg.train.max_steps:
        raise ConfigError(f"train.schedule_steps={cfg.train.schedule_steps} < train.max_steps={cfg.train.max_steps}: "
                          f"the LR schedule would end before training does; raise it, or 0 (= train.max_steps)")
    if cfg.model.residual and cfg.train.stack_layers == "on":
        raise ConfigError("train.stack_layers=on with model.residual=true: a residual add sits between every two "
                          "layers, so no two can be one LSTM call; use auto or off (a call per layer)")
    problem = tokenizer_problem(cfg.decode.bleu_tokenize)  # auto: checked once the data's language is known
    if problem:
        raise ConfigError(f"decode.bleu_tokenize={cfg.decode.bleu_tokenize}: {problem}")


def schedule_steps(train_cfg) -> int:
    """How many steps the LR schedule spans: train.schedule_steps, else train.max_steps (of a train config, or
    of the plain mapping a checkpoint recorded)."""
    return train_cfg.get("schedule_steps") or train_cfg.get("max_steps")


def check_threads(threads: int) -> None:
    """train.threads against this host (not part of `validate`: a run trained on a big machine still
    translates on a small one)."""
    cores = os.cpu_count() or 1
    if threads > cores:
        raise ConfigError(f"train.threads={threads}: more than the {cores} cores of this host; at most {cores} "
                          f"per rank (0 = cores / local ranks)")


def _schema_type(key: str):
    """The declared type of a dotted config key (`logging.wandb_mode` -> str), or None if there is none."""
    section, _, name = key.partition(".")
    holder = {f.name: f for f in dataclasses.fields(Config)}.get(section)
    if holder is None or not name:
        return None
    fields = {f.name: f for f in dataclasses.fields(holder.default_factory)}
    return fields[name].type if name in fields else None


def _override(item: str) -> DictConfig:
    """One `key=value` as a config. The value is read as YAML (numbers, true/false), except for a key
    declared as text: there it is the text as typed, so `logging.wandb_mode=off` is "off", not YAML 1.1's
    false (which the schema would then refuse as 'False')."""
    key, _, value = item.partition("=")
    if _schema_type(key.strip()) in (str, "str"):
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        section, _, name = key.strip().partition(".")
        return OmegaConf.create({section: {name: value}})
    return OmegaConf.from_dotlist([item])


def _check_overrides(overrides: list[str]) -> None:
    """Each `key=value` well formed, its value bounded like a file's YAML (data_prep.userfiles: every key once,
    nesting and size bounded; what the YAML loader then refuses is load_config's), and each key stated once: a
    key given twice (or inside a section given whole, `train={...}` with `train.seed=2`) is refused, as in a file,
    rather than the last value silently winning. (A key of the --config file given again here is what an
    override is for.)"""
    given: dict[str, str] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value (e.g. train.max_steps=100)")
        if "${" in item:
            raise ConfigError(f"override {item!r}: interpolations (${{...}}) are not allowed in a config")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError as e:  # bytes the locale could not decode (Python keeps them as surrogates)
            raise ConfigError(f"override {item[:60]!r}: not UTF-8 text (character {e.start})") from None
        key, _, value = item.partition("=")
        try:
            userfiles.check_yaml(value, f"override {item[:60]!r}", max_bytes=MAX_CONFIG_BYTES)
        except userfiles.UserFileError as e:
            raise ConfigError(str(e)) from None
        key = key.strip()
        for other, earlier in given.items():
            if _same_key(key, other):
                raise ConfigError(f"override {item[:60]!r}: {key} is already given ({earlier[:60]}); state each key "
                                  f"once")
        given[key] = item


_OVERRIDE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*=")


def merge_overrides(*groups) -> list:
    """Several groups of command-line items as one, a later `key=value` replacing an earlier one of the same key
    (or of a section holding it, or inside it); anything else (flags, their values, paths) is kept as it stands:
    for programs that build a command from a base and changes (tests, benchmarks). A user's command line states
    each key once (`load_config` refuses a key given twice)."""
    out: list = []
    for item in (i for group in groups for i in group):
        m = _OVERRIDE.match(item) if isinstance(item, str) else None
        if m:
            out = [o for o in out if not (isinstance(o, str) and (k := _OVERRIDE.match(o)) and
                                          _same_key(k.group(1), m.group(1)))]
        out.append(item)
    return out


def _same_key(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _text_keys_read_as_bool(loaded: DictConfig, path: str) -> None:
    """`wandb_mode: off` in a YAML file is YAML 1.1's false; say how to write the word instead of letting
    the schema turn it into the text 'False' (or refuse it as that)."""
    for section, values in loaded.items():
        if not isinstance(values, DictConfig):
            continue
        for name, value in values.items():
            if isinstance(value, bool) and _schema_type(f"{section}.{name}") in (str, "str"):
                raise ConfigError(f"{path}: {section}.{name}: YAML reads this value as {str(value).lower()} (a "
                                  f"boolean), but the key holds text: quote it, e.g. {name}: \"off\"")


def load_config(path: Optional[str] = None, overrides: list[str] = ()) -> DictConfig:
    """YAML at `path` (default demo.yaml) + `key=value` overrides -> validated, read-only config.

    Unknown keys and wrong types raise ConfigError naming the key, before anything is built. A config is
    data: YAML syntax errors name the line, and tags (`!!python/...`), interpolations (`${...}`, which could
    read environment variables) and non-UTF-8 or oversized files are refused.
    """
    path = path or DEFAULT_CONFIG
    _check_overrides(overrides)
    loaded = read_yaml(path)
    _text_keys_read_as_bool(loaded, path)
    wandb_mode = wandb_mode_from_environment()
    try:
        cfg = OmegaConf.structured(Config)
        cfg.logging.wandb_mode = wandb_mode
        where = path
        cfg = OmegaConf.merge(cfg, loaded)
        where = "command-line override"
        for item in overrides:
            try:
                cfg = OmegaConf.merge(cfg, _override(item))
            except yaml.YAMLError as e:  # the value, read as YAML (a file's errors are read_yaml's)
                raise ConfigError(f"override {item[:60]!r}: {_yaml_problem(e)}") from None
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        message = str(e.msg if hasattr(e, "msg") else e).splitlines()[0]  # the rest repeats the key and types
        raise ConfigError(f"{where}: bad config key {key!r}: {message}") from None
    validate(cfg)
    OmegaConf.set_readonly(cfg, True)
    OmegaConf.set_struct(cfg, True)
    return cfg


WANDB_OFF = ("disabled", "off")  # logging.wandb_mode values that start no wandb


# wandb's own values of WANDB_MODE (dryrun and run: its older names; shared: online, several writers)
_WANDB_ENV_MODES = {"online": "online", "offline": "offline", "disabled": "disabled", "dryrun": "offline",
                    "run": "online", "shared": "online"}


def wandb_mode_from_environment() -> str:
    """logging.wandb_mode's default: the WANDB_MODE a wandb user has set (a config file or an override still
    decides over it), else offline. A value wandb does not know is left to `check_wandb_environment`."""
    return _WANDB_ENV_MODES.get(os.environ.get("WANDB_MODE", "").strip().lower(), LoggingConfig.wandb_mode)


def check_wandb_environment(cfg: DictConfig) -> None:
    """A training run that starts wandb: a WANDB_MODE wandb would refuse (a traceback, after the job has
    started) is refused now, in one line."""
    value = os.environ.get("WANDB_MODE", "").strip()
    if value and value.lower() not in _WANDB_ENV_MODES and cfg.logging.wandb_mode not in WANDB_OFF:
        raise ConfigError(f"environment variable WANDB_MODE={value[:40]!r}: must be online, offline or disabled "
                          f"(or unset; logging.wandb_mode=disabled leaves wandb out)")


def describe(cfg: DictConfig) -> str:
    """The resolved config as YAML (loadable with --config), each key with its help as a comment."""
    lines = []
    for section in dataclasses.fields(Config):
        lines.append(f"{section.name}:")
        for f in dataclasses.fields(section.default_factory):
            value = OmegaConf.to_yaml({f.name: cfg[section.name][f.name]}).strip()
            lines.append(f"  {value:<34} # {f.metadata.get('help', '')}")
    return "\n".join(lines) + "\n"


def read_yaml(path: str) -> DictConfig:
    """The YAML file at `path` as an untyped DictConfig, or a ConfigError naming the file (and line): read
    strictly (data_prep.userfiles: a regular file, every key once, nesting bounded)."""
    if not os.path.lexists(path):
        raise ConfigError(f"--config {path}: no such file")
    try:
        with files.open_read(path, "a config") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except files.FileError as e:
        raise ConfigError(str(e)) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {os.path.getsize(path)} bytes; a config has at most {MAX_CONFIG_BYTES}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    try:
        userfiles.check_yaml(text, path)
    except userfiles.UserFileError as e:
        raise ConfigError(str(e)) from None
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
    if "node expansion exceeds" in problem:  # omegaconf's loader counts what aliases expand to
        return "YAML aliases expand to too many nodes (node expansion exceeds omegaconf's limit: an alias bomb?); refused"
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
