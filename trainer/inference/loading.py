"""Where a translator's model comes from: a run directory's checkpoint, the mean of several checkpoints, an
exported model file, or several translators as one ensemble; and writing the exported file. Each builds its
Translator complete, once: the models, the text pipeline, the decoding options (the config's decode section with
the `decode` flags given, checked: trainer.inference.options) and where it came from.

Every file is a user file: checkpoints must verify (trainer.checkpoint.files), their layer files and every
weight tensor are checked against the model the config describes by the checks a resume makes
(trainer.checkpoint.structure), on a meta-device model before the real one is allocated, and everything else
(config, SentencePiece models, normalisation flags) before the model is built (trainer.artifacts.model_files)."""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
from omegaconf import OmegaConf

from data_prep.dataformat import SPM_MODELS, TrainingLimits, files
from trainer.artifacts import model_files, run_dir as run_names
from trainer.checkpoint import files as checkpoint, structure
from trainer.config import ConfigError, load_config
from trainer.inference.options import DecodeOptions
from trainer.inference.text import TextPipeline
from trainer.inference.translator import Translator
from trainer.metrics import manifest_lang
from trainer.model.meta import shapes_only
from trainer.model.seq2seq import Seq2Seq, build_model


class _Parts(NamedTuple):
    """What a Translator is built from, read and checked."""

    cfg: object  # the run's (or the exported model's) config
    model: object
    text: TextPipeline
    origin: dict


def _built(parts: _Parts, device, decode: dict | None) -> Translator:
    options = DecodeOptions.from_config(parts.cfg.decode, **(decode or {}))
    return Translator(parts.model, parts.text, options, device, origin=parts.origin)


def load_run(run_dir: str, which: str = "best", device=None, *, allow_unverified: bool = False,
             decode: dict | None = None) -> Translator:
    """The model of a run directory's checkpoint (`which`: best | last | a path). The checkpoint must verify
    unless `allow_unverified`, or it is the run's own save in progress (the trainer's dev decode). `decode`:
    decoding flags (DecodeOptions' names; None values: the run's decode.*)."""
    return _built(_run_parts(run_dir, which, allow_unverified), device, decode)


def _run_parts(run_dir: str, which: str, allow_unverified: bool) -> _Parts:
    config_path = os.path.join(run_dir, run_names.CONFIG)
    try:
        cfg = load_config(config_path)
    except ConfigError as e:  # the run's own file (no overrides here): name it
        message = str(e)
        raise ConfigError(message if config_path in message else f"{config_path}: {message}") from None
    manifest_path = os.path.join(run_dir, run_names.DATA_MANIFEST)
    manifest = checkpoint.read_json(manifest_path)
    if not isinstance(manifest, dict):
        raise model_files.ModelFileError(f"{manifest_path}: not a prepare manifest (a JSON object)")
    src_sp, tgt_sp = (model_files.sentencepiece(path, path=path, recorded_in=manifest_path,
                                                sha256=model_files.recorded_sha256(manifest, side, manifest_path))
                      for side, path in ((s, os.path.join(run_dir, SPM_MODELS[s])) for s in ("src", "tgt")))
    ckpt = checkpoint.resolve(run_dir, which)
    checkpoint.check_trusted(ckpt, allow_unverified=allow_unverified or checkpoint.is_unfinished_save(run_dir, ckpt))
    needs = f"the run's config ({model_files.describe(cfg, src_sp.get_piece_size(), tgt_sp.get_piece_size())})"
    _checked(structure.layer_files, ckpt, cfg.model.layers, needs)
    files = [checkpoint.model_file(ckpt, checkpoint.layer_name(i)) for i in range(cfg.model.layers + 1)]
    files.append(checkpoint.model_file(ckpt, checkpoint.HEAD))
    model = _build_checked(cfg, src_sp.get_piece_size(), tgt_sp.get_piece_size(),
                           [(path, checkpoint.load(path)) for path in files], needs)
    meta_path = os.path.join(ckpt, checkpoint.META)
    meta = checkpoint.read_json(meta_path) if os.path.lexists(meta_path) else {}
    meta = meta if isinstance(meta, dict) else {}
    text = TextPipeline(src_sp, tgt_sp, model_files.normalize_flags(manifest.get("normalize", {}), manifest_path),
                        tgt_lang=manifest_lang(manifest), limits=TrainingLimits.from_manifest(manifest),
                        norm_tgt=model_files.normalize_flags(manifest.get("normalize_tgt", {}), manifest_path),
                        number_slots=model_files.number_slots(manifest.get("numbers"), manifest_path))
    origin = {"run_dir": os.path.abspath(run_dir), "checkpoint": os.path.basename(ckpt), "step": meta.get("step"),
              "dev_bleu": meta.get("dev_bleu"), "data_checksum": manifest.get("checksum"),
              "config": OmegaConf.to_container(cfg)}
    return _Parts(cfg, model, text, origin)


def _checked(check, *args) -> None:
    """A structure check (trainer.checkpoint.structure) whose refusal is a model file's: a ModelFileError."""
    try:
        check(*args)
    except checkpoint.CheckpointError as e:
        raise model_files.ModelFileError(str(e)) from None


