#!/usr/bin/env bash
# The main job on the embedded default: generate the demo patent-claim corpus (English -> Japanese, both
# written as patents are: capitalised, untokenised English; Japanese without spaces), prepare it (SentencePiece
# pieces within MeCab's words on the Japanese side, ordinals 第1..第9 as one piece, number placeholders,
# binarized), train with the paper's hybrid
# parallelism on 2 local ranks, then translate the test set on one process and print sacreBLEU BLEU/chrF
# (BLEU tokenized by MeCab, ja-mecab, as for any Japanese target).
# Prints test BLEU/chrF beside the word-by-word baseline, then three test sentences; writes the training plot.
# Environment overrides: RANKS (2), DS_CONFIG (ds_configs/demo_hybrid_2.json: hybrid_2 with the demo's
# learning rate, 5e-3), STEPS (2000: the steps trained) of SCHEDULE (3000: the LR schedule's length, demo.yaml's
# train.max_steps; STEPS above it lengthen it): by step 2000 of the 3000-step schedule dev BLEU has converged, while
# a schedule that decays over 2000 steps never learns the content words (docs/BENCHMARKS.md 6.8), MAX_WORDS (20:
# the longest English claim; the generator's default is 50), WORK (data and runs go under here; default: the
# repo's data/ and runs/).
# Arguments: config overrides for the training run, KEY=VALUE after the demo's YAML (e.g. train.seed=2).
# Each phase prints its wall and CPU seconds (its processes' user + sys) and the load average when it ended;
# the last line sums them (the time a reader can compare with docs/BENCHMARKS.md 6.8).
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${RANKS:-2}
DS_CONFIG=${DS_CONFIG:-ds_configs/demo_hybrid_2.json}
WORK=${WORK:-.}
MAX_WORDS=${MAX_WORDS:-20}
TEXT=$WORK/data/demo_text
DATA=$WORK/data/demo
RUN=$WORK/runs/demo
STEPS=${STEPS:-2000}
SCHEDULE=${SCHEDULE:-3000}
[ "$STEPS" -gt "$SCHEDULE" ] && SCHEDULE=$STEPS

# phase NAME COMMAND...: runs COMMAND and prints its wall and CPU seconds; the sums go on the last line.
START=${EPOCHREALTIME:-$(date +%s)} SUMMARY="" CPU=0
cpu_seconds() {  # CPU=user + sys of the processes this shell has waited for (`times` in this shell, not a subshell)
    times > "$TIMES"
    CPU=$(awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] } printf "%.1f", t }' "$TIMES")
}
phase() {
    local name=$1 t0=${EPOCHREALTIME:-$(date +%s)} c0 line; shift
    cpu_seconds; c0=$CPU
    "$@"
    cpu_seconds
    line=$(awk -v n="$name" -v t0="$t0" -v t1="${EPOCHREALTIME:-$(date +%s)}" -v c0="$c0" -v c1="$CPU" \
        'BEGIN { printf "%s %.1f s (CPU %.1f s)", n, t1 - t0, c1 - c0 }')
    echo "quickstart: $line, load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
    SUMMARY="$SUMMARY${SUMMARY:+, }$line"
}
TIMES=$(mktemp)
trap 'rm -f "$TIMES"' EXIT

# No GPU: say so, so that DeepSpeed's launcher does not probe for one and warn (README, "Two commands").
command -v nvidia-smi > /dev/null 2>&1 || export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}

phase corpus python -m data_prep.demo_corpus --out "$TEXT" --pairs 20000 --seed 1 --max-words "$MAX_WORDS" \
    --baseline-out "$TEXT/test.baseline.ja"
phase prepare python -m data_prep.prepare --format moses --src-lang en --tgt-lang ja --train-src "$TEXT/train.en" --train-tgt "$TEXT/train.ja" \
    --dev-src "$TEXT/dev.en" --dev-tgt "$TEXT/dev.ja" --test-src "$TEXT/test.en" --test-tgt "$TEXT/test.ja" \
    --out "$DATA" --vocab-size 8000 --model-type bpe --number-placeholders 8
rm -rf "$RUN"
phase train deepspeed --log_level error --num_gpus "$RANKS" launch/train.py --deepspeed_config "$DS_CONFIG" --config trainer/configs/demo.yaml \
    data.dir="$DATA" run.dir="$RUN" \
    train.max_steps="$STEPS" train.schedule_steps="$SCHEDULE" "$@"
# Test BLEU/chrF beside the word-by-word baseline (a lexicon in English word order), then three sentences.
phase evaluate python launch/evaluate.py --run "$RUN" --src "$TEXT/test.en" --ref "$TEXT/test.ja" --output "$RUN/test.hyp" \
    --baseline "$TEXT/test.baseline.ja" --show 3
phase plot python launch/plot.py "$RUN"
cpu_seconds
echo "quickstart: $SUMMARY; total $(awk -v t0="$START" -v t1="${EPOCHREALTIME:-$(date +%s)}" \
    'BEGIN { printf "%.1f", t1 - t0 }') s (CPU $CPU s)"
