"""Text in, text out: normalisation, segmentation of long inputs, SentencePiece, batched beam search over
one model or an ensemble, detokenisation and the source's formulas put back.

What happens to one input line (`Translator.translate_nbest`):
1. it is normalised as the training data was (`manifest["normalize"]`); each formula the markup step
   replaces by "⟨formula⟩" is remembered;
2. an empty line becomes an empty translation (no decoding: a model would invent one);
3. a line longer than the training data allowed (`data_prep.segment.TrainingLimits`, from the manifest)
   is cut at sentence, then clause boundaries; segments are translated independently and rejoined;
4. each segment is decoded in length-sorted batches (at most `decode.batch_size` sentences and
   `decode.max_tokens` padded source pieces);
5. the placeholders of the translation get the source's formulas back, in order; with number
   placeholders (`manifest["numbers"]`, data_prep.numbers) the input's numbers were masked after step 1
   and each `⟨nK⟩` of the translation becomes the K-th number of the input.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np
import torch
from omegaconf import OmegaConf

from data_prep.dataformat import (EOS_ID, PAD_ID, PLACEHOLDER, SPM_MODELS, TrainingLimits, join_segments, normalize,
                                  numbers, repair, restore_formulas, segment)
from trainer import checkpoint, model_files, run_files
from trainer.config import load_config
from trainer.data import to_device
from trainer.metrics import manifest_lang
from trainer.model import Seq2Seq
from trainer.search import Ensemble, Hypothesis, beam_search_nbest

RUN_FILES = (SPM_MODELS["src"], SPM_MODELS["tgt"])
DATA_MANIFEST = "data_manifest.json"
EXPORT_FORMAT = "hybrid-nmt/model"
EXPORT_VERSION = 1
EXPORT_KEYS = ("version", "config", "model", "spm_src", "spm_tgt", "normalize", "origin")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def _tensor_bytes(t, where: str) -> bytes:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 1:
        raise model_files.ModelFileError(f"{where}: expected the model's bytes (a 1-d uint8 tensor)")
    return t.numpy().tobytes()


def one_line(text: str) -> str:
    """Output text never breaks the one-line-per-input contract: byte fallback can spell a control
    character, a tab or a line break, and a restored formula may hold one. `normalize` without flags
    deletes control characters and makes every whitespace run one space."""
    return normalize(text)


@dataclass
class Translated:
    """One hypothesis of one input line."""

    text: str
    score: float  # log-prob / (pieces + segments)^length_penalty (log-prob and pieces summed over segments)
    logprob: float  # natural log, over all segments, end-of-sentence included
    pieces: int  # target pieces, end-of-sentence not included
    alignment: list[tuple[int, int]] = field(default_factory=list)  # (source piece, target piece) pairs


class Translator:
    def __init__(self, model: Seq2Seq | list[Seq2Seq], src_sp, tgt_sp, norm: dict, decode_cfg, device=None, *,
                 tgt_lang: str | None = None, limits: TrainingLimits | None = None, norm_tgt: dict | None = None,
                 number_slots: dict | None = None):
        self.device = torch.device(device or default_device())
        self.models = [m.to(self.device).eval() for m in (model if isinstance(model, list) else [model])]
        self.src_sp, self.tgt_sp, self.norm, self.decode_cfg = src_sp, tgt_sp, norm, decode_cfg
        self.norm_tgt = norm_tgt if norm_tgt is not None else {}
        self.tgt_lang, self.limits = tgt_lang, limits or TrainingLimits()
        self.numbers = number_slots  # manifest["numbers"]: None, or {"slots": N, "fullwidth": bool}
        self.origin: dict = {}

    @property
    def model(self) -> Seq2Seq:
        return self.models[0]

    # ---- loading ----
    @classmethod
    def from_run(cls, run_dir: str, which: str = "best", device=None, *, allow_unverified: bool = False
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
        number_slots = model_files.number_slots(manifest.get("numbers"), manifest_path)
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
        translator = cls(model, src_sp, tgt_sp, norm, cfg.decode, device,
                         tgt_lang=manifest_lang(manifest), limits=TrainingLimits.from_manifest(manifest),
                         norm_tgt=model_files.normalize_flags(manifest.get("normalize_tgt", {}), manifest_path),
                         number_slots=number_slots)
        translator.origin = {"run_dir": os.path.abspath(run_dir), "checkpoint": os.path.basename(ckpt),
                             "step": meta.get("step"), "dev_bleu": meta.get("dev_bleu"),
                             "data_checksum": manifest.get("checksum"), "config": OmegaConf.to_container(cfg)}
        return translator

    @classmethod
    def averaged(cls, run_dir: str, checkpoints: list[str], device=None) -> "Translator":
        """One model whose weights are the mean of these checkpoints' (of one run: the same shapes)."""
        if not checkpoints:
            raise ValueError("no checkpoint to average")
        translator = cls.from_run(run_dir, checkpoints[0], device="cpu")
        total = {k: v.detach().double().clone() for k, v in translator.model.state_dict().items()}
        names = [translator.origin["checkpoint"]]
        for which in checkpoints[1:]:  # each verified and checked against the config like the first
            other = cls.from_run(run_dir, which, device="cpu")
            names.append(other.origin["checkpoint"])
            for k, v in other.model.state_dict().items():
                total[k] += v.double()
        translator.model.load_state_dict({k: v / len(checkpoints) for k, v in total.items()})
        translator.device = torch.device(device or default_device())
        translator.models = [translator.model.to(translator.device)]
        translator.origin.update(checkpoint="average(" + ",".join(names) + ")", averaged=names, dev_bleu=None)
        return translator

    def export(self, path: str) -> None:
        """One self-contained file for inference: weights (fp32), config, both SentencePiece models,
        the normalisation flags, the target language, the training length limits and where it came from.
        Written to a temporary name, then renamed."""
        blob = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "config": self.origin["config"],
                "model": {k: v.detach().float().cpu() for k, v in self.model.state_dict().items()},
                "spm_src": _bytes_tensor(self.src_sp.serialized_model_proto()),
                "spm_tgt": _bytes_tensor(self.tgt_sp.serialized_model_proto()),
                "normalize": dict(self.norm), "normalize_tgt": dict(self.norm_tgt), "tgt_lang": self.tgt_lang,
                "limits": self.limits.as_dict(), "numbers": self.numbers,
                "origin": {k: v for k, v in self.origin.items() if k != "config"}}
        self._check_output(path)
        tmp = path + ".tmp"
        with run_files.open_write(os.path.dirname(path) or ".", os.path.basename(tmp), binary=True, where="--out") as f:
            torch.save(blob, f)
        os.replace(tmp, path)

    def _check_output(self, path: str) -> None:
        """An exported model never lands on the run it came from: not inside its checkpoints (a checkpoint
        file written over fails its checksum; a new one makes the checkpoint fail `verify`), and not on the
        files the run translates with."""
        run_dir = self.origin.get("run_dir")
        if not run_dir:
            return
        out = os.path.realpath(path)
        ckpts = os.path.realpath(checkpoint.root(run_dir))
        if out == ckpts or out.startswith(ckpts + os.sep):
            raise ValueError(f"--out {path}: inside the run's checkpoints ({checkpoint.root(run_dir)}), which only the "
                             f"trainer writes; write the model file elsewhere")
        own = {os.path.realpath(os.path.join(run_dir, n)) for n in (*RUN_FILES, DATA_MANIFEST, "config.yaml")}
        if out in own:
            raise ValueError(f"--out {path}: a file of the run ({os.path.basename(out)}); write the model file "
                             f"elsewhere")

    @classmethod
    def from_export(cls, path: str, device=None) -> "Translator":
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
        norm_tgt = model_files.normalize_flags(blob.get("normalize_tgt", {}), f"{where}: normalize_tgt")
        number_slots = model_files.number_slots(blob.get("numbers"), where)
        model = model_files.build_checked(cfg, src_sp.get_piece_size(), tgt_sp.get_piece_size(),
                                          [(where, blob["model"])], whole=True)
        limits = blob.get("limits") or {}
        if not isinstance(limits, dict):
            raise model_files.ModelFileError(f"{where}: limits: expected a mapping")
        tgt_lang = blob.get("tgt_lang")
        if tgt_lang is not None and not isinstance(tgt_lang, str):
            raise model_files.ModelFileError(f"{where}: tgt_lang: expected a language code")
        translator = cls(model, src_sp, tgt_sp, norm, cfg.decode, device, tgt_lang=tgt_lang,
                         limits=TrainingLimits.from_manifest({"filters": limits}), norm_tgt=norm_tgt,
                         number_slots=number_slots)
        origin = blob["origin"] if isinstance(blob["origin"], dict) else {}
        translator.origin = dict(origin, config=OmegaConf.to_container(cfg))
        return translator

    @classmethod
    def ensemble(cls, members: list["Translator"], names: list[str]) -> "Translator":
        """The members' models decoding as one (`trainer.search.Ensemble`); the first member's text
        handling and decoding settings apply. Members must share both vocabularies and normalisation."""
        first = members[0]
        for m, name in zip(members[1:], names[1:]):
            for what, a, b in (("source SentencePiece model", first.src_sp, m.src_sp),
                               ("target SentencePiece model", first.tgt_sp, m.tgt_sp)):
                if a.serialized_model_proto() != b.serialized_model_proto():
                    raise ValueError(f"ensemble: {name} has another {what} than {names[0]}: members must come "
                                     f"from the same data (DATA_DIR)")
            if m.norm != first.norm or m.numbers != first.numbers:
                raise ValueError(f"ensemble: {name} normalises its input differently from {names[0]}")
        first.models = [model.to(first.device) for m in members for model in m.models]
        first.origin = dict(first.origin, ensemble=names)
        return first

    # ---- text ----
    def source(self, line: str) -> tuple[list[list[int]], tuple[list[str], list[str]]]:
        """A line's segments as piece ids (none for an empty line) and what its placeholders stand for:
        (formulas, numbers)."""
        formulas: list[str] = []
        text = repair(line, **self.norm, formulas=formulas)[0]
        if not self.norm.get("markup"):  # placeholders typed into the input stand for themselves
            formulas = [PLACEHOLDER] * text.count(PLACEHOLDER)
        text, nums = self.mask(text)
        if not text:
            return [], (formulas, nums)
        ids = self.src_sp.encode(text)
        if self.limits.fits(text, len(ids)):
            return [ids], (formulas, nums)
        parts = segment(text, lambda t: len(self.src_sp.encode(t)), self.limits)
        return [self.src_sp.encode(p) for p in parts], (formulas, nums)

    def mask(self, text: str) -> tuple[str, list[str]]:
        """Normalised input text with its numbers as placeholders, if the data had them, and the numbers."""
        return numbers.mask_source(text, self.numbers["slots"]) if self.numbers else (text, [])

    def encode(self, line: str) -> list[int]:
        return self.src_sp.encode(self.mask(normalize(line, **self.norm))[0])

    def decode_settings(self, beam, max_len_ratio, length_penalty, batch_size, max_tokens) -> dict:
        """The decoding options (None: the config's), checked; a bad one is a ValueError naming its flag."""
        d = self.decode_cfg
        beam = d.beam if beam is None else beam
        if beam < 1:
            raise ValueError(f"--beam {beam}: the beam size must be >= 1 (1 = greedy)")
        ratio = d.max_len_ratio if max_len_ratio is None else max_len_ratio
        if not (math.isfinite(ratio) and ratio > 0):  # nan/inf/negative: every hypothesis empty, silently
            raise ValueError(f"--max-len-ratio {ratio}: must be a finite number > 0 (longest hypothesis = source "
                             f"pieces x ratio + {d.max_len_add})")
        penalty = d.length_penalty if length_penalty is None else length_penalty
        if not math.isfinite(penalty):
            raise ValueError(f"--length-penalty {penalty}: must be a finite number")
        for flag, value in (("--batch-size", batch_size), ("--max-tokens", max_tokens)):
            if value is not None and value < (1 if flag == "--batch-size" else 0):
                raise ValueError(f"{flag} {value}: must be >= {1 if flag == '--batch-size' else 0}")
        return dict(beam=beam, max_len_ratio=ratio,
                    max_len_add=d.max_len_add,
                    length_penalty=d.length_penalty if length_penalty is None else length_penalty,
                    batch_size=batch_size or d.batch_size,
                    max_tokens=d.max_tokens if max_tokens is None else max_tokens)

    def batches(self, lengths: list[int], batch_size: int, max_tokens: int) -> list[list[int]]:
        """Indices into `lengths` (source pieces), longest first, cut into batches of at most `batch_size`
        sentences and `max_tokens` padded source pieces (0: no token cap; a batch holds at least one)."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        out: list[list[int]] = []
        for i in order:
            if out and len(out[-1]) < batch_size and (not max_tokens or
                                                      (len(out[-1]) + 1) * (lengths[out[-1][0]] + 1) <= max_tokens):
                out[-1].append(i)
            else:
                out.append([i])
        return out

    def translate_ids(self, src_ids: list[list[int]], *, beam: int, max_len_ratio: float, max_len_add: int,
                      length_penalty: float, batch_size: int, max_tokens: int = 0,
                      n_best: int = 1) -> list[list[Hypothesis]]:
        out: list[list[Hypothesis]] = [[] for _ in src_ids]
        for idx in self.batches([len(s) for s in src_ids], batch_size, max_tokens):
            lengths = np.array([len(src_ids[i]) + 1 for i in idx])  # with EOS; on the host, as the encoder wants
            src = np.full((len(idx), int(lengths.max())), PAD_ID, dtype=np.int64)
            for row, i in enumerate(idx):
                src[row, :lengths[row]] = src_ids[i] + [EOS_ID]
            max_len = torch.from_numpy((lengths.astype(np.float32) * np.float32(max_len_ratio)).astype(np.int64)
                                       + max_len_add)
            hyps = beam_search_nbest(self.models, to_device(src, self.device), torch.from_numpy(lengths), beam=beam,
                                     max_len=max_len, length_penalty=length_penalty, n_best=n_best)
            for i, h in zip(idx, hyps):
                out[i] = h
        return out

    def line_cap(self, max_line_bytes: int | None = None) -> int:
        """The longest input line (UTF-8 bytes) that is translated: `max_line_bytes`, else decode.max_line_bytes
        (0: no cap)."""
        cap = getattr(self.decode_cfg, "max_line_bytes", 0) if max_line_bytes is None else max_line_bytes
        if cap < 0:
            raise ValueError(f"--max-line-bytes {cap}: must be >= 0 (0 = no cap)")
        return cap

    @staticmethod
    def oversized(line: str, cap: int) -> bool:
        """Longer than `cap` UTF-8 bytes (cap 0: never). Such a line is not translated: it would be cut into
        thousands of segments, each decoded to the maximum length (a 2 MB line without spaces: 16k segments,
        no output after minutes), and hold up every line after it."""
        return bool(cap) and len(line) > cap // 4 and len(line.encode("utf-8", "surrogatepass")) > cap

    def translate_nbest(self, lines: list[str], *, n_best: int = 1, beam: int | None = None,
                        max_len_ratio: float | None = None, length_penalty: float | None = None,
                        batch_size: int | None = None, max_tokens: int | None = None,
                        alignments: bool = False, max_line_bytes: int | None = None) -> list[list[Translated]]:
        """Per line its `n_best` translations, best first. For a line cut into segments, the k-th
        translation joins every segment's k-th best. A line over `line_cap` bytes gets an empty translation
        (the callers count and report it)."""
        opts = self.decode_settings(beam, max_len_ratio, length_penalty, batch_size, max_tokens)
        cap = self.line_cap(max_line_bytes)
        sources = [([], ([], [])) if self.oversized(line, cap) else self.source(line) for line in lines]
        flat = [ids for segments, _ in sources for ids in segments]
        hyps = iter(self.translate_ids(flat, n_best=n_best, **opts))
        out = []
        for segments, held in sources:
            seg_hyps = [next(hyps) for _ in segments]
            out.append([self._join(segments, [h[min(k, len(h) - 1)] if h else Hypothesis([], 0.0, 0.0)
                                              for h in seg_hyps], held, opts["length_penalty"], alignments)
                        for k in range(n_best)])
        return out

    def _join(self, segments: list[list[int]], hyps: list[Hypothesis], held: tuple[list[str], list[str]],
              alpha: float, alignments: bool) -> Translated:
        text = join_segments([self.tgt_sp.decode(h.tokens) for h in hyps], self.tgt_lang)
        logprob, pieces = sum(h.logprob for h in hyps), sum(len(h.tokens) for h in hyps)
        score = logprob / max(pieces + len(hyps), 1) ** alpha if hyps else 0.0
        links, src_off, tgt_off = [], 0, 0
        if alignments:
            for ids, h in zip(segments, hyps):
                links += [(src_off + min(s, len(ids) - 1), tgt_off + t) for t, s in enumerate(h.alignment)]
                src_off, tgt_off = src_off + len(ids), tgt_off + len(h.tokens)
        formulas, nums = held
        if self.numbers:
            text = numbers.restore(text, nums, self.numbers["fullwidth"])
        return Translated(one_line(restore_formulas(text, formulas)), score, logprob, pieces, links)

    def translate(self, lines: list[str], *, beam: int | None = None, max_len_ratio: float | None = None,
                  length_penalty: float | None = None, batch_size: int | None = None) -> list[str]:
        """The best translation of each line."""
        return [n[0].text for n in self.translate_nbest(lines, beam=beam, max_len_ratio=max_len_ratio,
                                                         length_penalty=length_penalty, batch_size=batch_size)]

    # ---- forced decoding ----
    @torch.no_grad()
    def score(self, src_lines: list[str], tgt_lines: list[str], batch_size: int | None = None,
              max_tokens: int | None = None) -> list[tuple[float, int]]:
        """log p(target | source) of given pairs (natural log, end-of-sentence included) and the number of
        target pieces it covers (+1 for the end of sentence), by teacher-forced decoding. No segmentation:
        the pair is scored whole. An empty source or target scores (0.0, 0)."""
        from trainer.data import collate

        opts = self.decode_settings(None, None, None, batch_size, max_tokens)
        masked = [self.mask(normalize(s, **self.norm)) for s in src_lines]
        src = [self.src_sp.encode(text) for text, _ in masked]
        tgt = [self.tgt_sp.encode(numbers.mask_target(normalize(t, **self.norm_tgt), nums,
                                                      numbers.slot_counts(text, len(nums)))[0])
               for t, (text, nums) in zip(tgt_lines, masked)]
        keep = [i for i in range(len(src)) if src[i] and tgt[i]]
        out: list[tuple[float, int]] = [(0.0, 0)] * len(src)
        scorer = Ensemble(self.models)
        lengths = [len(src[i]) + len(tgt[i]) for i in keep]
        for batch in self.batches(lengths, opts["batch_size"], opts["max_tokens"]):
            idx = [keep[j] for j in batch]
            b = collate([np.array(src[i]) for i in idx], [np.array(tgt[i]) for i in idx]).to(self.device)  # pinned, async
            order = sorted(range(len(idx)), key=lambda r: -len(src[idx[r]]))  # collate's row order
            logp = scorer.force(b.src, b.src_lengths, b.tgt_in, b.tgt_out)
            for row, r in enumerate(order):
                out[idx[r]] = (float(logp[row].sum()), len(tgt[idx[r]]) + 1)
        return out


def read_lines(path: str) -> list[str]:
    """One segment per '\\n'-terminated line (not str.splitlines, which also splits on U+2028)."""
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n").rstrip("\r") for line in f]
