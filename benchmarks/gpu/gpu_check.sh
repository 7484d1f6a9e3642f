#!/usr/bin/env bash
# The GPU check, one prepared script: 8 minutes at most on one GPU (an H200 of the device tool).
#
#   bash benchmarks/gpu/gpu_wheels.sh                  # once, here: .whl/ (wheels) and .gpudata/ (prepared data)
#   bash benchmarks/gpu/gpu_check.sh                   # on the GPU machine (carry .whl and .gpudata)
#   bash benchmarks/gpu/gpu_check.sh --cpu             # the same stages at tiny sizes, no GPU (GPU_CHECK_DEVICE=cpu)
#
# Writes $OUT/gpu_check.log, $OUT/gpu_check.json (rewritten after every stage), $OUT/device_profile.json and
# $OUT/runs.tar.gz (every run's log, metrics, timing and profile files; no checkpoints) -- four files, within
# what the device tool brings back. OUT defaults to /tmp/gpu_check. Each training run has a timeout
# (--run-timeout-s, 90 s) and the whole check a deadline (--deadline-s, 480 s), with `timeout` as the backstop.
# What each stage measures: benchmarks/gpu/gpu_check.py. Exit 0 only if every stage passed.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
ARGS=()
for a in "$@"; do
  case "$a" in
    --cpu) DEVICE=cpu ;;
    *) ARGS+=("$a") ;;
  esac
done
export OUT="${OUT:-/tmp/gpu_check}" PYTHONUNBUFFERED=1 WANDB_SILENT=true
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
echo "gpu_check: device=$DEVICE start $(date -u +%FT%TZ) $(uname -m) $(python3 --version 2>&1)"

if [[ "$DEVICE" == cuda ]]; then
  if compgen -G ".whl/*.whl" >/dev/null; then
    # the packages the device image lacks, carried as wheels (benchmarks/gpu/gpu_wheels.sh); no index, no deps
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_check_site \
      .whl/*.whl || { echo "gpu_check: FAILED to install the carried wheels in .whl/" >&2; exit 2; }
    export PYTHONPATH="/tmp/gpu_check_site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  command -v nvidia-smi >/dev/null || { echo "gpu_check: FAILED: nvidia-smi not found (no NVIDIA driver?)" >&2; exit 2; }
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv || nvidia-smi || true
fi

# every package the trainer imports, with its version: a missing one stops here, by name
python3 - <<'PY' || exit 2
import importlib, sys
need = ["torch", "deepspeed", "omegaconf", "sentencepiece", "sacrebleu", "numpy", "psutil", "tqdm", "yaml"]
missing = []
for name in need:
    try:
        mod = importlib.import_module(name)
        print(f"gpu_check: {name} {getattr(mod, '__version__', '?')} ({getattr(mod, '__file__', '?')})")
    except Exception as e:  # an import that fails for any reason counts as missing
        missing.append(f"{name} ({type(e).__name__}: {e})")
if missing:
    sys.exit("gpu_check: FAILED: cannot import " + "; ".join(missing) +
             " -- carry them as wheels: bash benchmarks/gpu/gpu_wheels.sh, then carry .whl")
import torch
print(f"gpu_check: torch cuda {torch.version.cuda}, available {torch.cuda.is_available()}, devices {torch.cuda.device_count()}")
PY

# the backstop of the check's own deadline: SIGTERM (the check writes its report and exits), then SIGKILL
BACKSTOP="${GPU_CHECK_BACKSTOP_S:-$([[ "$DEVICE" == cuda ]] && echo 540 || echo 1000)}"  # cuda: inside a 600 s call
timeout --kill-after=20 "$BACKSTOP" python3 -m benchmarks.gpu.gpu_check --device "$DEVICE" --out "$OUT" "${ARGS[@]}"
