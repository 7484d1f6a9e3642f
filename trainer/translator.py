"""Text in, text out: normalisation, SentencePiece, batched beam search, detokenisation."""
from __future__ import annotations

import os

import torch

from data_prep.binary import EOS_ID, PAD_ID
from data_prep.normalize import normalize
from trainer import checkpoint, model_files
from omegaconf import OmegaConf

from trainer.config import load_config
from trainer.model import Seq2Seq
from trainer.search import beam_search

RUN_FILES = ("spm.src.model", "spm.tgt.model")
DATA_MANIFEST = "data_manifest.json"
EXPORT_FORMAT = "hybrid-nmt/model"
EXPORT_VERSION = 1
EXPORT_KEYS = ("version", "config", "model", "spm_src", "spm_tgt", "normalize", "origin")


def _bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def _tensor_bytes(t, where: str) -> bytes:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 1:
        raise model_files.ModelFileError(f"{where}: expected the model's bytes (a 1-d uint8 tensor)")
    return t.numpy().tobytes()


class Translator:
    def __init__(self, model: Seq2Seq, src_sp, tgt_sp, norm: dict, decode_cfg, device="cpu"):
        self.model, self.src_sp, self.tgt_sp, self.norm = model.to(device).eval(), src_sp, tgt_sp, norm
        self.decode_cfg, self.device = decode_cfg, device
        self.origin: dict = {}

    @classmethod
    def from_run(cls, run_dir: str, which: str = "best", device="cpu", *, allow_unverified: bool = False
                 ) -> "Translator":
        """The model of a run directory's checkpoint (`which`: best | last | a path). The checkpoint must
        verify (trainer.checkpoint) unless `allow_unverified`, or it is the run's own save in progress (the
        trainer's dev decode); every file is checked before the model is built (trainer.model_files)."""
        cfg = load_config(os.path.join(run_dir, "config.yaml"))
        manifest_path = os.path.join(run_dir, DATA_MANIFEST)
        manifest = checkpoint.read_json(manifest_path)
        if not isinstance(manifest, dict):
            raise model_files.ModelFileError(f"{manifest_path}: not a prepare manifest (a JSON object)")
        norm = model_files.normalize_flags(manifest.get("normalize", {}), manifest_path)
        src_sp, tgt_sp = (model_files.sentencepiece(os.path.join(run_dir, n), path=os.path.join(run_dir, n))
                          for n in RUN_FILES)
        ckpt = checkpoint.resolve(run_dir, which)
        unverified_ok = allow_unverified or checkpoint.is_unfinished_save(run_dir, ckpt)
        checkpoint.check_trusted(ckpt, allow_unverified=unverified_ok)
        files = [checkpoint.model_file(ckpt, checkpoint.layer_name(i)) for i in range(cfg.model.layers + 1)]
        files.append(checkpoint.model_file(ckpt, checkpoint.HEAD))
        for index, path in enumerate(files[:-1]):
            if not os.path.lexists(path):
                raise FileNotFoundError(f"{path}: missing layer {index} (checkpoint incomplete or model.layers "
                                        f"differs)")
        model = model_files.build_checked(cfg, src_sp.get_piece_size(), tgt_sp.get_piece_size(),
                                          ((path, checkpoint.load(path)) for path in files))
        meta_path = os.path.join(ckpt, checkpoint.META)
        meta = checkpoint.read_json(meta_path) if os.path.lexists(meta_path) else {}
        meta = meta if isinstance(meta, dict) else {}
        translator = cls(model, src_sp, tgt_sp, norm, cfg.decode, device)
        translator.origin = {"run_dir": os.path.abspath(run_dir), "checkpoint": os.path.basename(ckpt),
                             "step": meta.get("step"), "dev_bleu": meta.get("dev_bleu"),
                             "data_checksum": manifest.get("checksum"), "config": OmegaConf.to_container(cfg)}
        return translator

    def export(self, path: str) -> None:
        """One self-contained file for inference: weights (fp32), config, both SentencePiece models,
        the normalisation flags and where it came from. Written to a temporary name, then renamed."""
        blob = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "config": self.origin["config"],
                "model": {k: v.detach().float().cpu() for k, v in self.model.state_dict().items()},
                "spm_src": _bytes_tensor(self.src_sp.serialized_model_proto()),
                "spm_tgt": _bytes_tensor(self.tgt_sp.serialized_model_proto()),
                "normalize": dict(self.norm), "origin": {k: v for k, v in self.origin.items() if k != "config"}}
        tmp = path + ".tmp"
        torch.save(blob, tmp)
        os.replace(tmp, path)

    @classmethod
    def from_export(cls, path: str, device="cpu") -> "Translator":
        """A model file written by `export`, checked like a run (trainer.model_files) before it is built."""
        if not os.path.exists(path):
            raise FileNotFoundError(f"--model {path}: no such file")
        if not os.path.isfile(path):
            raise ValueError(f"--model {path}: not a regular file")
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise ValueError(f"--model {path}: not a readable model file ({type(e).__name__}: {e})") from None
        if not isinstance(blob, dict) or blob.get("format") != EXPORT_FORMAT:
            raise ValueError(f"--model {path}: not a model exported by launch/export.py")
        where = f"--model {path}"
        missing = [k for k in EXPORT_KEYS if k not in blob]
        if missing:
            raise model_files.ModelFileError(f"{where}: incomplete model file: no {', '.join(missing)}")
        if blob["version"] != EXPORT_VERSION:
            raise model_files.ModelFileError(f"{where}: format version {blob['version']!r}; this program reads "
                                             f"version {EXPORT_VERSION}")
        cfg = model_files.config_from(blob["config"], where)
        src_sp, tgt_sp = (model_files.sentencepiece(f"{where}: {k}", proto=_tensor_bytes(blob[k], f"{where}: {k}"))
                          for k in ("spm_src", "spm_tgt"))
        norm = model_files.normalize_flags(blob["normalize"], f"{where}: normalize")
        model = model_files.build_checked(cfg, src_sp.get_piece_size(), tgt_sp.get_piece_size(),
                                          [(where, blob["model"])], whole=True)
        translator = cls(model, src_sp, tgt_sp, norm, cfg.decode, device)
        origin = blob["origin"] if isinstance(blob["origin"], dict) else {}
        translator.origin = dict(origin, config=OmegaConf.to_container(cfg))
        return translator

    def encode(self, line: str) -> list[int]:
        return self.src_sp.encode(normalize(line, **self.norm))

    def translate_ids(self, src_ids: list[list[int]], *, beam: int, max_len_ratio: float, max_len_add: int,
                      length_penalty: float, batch_size: int) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in src_ids]
        order = sorted(range(len(src_ids)), key=lambda i: -len(src_ids[i]))
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            width = max(len(src_ids[i]) for i in idx) + 1
            src = torch.full((len(idx), width), PAD_ID, dtype=torch.long)
            lengths = torch.zeros(len(idx), dtype=torch.long)
            for row, i in enumerate(idx):
                ids = src_ids[i] + [EOS_ID]
                src[row, :len(ids)] = torch.tensor(ids)
                lengths[row] = len(ids)
            max_len = (lengths.float() * max_len_ratio).long() + max_len_add
            hyps = beam_search(self.model, src.to(self.device), lengths.to(self.device), beam=beam,
                               max_len=max_len, length_penalty=length_penalty)
            for i, hyp in zip(idx, hyps):
                out[i] = hyp
        return out

    def translate(self, lines: list[str], *, beam: int | None = None, max_len_ratio: float | None = None,
                  length_penalty: float | None = None, batch_size: int | None = None) -> list[str]:
        d = self.decode_cfg
        ids = self.translate_ids(
            [self.encode(line) for line in lines], beam=beam or d.beam,
            max_len_ratio=max_len_ratio if max_len_ratio is not None else d.max_len_ratio,
            max_len_add=d.max_len_add,
            length_penalty=length_penalty if length_penalty is not None else d.length_penalty,
            batch_size=batch_size or d.batch_size)
        return [self.tgt_sp.decode(h) for h in ids]


def read_lines(path: str) -> list[str]:
    """One segment per '\\n'-terminated line (not str.splitlines, which also splits on U+2028)."""
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n").rstrip("\r") for line in f]
