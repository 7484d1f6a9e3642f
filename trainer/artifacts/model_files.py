"""Reading what a model is made of -- a run directory or an exported file -- without trusting it.

Both are user files: a model downloaded or handed over may be damaged or crafted. So the config is
checked with the training rules (`trainer.config.validate`), the SentencePiece models must parse and
keep the special ids, the normalisation flags must be ones `normalize()` takes. (The weights are checked
against the model the config describes by trainer.inference.loading, with the checks a resume makes:
trainer.checkpoint.structure.) Every failure is a `ModelFileError` (a ValueError the CLIs print as one
line) naming the file and the key.
"""
from __future__ import annotations

import hashlib
from typing import Mapping

import sentencepiece as spm
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data_prep.dataformat import CJK_SPACES, SPECIAL_IDS, files, numbers
from trainer.artifacts import run_files, torch_files
from trainer.config import Config, ConfigError, validate

NORMALIZE_FLAGS = {"nfkc": bool, "lowercase": bool, "entities": bool, "markup": bool, "cjk_spaces": str}


class ModelFileError(ValueError):
    """A model file (or run directory file) that cannot be used; the message names it and what is wrong."""


def config_from(data, where: str) -> DictConfig:
    """The run config stored in a model file, checked with the training rules; read-only."""
    if not isinstance(data, Mapping):
        raise ModelFileError(f"{where}: the config is a {type(data).__name__}, not a mapping of sections")
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(dict(data)))
        validate(cfg)
    except ConfigError as e:
        raise ModelFileError(f"{where}: config {e}") from None
    except (OmegaConfBaseException, ValueError, TypeError) as e:
        key = getattr(e, "full_key", None)
        raise ModelFileError(f"{where}: bad config key {key!r}: {getattr(e, 'msg', e)}") from None
    OmegaConf.set_readonly(cfg, True)
    return cfg


def recorded_sha256(manifest, side: str, where: str) -> str | None:
    """The sha256 of the `side` ("src" | "tgt") SentencePiece model a data manifest records (prepare writes
    vocab.src_model_sha256 / tgt_model_sha256; None for a manifest from before them)."""
    vocab = manifest.get("vocab") if isinstance(manifest, Mapping) else None
    value = vocab.get(f"{side}_model_sha256") if isinstance(vocab, Mapping) else None
    if value is not None and not (isinstance(value, str) and len(value) == 64
                                  and all(c in "0123456789abcdef" for c in value)):
        raise ModelFileError(f"{where}: vocab.{side}_model_sha256={value!r:.80}: not a sha256")
    return value


def sentencepiece(where: str, *, proto: bytes | None = None, path: str | None = None,
                  sha256: str | None = None, recorded_in: str = "") -> spm.SentencePieceProcessor:
    """A SentencePiece model from bytes or a file that parses and keeps the ids data_prep gives it
    (<pad> <unk> <s> </s> = 0 1 2 3). A file must be a regular file of at most run_files.MAX_SPM_BYTES (a
    link to /dev/zero or a FIFO would be read until memory runs out, or forever). `sha256`: what the bytes must
    hash to (as the data manifest `recorded_in` records it): another vocabulary of the same size fits every shape
    and would translate into the wrong pieces without a word. The bytes checked are the bytes parsed."""
    if proto is None:
        try:
            proto = files.read_bytes(path, run_files.MAX_SPM_BYTES, "a SentencePiece model")
        except FileNotFoundError:
            raise ModelFileError(f"{where}: not found") from None
        except files.FileError as e:
            raise ModelFileError(f"{where}: {e.strerror}") from None
    if sha256 is not None and hashlib.sha256(proto).hexdigest() != sha256:
        raise ModelFileError(f"{where}: not the SentencePiece model {recorded_in} records (its sha256 is "
                             f"{hashlib.sha256(proto).hexdigest()[:16]}..., the manifest's {sha256[:16]}...): swapped "
                             f"or changed after prepare wrote it; put back the one the data was prepared with")
    try:
        sp = spm.SentencePieceProcessor(model_proto=proto)
    except (RuntimeError, OSError, ValueError) as e:
        raise ModelFileError(f"{where}: not a SentencePiece model ({str(e).strip().splitlines()[0][:200]})") from None
    ids = {"pad": sp.pad_id(), "unk": sp.unk_id(), "bos": sp.bos_id(), "eos": sp.eos_id()}
    if sp.get_piece_size() <= max(SPECIAL_IDS.values()) or ids != SPECIAL_IDS:
        raise ModelFileError(f"{where}: a SentencePiece model of {sp.get_piece_size()} pieces with special ids {ids}; "
                             f"data_prep writes at least {len(SPECIAL_IDS) + 1} pieces with {SPECIAL_IDS}")
    return sp


