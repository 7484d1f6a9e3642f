#!/usr/bin/env bash
# The GPU check rehearsed on the CPU in the device's Python: a CPython 3.12 virtual environment holding
# exactly the image's packages of benchmarks/gpu/gpu_image.txt (torch 2.11.0 from PyPI with the CUDA libraries
# it names, as the image has them: ~2.6 GB of wheels, a ~4.8 GB environment, both cached), the carried
# wheels of .whl/ installed as on the device (pip --no-index --no-deps --target, PYTHONPATH), and
# `gpu_check.sh --cpu` run in it from a bare environment, end to end. A package the device lacks or holds
# in a version a carried wheel cannot use fails here as it would there.
#
#   bash benchmarks/gpu/gpu_rehearsal.sh [--image-pin NAME==VERSION ...] [-- ARGS of gpu_check.py]
#   bash benchmarks/gpu/gpu_rehearsal.sh --build-only   # the environment and .whl/ only, then exit 0
#
#   --image-pin NAME==VERSION   rehearse against another version of an image package (installed in front
#                               of the environment's own, as if the image held it), e.g.
#                               --image-pin typing-extensions==4.12.2 (too old for the carried pydantic)
# Environment: GPU_REHEARSAL_CACHE (default .rehearsal/ in the checkout, ignored by git): wheels, the
# environment (rebuilt when gpu_image.txt changes), prepared data, OUT. PYTHON312: the interpreter
# (default python3.12 on PATH, else pyenv's newest 3.12). .whl/ is made first if missing
# (gpu_wheels.sh --wheels-only, network). One build at a time ($CACHE/build.lock): a second invocation waits
# for the first's build and uses it (the test suite starts a --build-only in the background when it collects
# the rehearsal's test, so that its minutes of download overlap the tests before it). Exit 0 only if the
# carried wheels fit the image and the check passed; its report is in $GPU_REHEARSAL_CACHE/out. Exit 3, with
# one line and nothing written, where the cache's file system has less free than a build needs
# (GPU_REHEARSAL_NEED_MB, default 9000: the environment and its wheels, measured 7.5 GB, and room left for
# whatever runs beside it); the image's wheels are removed once the environment is built. Where the
# wheels do not fit, the check runs its imports
# and environment stage only (unless ARGS name --stages).
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE="${GPU_REHEARSAL_CACHE:-$PWD/.rehearsal}"
PINS=()
CHECK_ARGS=()
BUILD_ONLY=0
while (( $# )); do
  case "$1" in
    --build-only) BUILD_ONLY=1; shift ;;
    --image-pin) PINS+=("$2"); shift 2 ;;
    --image-pin=*) PINS+=("${1#*=}"); shift ;;
    --) shift; CHECK_ARGS=("$@"); break ;;
    *) echo "gpu_rehearsal: unknown argument $1 (--image-pin NAME==VERSION, --build-only, -- ARGS)" >&2; exit 2 ;;
  esac
done
export PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH  # nothing of the caller's (a checkout's egg-info, say) may look installed in the environment
START=$(date +%s)
say() { echo "gpu_rehearsal: [$(( $(date +%s) - START ))s] $*"; }
quiet_pip() { grep -v "is ignored: it is neither a file nor a directory" || true; }  # this machine's pip.conf

python312() {  # the first candidate that runs and is CPython 3.12 (a pyenv shim may only say where one is)
  local py
  for py in "${PYTHON312:-}" python3.12 $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 2>/dev/null \
      | sort -rV); do
    [[ -n "$py" ]] && "$py" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 \
      && { command -v "$py"; return 0; }
  done
  return 1
}
PY312=$(python312) || { echo "gpu_rehearsal: no CPython 3.12 found: set PYTHON312" >&2; exit 2; }
IMAGE=benchmarks/gpu/gpu_image.txt
KEY="$(sha256sum "$IMAGE" | cut -c1-12)-$("$PY312" -c 'import platform; print(platform.python_version())')"
VENV="$CACHE/venv-$KEY"
mkdir -p "$CACHE/wheels"
exec 9>"$CACHE/build.lock"
if ! flock -n 9; then
  say "another invocation is building $CACHE: waiting for it"
  flock 9
