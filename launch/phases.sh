# Sourced by launch/quickstart.sh and launch/prepare_demo.sh, so that anyone can see where their minutes went.
# `phase NAME COMMAND...` runs COMMAND and prints "SCRIPT: NAME W s (CPU C s), load average L1 L5 L15": its wall
# seconds, the user + sys seconds of its processes (bash's `times`, read in this shell: a subshell would count
# none) and the load average as it ended (other work on the machine inflates W, much less C). `phases_total`
# prints every phase again and the total since this file was sourced.
PHASES_BY=$(basename "$0" .sh) PHASES="" PHASES_CPU=0 PHASES_START=${EPOCHREALTIME:-$(date +%s)}
PHASES_TIMES=$(mktemp)
trap 'rm -f "$PHASES_TIMES"' EXIT

_phases_cpu() {  # PHASES_CPU = user + sys seconds of the processes this shell has waited for
    times > "$PHASES_TIMES"
    PHASES_CPU=$(awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] }
        printf "%.1f", t }' "$PHASES_TIMES")
}
_phases_since() { awk -v t0="$1" -v t1="${EPOCHREALTIME:-$(date +%s)}" 'BEGIN { printf "%.1f", t1 - t0 }'; }

phase() {
    local name=$1 t0=${EPOCHREALTIME:-$(date +%s)} c0 line; shift
    _phases_cpu; c0=$PHASES_CPU
    "$@"
    _phases_cpu
    line="$name $(_phases_since "$t0") s (CPU $(awk -v a="$c0" -v b="$PHASES_CPU" 'BEGIN { printf "%.1f", b - a }') s)"
    echo "$PHASES_BY: $line, load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
    PHASES="$PHASES${PHASES:+, }$line"
}

phases_total() {
    _phases_cpu
    echo "$PHASES_BY: $PHASES; total $(_phases_since "$PHASES_START") s (CPU $PHASES_CPU s)"
}