def normalize_flags(data, where: str) -> dict:
    """The `normalize()` keyword arguments recorded at prepare time."""
    if not isinstance(data, Mapping):
        raise ModelFileError(f"{where}: the normalisation flags are a {type(data).__name__}, not a mapping")
    unknown = sorted(set(map(str, data)) - set(NORMALIZE_FLAGS))
    if unknown:
        raise ModelFileError(f"{where}: unknown normalisation flag(s) {', '.join(unknown)} "
                             f"(known: {', '.join(NORMALIZE_FLAGS)})")
    for key, kind in NORMALIZE_FLAGS.items():
        if key in data and type(data[key]) is not kind:
            raise ModelFileError(f"{where}: normalisation flag {key}={data[key]!r} is not a {kind.__name__}")
    if data.get("cjk_spaces", "keep") not in CJK_SPACES:
        raise ModelFileError(f"{where}: normalisation flag cjk_spaces={data['cjk_spaces']!r}: must be one of "
                             f"{', '.join(CJK_SPACES)}")
    return dict(data)


def number_slots(data, where: str) -> dict | None:
    """`manifest["numbers"]` (number placeholders, data_prep.numbers): None (off, and for manifests written
    before it existed) or {"slots": N, "fullwidth": bool}."""
    try:
        return numbers.check_config(data, where)
    except ValueError as e:
        raise ModelFileError(str(e)) from None


def describe(cfg: DictConfig, src_vocab: int, tgt_vocab: int) -> str:
    """The model a config describes, in the words of an error about weights that do not fit it."""
    m = cfg.model
    return (f"model.emb_dim={m.emb_dim}, model.hidden={m.hidden}, model.layers={m.layers}, model.attention="
            f"{m.attention}, model.bidirectional_bottom={m.bidirectional_bottom}, model.tie_embeddings="
            f"{m.tie_embeddings}, model.residual={m.residual}, vocabularies {src_vocab}/{tgt_vocab}")


# ---- the exported model file (launch/export.py writes it, translate --model reads it) ----
EXPORT_FORMAT = "hybrid-nmt/model"
EXPORT_VERSION = 1
EXPORT_KEYS = ("version", "config", "model", "spm_src", "spm_tgt", "normalize", "origin")


def bytes_tensor(data: bytes) -> torch.Tensor:
    """Bytes (a SentencePiece model) as a 1-d uint8 tensor: a model file holds tensors and plain values only,
    so that torch.load(weights_only=True) reads it."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def tensor_bytes(t, where: str) -> bytes:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 1:
        raise ModelFileError(f"{where}: expected the model's bytes (a 1-d uint8 tensor)")
    return t.numpy().tobytes()


def read_export(path: str) -> dict:
    """An exported model file, loaded with weights_only and checked for its format, version and keys."""
    import os

    if not os.path.exists(path):
        raise FileNotFoundError(f"--model {path}: no such file")
    try:
        with files.open_read(path, "a model file", flag="--model") as f:
            blob = torch_files.load_weights(f)
    except torch_files.UnreadableTorchFile as e:
        raise ValueError(f"--model {path}: not a readable model file ({e})") from None
    if not isinstance(blob, dict) or blob.get("format") != EXPORT_FORMAT:
        raise ValueError(f"--model {path}: not a model exported by launch/export.py")
    missing = [k for k in EXPORT_KEYS if k not in blob]
    if missing:
        raise ModelFileError(f"--model {path}: incomplete model file: no {', '.join(missing)}")
    if blob["version"] != EXPORT_VERSION:
        raise ModelFileError(f"--model {path}: format version {blob['version']!r}; this program reads version "
                             f"{EXPORT_VERSION}")
    return blob


def is_export(path: str, max_pickle_bytes: int = 16 << 20) -> bool:
    """Whether the file at `path` is a model file export_model wrote (what a new export may replace): a torch
    archive whose pickle names EXPORT_FORMAT (read without loading a tensor)."""
    import zipfile

    try:
        with files.open_read(path, "a model file", remember=False) as f, zipfile.ZipFile(f) as archive:
            pickles = [i for i in archive.infolist() if i.filename.endswith("/data.pkl")]
            if len(pickles) != 1 or pickles[0].file_size > max_pickle_bytes:
                return False
            return EXPORT_FORMAT.encode() in archive.read(pickles[0])
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        return False