def _build_checked(cfg, src_vocab: int, tgt_vocab: int, parts: list, needs: str, *, whole: bool = False) -> Seq2Seq:
    """The model `cfg` describes, filled with `parts`: (where, state dict) per global layer then the head (a run's
    checkpoint files), or, with `whole`, one (where, whole-model state dict) (an exported file). Every part is
    checked as a resume checks it (structure.weights) against a meta-device model first: nothing of the config's
    size is allocated before the weights agree with it (model.hidden=60000 beside weights of width 256 is one
    line, not a 57 GB allocation)."""
    with shapes_only():
        shape_model = build_model(cfg.model, src_vocab, tgt_vocab)
    modules = [shape_model] if whole else [*shape_model.layers(), shape_model.head]
    if len(parts) != len(modules):
        raise model_files.ModelFileError(f"{parts[0][0] if parts else '?'}: {len(parts)} weight files for "
                                         f"{len(modules)} parts of the model ({needs})")
    for (where, state), module in zip(parts, modules):
        _checked(structure.weights, state, module, where, needs)
    model = build_model(cfg.model, src_vocab, tgt_vocab)
    for (where, state), module in zip(parts, [model] if whole else [*model.layers(), model.head]):
        try:
            module.load_state_dict(state)
        except RuntimeError as e:
            raise model_files.ModelFileError(f"{where}: {str(e).splitlines()[0][:300]}") from None
    return model


def load_average(run_dir: str, checkpoints: list[str], device=None, decode: dict | None = None) -> Translator:
    """One model whose weights are the mean of these checkpoints' (of one run: the same shapes), each
    verified and checked against the config like a single one."""
    if not checkpoints:
        raise ValueError("no checkpoint to average")
    first = _run_parts(run_dir, checkpoints[0], False)
    total = {k: v.detach().double().clone() for k, v in first.model.state_dict().items()}
    names = [first.origin["checkpoint"]]
    for which in checkpoints[1:]:
        other = _run_parts(run_dir, which, False)
        names.append(other.origin["checkpoint"])
        for k, v in other.model.state_dict().items():
            total[k] += v.double()
    first.model.load_state_dict({k: v / len(checkpoints) for k, v in total.items()})
    origin = dict(first.origin, checkpoint="average(" + ",".join(names) + ")", averaged=names, dev_bleu=None)
    return _built(first._replace(origin=origin), device, decode)


def load_export(path: str, device=None, decode: dict | None = None) -> Translator:
    """A model file written by `export_model`, checked like a run before it is built."""
    blob = model_files.read_export(path)
    where = f"--model {path}"
    cfg = model_files.config_from(blob["config"], where)
    src_sp, tgt_sp = (model_files.sentencepiece(f"{where}: {k}", proto=model_files.tensor_bytes(blob[k], f"{where}: {k}"))
                      for k in ("spm_src", "spm_tgt"))
    needs = f"the config ({model_files.describe(cfg, src_sp.get_piece_size(), tgt_sp.get_piece_size())})"
    model = _build_checked(cfg, src_sp.get_piece_size(), tgt_sp.get_piece_size(), [(where, blob["model"])], needs,
                           whole=True)
    limits = blob.get("limits") or {}
    if not isinstance(limits, dict):
        raise model_files.ModelFileError(f"{where}: limits: expected a mapping")
    tgt_lang = blob.get("tgt_lang")
    if tgt_lang is not None and not isinstance(tgt_lang, str):
        raise model_files.ModelFileError(f"{where}: tgt_lang: expected a language code")
    text = TextPipeline(src_sp, tgt_sp, model_files.normalize_flags(blob["normalize"], f"{where}: normalize"),
                        tgt_lang=tgt_lang, limits=TrainingLimits.from_manifest({"filters": limits}),
                        norm_tgt=model_files.normalize_flags(blob.get("normalize_tgt", {}), f"{where}: normalize_tgt"),
                        number_slots=model_files.number_slots(blob.get("numbers"), where))
    origin = blob["origin"] if isinstance(blob["origin"], dict) else {}
    return _built(_Parts(cfg, model, text, dict(origin, config=OmegaConf.to_container(cfg))), device, decode)


def ensemble(members: list[Translator], names: list[str]) -> Translator:
    """The members' models decoding as one (`trainer.model.search.Ensemble`); the first member's text
    handling, decoding options and device apply. Members must share both vocabularies and normalisation."""
    first = members[0]
    for m, name in zip(members[1:], names[1:]):
        for what, a, b in (("source SentencePiece model", first.text.src_sp, m.text.src_sp),
                           ("target SentencePiece model", first.text.tgt_sp, m.text.tgt_sp)):
            if a.serialized_model_proto() != b.serialized_model_proto():
                raise ValueError(f"ensemble: {name} has another {what} than {names[0]}: members must come "
                                 f"from the same data (DATA_DIR)")
        if m.text.norm != first.text.norm or m.text.numbers != first.text.numbers:
            raise ValueError(f"ensemble: {name} normalises its input differently from {names[0]}")
    return Translator([model for m in members for model in m.models], first.text, first.options, first.device,
                      origin=dict(first.origin, ensemble=names))


def export_model(translator: Translator, path: str) -> None:
    """One self-contained file for inference: weights (fp32), config, both SentencePiece models, the
    normalisation flags, the target language, the training length limits and where it came from. Written through
    the file layer (data_prep.files): a temporary file renamed into place; never onto a file this command read
    or protects (the run it came from: trainer.inference.cli), nor over a file that is not a model file."""
    text = translator.text
    blob = {"format": model_files.EXPORT_FORMAT, "version": model_files.EXPORT_VERSION,
            "config": translator.origin["config"],
            "model": {k: v.detach().float().cpu() for k, v in translator.model.state_dict().items()},
            "spm_src": model_files.bytes_tensor(text.src_sp.serialized_model_proto()),
            "spm_tgt": model_files.bytes_tensor(text.tgt_sp.serialized_model_proto()),
            "normalize": dict(text.norm), "normalize_tgt": dict(text.norm_tgt), "tgt_lang": text.tgt_lang,
            "limits": text.limits.as_dict(), "numbers": text.numbers,
            "origin": {k: v for k, v in translator.origin.items() if k != "config"}}
    with files.replace(path, "the model file", flag="--out", binary=True, ours=model_files.is_export) as f:
        torch.save(blob, f)