fi
if [[ ! -f "$VENV/.complete" ]]; then
  rm -rf "$CACHE"/venv-*  # an incomplete or older environment: its room goes to this one
  NEED_MB="${GPU_REHEARSAL_NEED_MB:-9000}"
  FREE_MB=$(( $(df -Pk "$CACHE" | awk 'NR == 2 {print $4}') / 1024 ))
  if (( FREE_MB < NEED_MB )); then  # a full disk would fail this build and, beside it, everything else
    echo "gpu_rehearsal: not built: ${FREE_MB} MB free on the file system of $CACHE, a build needs ${NEED_MB} MB" \
      "(GPU_REHEARSAL_NEED_MB; GPU_REHEARSAL_CACHE elsewhere)" >&2
    exit 3
  fi
  say "building $VENV with $("$PY312" --version) ($PY312): the image's packages of $IMAGE"
  trap 'rm -rf "$VENV" "$CACHE/wheels"' EXIT  # a build that fails gives its room back
  "$PY312" -m venv "$VENV"
  "$VENV/bin/python" -m pip download -q --no-deps -d "$CACHE/wheels" -r "$IMAGE" 2>&1 | quiet_pip
  "$VENV/bin/python" -m pip install -q --no-index --find-links "$CACHE/wheels" --no-deps -r "$IMAGE" 2>&1 | quiet_pip
  "$VENV/bin/python" -m pip check
  touch "$VENV/.complete"
  trap - EXIT
  say "built: $(du -sh "$VENV" | cut -f1) (its wheels, $(du -sh "$CACHE/wheels" | cut -f1), removed)"
  rm -rf "$CACHE/wheels" && mkdir -p "$CACHE/wheels"
fi
"$VENV/bin/python" -m benchmarks.gpu.gpu_rehearsal --check-venv  # nothing the image lacks

[[ -n "$(ls .whl/*.whl 2>/dev/null)" ]] || { say "no .whl/: making it"; bash benchmarks/gpu/gpu_wheels.sh --wheels-only; }
flock -u 9
(( BUILD_ONLY )) && { say "built: $VENV and .whl/"; exit 0; }
FAILED=0
PIN_ARGS=()
for pin in "${PINS[@]}"; do PIN_ARGS+=(--image-pin "$pin"); done
"$VENV/bin/python" -m benchmarks.gpu.gpu_rehearsal --check-wheels .whl "${PIN_ARGS[@]}" || FAILED=1
if (( FAILED )) && [[ " ${CHECK_ARGS[*]} " != *" --stages"* ]]; then
  # the wheels do not fit the image: the device would fail the same way, so the check's imports and its
  # environment stage show how (the try it would spend), not its every stage (minutes that prove nothing more)
  say "the carried wheels do not fit the image: running the check's imports and environment stage only"
  CHECK_ARGS+=(--stages environment)
fi

OVERLAY=""
if (( ${#PINS[@]} )); then  # the pinned versions in front of the environment's own, as if the image held them
  OVERLAY="$CACHE/overlay-$(printf '%s\n' "${PINS[@]}" | sha256sum | cut -c1-12)"
  if [[ ! -d "$OVERLAY" ]]; then
    "$VENV/bin/python" -m pip download -q --no-deps -d "$CACHE/wheels" "${PINS[@]}" 2>&1 | quiet_pip
    "$VENV/bin/python" -m pip install -q --no-index --find-links "$CACHE/wheels" --no-deps --target "$OVERLAY" \
      "${PINS[@]}" 2>&1 | quiet_pip
  fi
  say "image pins ${PINS[*]}: $OVERLAY"
fi

# the data as the device gets it: prepared beforehand with the project's Python (gpu_wheels.sh does this
# for the device), read there as prepared
PROJECT_PY=$(bash benchmarks/gpu/gpu_wheels.sh --which-python)
PYTHONPATH="$PWD" "$PROJECT_PY" -m benchmarks.gpu.gpu_check --prepare-only --device cpu --work "$CACHE/gpudata" >/dev/null
rm -rf "$CACHE/out" "$CACHE/work"
say "gpu_check.sh --cpu in $VENV, carried wheels as on the device"
env -i HOME="$HOME" PATH="$VENV/bin:/usr/local/bin:/usr/bin:/bin" LANG=C.UTF-8 \
  ${OVERLAY:+PYTHONPATH="$OVERLAY"} GPU_CHECK_CARRY=1 GPU_CHECK_SITE="$CACHE/site" OUT="$CACHE/out" \
  bash benchmarks/gpu/gpu_check.sh --cpu --work "$CACHE/work" --data-root "$CACHE/gpudata" "${CHECK_ARGS[@]}" || FAILED=1
say "$( (( FAILED )) && echo FAILED || echo passed): report $CACHE/out/gpu_check.json"
exit "$FAILED"
