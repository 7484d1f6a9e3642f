"""What `data_prep.prepare` (the writer) and the trainer (the reader) agree on: the one module of data_prep
the trainer imports (tests/test_parallel_boundary.py holds the wall).

DATA_DIR, as prepare leaves it:

    manifest.json                 MANIFEST: counts, vocabulary, normalisation flags, filters, checksum
    spm.src.model / spm.tgt.model SPM_MODELS: the SentencePiece models (copied into each run directory)
    {split}.{side}.bin / .idx     token ids (data_prep.binary)

and the text rules applied on both sides of training: the normalisation of translation input
(`normalize`, `repair`, formula and number placeholders), the segmentation of long inputs under the training limits,
the language code of a manifest entry, the output-directory rule (never overwrite what we did not write), and
the file layer every file a user hands us or names goes through (`files`: regular files only, bounded reads,
writes renamed into place, never onto what the command reads; one-line errors), the strict parsing of
JSON and YAML (`userfiles`: every key once, nesting bounded), and the lock of a directory (`lock`: DATA_DIR's
.prepare.lock, run.dir's train.lock).
"""
from __future__ import annotations

from . import files, lock, numbers, userfiles
from .binary import (BOS_ID, EOS_ID, OFFSET_DTYPE, PAD_ID, SIDES, SPECIAL_IDS, TOKEN_DTYPE, UNK_ID, TokenArray,
                     file_sha256, files_checksum, first_out_of_range, has_split, load_pair, open_data,
                     side_paths)
from .clean import base_lang
from .normalize import CJK_SPACES, PLACEHOLDER, normalize, repair, restore_formulas
from .outdir import OutputDirError, check_output_dir, json_marker
from .segment import TrainingLimits, join_segments, segment

MANIFEST = "manifest.json"  # DATA_DIR's manifest (prepare writes it last)
PREPARE_LOCK = ".prepare.lock"  # held by the prepare writing DATA_DIR (data_prep.lock): the trainer refuses it then
SPM_MODELS = {"src": "spm.src.model", "tgt": "spm.tgt.model"}
MAX_SPM_BYTES = 64 << 20  # a SentencePiece model: ~1 MB for 32k pieces, a few MB for the largest vocabularies
MANIFEST_KEYS = ("version", "splits", "vocab", "normalize", "checksum")  # what every manifest holds

__all__ = ["BOS_ID", "CJK_SPACES", "EOS_ID", "MANIFEST", "MANIFEST_KEYS", "MAX_SPM_BYTES", "OFFSET_DTYPE",
           "OutputDirError", "PAD_ID", "PLACEHOLDER", "PREPARE_LOCK", "SIDES", "SPECIAL_IDS", "SPM_MODELS",
           "TOKEN_DTYPE", "TokenArray", "TrainingLimits", "UNK_ID", "base_lang", "check_output_dir", "file_sha256",
           "files", "files_checksum", "first_out_of_range", "has_split", "join_segments", "json_marker", "load_pair",
           "lock", "normalize", "numbers", "open_data", "repair", "restore_formulas", "segment", "side_paths",
           "userfiles"]
