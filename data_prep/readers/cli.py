"""The command-line options of the readers (`python -m data_prep.prepare --help` shows `FORMATS_HELP`)."""
from __future__ import annotations

import argparse

from .tmx import INLINE_MODES

FORMATS_HELP = """\
input formats (--format; the single-file formats take only --train-src, --dev-src, --test-src):
  moses     two line-aligned files (also JPC / WAT / any sentence-per-line pair)
  ntcir     two line-aligned files of `DOCID-SENTID<TAB>text`; the IDs of a line must agree
  tsv       `src<TAB>tgt`, no header, no quoting
  parapat   ParaPat type 2 (`l1<TAB>l2`, column order from a name like en_ja.tsv) or type 1 (header
            `index family_id src_lang src_abs tgt_lang tgt_abs`; rows of other pairs: "other_pair")
  aspec     ASPEC-JE `[score |||] docid ||| n ||| ja ||| en`
  aspec-jc  ASPEC-JC `id ||| ja ||| zh`
  tmx       TMX 1.4b / 1.1, UTF-8 or UTF-16 with BOM, plain or gzipped; <tu>s without both languages:
            "missing_lang"; <prop>s are metadata (--min-score, --ipc)
  opus-zip  an OPUS Moses .zip holding Corpus.l1-l2.l1 and Corpus.l1-l2.l2
  auto      (default) each split's format from its name / first bytes; ambiguous input is an error
--src-lang/--tgt-lang pick the columns, <tuv>s or zip members (en matches en-US and EN_gb; en-US matches
en and en-US). Document ids (ntcir, parapat type 1, aspec, aspec-jc, the TMX source-document prop, OPUS .ids)
are counted per split in the manifest and allow --split-by-doc."""


def add_reader_arguments(parser: argparse.ArgumentParser, formats: list[str]) -> None:
    p = parser.add_argument_group("input (see data_prep/readers and the formats below)")
    p.add_argument("--format", default="auto", choices=["auto", *formats],
                   help="input format (see below); auto: detect per split")
    p.add_argument("--src-lang", default="en", help="source language code (picks columns / <tuv>s / zip members)")
    p.add_argument("--tgt-lang", default="ja", help="target language code")
    p.add_argument("--tmx-inline", choices=INLINE_MODES, default="drop",
                   help="TMX inline markup (<bpt> <ept> <ph> <it> <ut>): drop its codes, or keep them as text")
    p.add_argument("--min-score", type=float, metavar="X",
                   help="reject training pairs whose --score-prop is below X (\"low_score\"); "
                        "pairs without that prop are kept")
    p.add_argument("--score-prop", default="score-bicleaner", metavar="TYPE",
                   help="the TMX <prop type=...> --min-score reads (default: %(default)s)")
    p.add_argument("--ipc", action="append", metavar="PREFIX",
                   help="keep only training pairs whose ipc prop starts with PREFIX (repeatable: any of them; "
                        "spaces and case ignored); pairs without an ipc prop are rejected (\"ipc\")")
    p.add_argument("--split-by-doc", action="store_true",
                   help="hold whole documents of the training input out as dev / test (needs document ids; "
                        "not with --dev-src/--test-src), seeded by --seed")
    p.add_argument("--dev-size", type=int, default=0, metavar="N",
                   help="--split-by-doc: documents are added to dev until it holds >= N pairs")
    p.add_argument("--test-size", type=int, default=0, metavar="N", help="--split-by-doc: the same for test")
