#!/usr/bin/env bash
# The demo corpus, prepared: what launch/quickstart.sh trains on and the default YAML's data.dir (data/demo).
# Generates the demo patent-claim corpus (English -> Japanese; nothing is downloaded) into DATA_DIR_text and
# prepares it into DATA_DIR (SentencePiece BPE, 8k pieces per side, number placeholders, binarized).
#   bash launch/prepare_demo.sh [DATA_DIR]      (default data/demo; about 20 s on 2 cores)
# Environment overrides: PAIRS (20000), MAX_WORDS (20: the longest English claim; the generator's default is 50),
# VOCAB (8000). Preparing again replaces DATA_DIR (prepare's own output; the same corpus from the same seed).
# Each of its two phases prints its wall and CPU seconds (launch/phases.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-data/demo}
TEXT=${DATA}_text
source launch/phases.sh
phase corpus python -m data_prep.demo_corpus --out "$TEXT" --pairs "${PAIRS:-20000}" --seed 1 --max-words "${MAX_WORDS:-20}" \
    --baseline-out "$TEXT/test.baseline.ja"
phase prepare python -m data_prep.prepare --format moses --src-lang en --tgt-lang ja --train-src "$TEXT/train.en" --train-tgt "$TEXT/train.ja" \
    --dev-src "$TEXT/dev.en" --dev-tgt "$TEXT/dev.ja" --test-src "$TEXT/test.en" --test-tgt "$TEXT/test.ja" \
    --out "$DATA" --vocab-size "${VOCAB:-8000}" --model-type bpe --number-placeholders 8
