#!/usr/bin/env bash
# The main job on the embedded default: generate the demo patent-claim corpus (English -> Japanese, both
# written as patents are: capitalised, untokenised English; Japanese without spaces), prepare it (SentencePiece
# pieces within MeCab's words on the Japanese side, ordinals 第1..第9 as one piece, number placeholders,
# binarized), train with the paper's hybrid
# parallelism on 2 local ranks, then translate the test set on one process and print sacreBLEU BLEU/chrF
# (BLEU tokenized by MeCab, ja-mecab, as for any Japanese target).
# Prints test BLEU/chrF beside the word-by-word baseline, then three test sentences; writes the training plot.
# Environment overrides: RANKS (2), DS_CONFIG (ds_configs/demo_hybrid_2.json: hybrid_2 with the demo's
# learning rate, 1e-2), STEPS (1500: the steps trained) of SCHEDULE (1500: the LR schedule's length, demo.yaml's
# train.max_steps; STEPS above it lengthen it): the demo's model (a residual second layer, concat attention)
# leaves the plateau where the claim frame is right and the nouns wrong by step 750, and has the other half of the
# schedule, which decays to 0 at its last step, to converge (docs/training.md, "The quickstart";
# docs/journal/2026-12-05.md), MAX_WORDS (20: the longest English claim; the generator's default is 50), WORK
# (data and runs go under here; default: the repo's data/ and runs/).
# Arguments: config overrides for the training run, KEY=VALUE after the demo's YAML (e.g. train.seed=2).
# A rerun starts a new run: an earlier runs/demo is kept aside, moved to runs/demo.prev-DATE-TIME (it says so;
# delete those when you no longer need them). data/demo is prepared again (the same corpus, from the same seed).
# Each phase (data: the corpus and prepare, each also on its own line; train; evaluate; plot) prints its wall
# and CPU seconds and the load average (launch/phases.sh); the last line sums them.
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${RANKS:-2}
DS_CONFIG=${DS_CONFIG:-ds_configs/demo_hybrid_2.json}
WORK=${WORK:-.}
MAX_WORDS=${MAX_WORDS:-20}
DATA=$WORK/data/demo
TEXT=${DATA}_text
RUN=$WORK/runs/demo
STEPS=${STEPS:-1500}
SCHEDULE=${SCHEDULE:-1500}
[ "$STEPS" -gt "$SCHEDULE" ] && SCHEDULE=$STEPS
source launch/phases.sh

# No GPU: say so, so that DeepSpeed's launcher does not probe for one and warn (README, "Two commands").
command -v nvidia-smi > /dev/null 2>&1 || export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}

MAX_WORDS=$MAX_WORDS phase data bash launch/prepare_demo.sh "$DATA"  # the corpus into ${DATA}_text, prepared into $DATA
if [ -e "$RUN" ]; then  # never delete a run (it may be one resumed for hours): keep it aside
    KEPT="$RUN.prev-$(date +%Y%m%d-%H%M%S)"
    n=1; while [ -e "$KEPT" ]; do KEPT="$RUN.prev-$(date +%Y%m%d-%H%M%S)-$n"; n=$((n + 1)); done
    mv "$RUN" "$KEPT"
    echo "quickstart: $RUN exists: kept it as $KEPT; training a new run in $RUN"
fi
phase train deepspeed --log_level error --num_gpus "$RANKS" launch/train.py --deepspeed_config "$DS_CONFIG" --config trainer/configs/demo.yaml \
    data.dir="$DATA" run.dir="$RUN" train.max_steps="$STEPS" train.schedule_steps="$SCHEDULE" "$@"
# Test BLEU/chrF beside the word-by-word baseline (a lexicon in English word order), then three sentences.
phase evaluate python launch/evaluate.py --run "$RUN" --src "$TEXT/test.en" --ref "$TEXT/test.ja" --output "$RUN/test.hyp" \
    --baseline "$TEXT/test.baseline.ja" --show 3
phase plot python launch/plot.py "$RUN"
phases_total
