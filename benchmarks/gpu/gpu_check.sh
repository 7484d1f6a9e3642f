#!/usr/bin/env bash
# The GPU check, one prepared script: under 6 minutes on one GPU (an H200 of the device tool), so that a
# second try fits in the session's 15 minutes of device time with the machine's start.
#
#   bash benchmarks/gpu/gpu_wheels.sh                  # once, here: .whl/ (wheels) and .gpudata/ (prepared data)
#   bash benchmarks/gpu/gpu_check.sh                   # on the GPU machine (carry .whl and .gpudata)
#   bash benchmarks/gpu/gpu_check.sh --cpu             # the same stages at tiny sizes, no GPU (GPU_CHECK_DEVICE=cpu)
#   bash benchmarks/gpu/gpu_rehearsal.sh               # --cpu in a copy of the device's Python, wheels carried as there
#
# Writes $OUT/gpu_check.log, $OUT/gpu_check.json (rewritten after every stage), $OUT/device_profile.json,
# $OUT/planner_profile.json and $OUT/runs.tar.gz (every run's log, metrics, timing and profile files; no
# checkpoints) -- five files, within what the device tool brings back. OUT defaults to /tmp/gpu_check.
# Each training run has a timeout (--run-timeout-s), the whole check a deadline (--deadline-s, 300 s on
# cuda), with `timeout` as the backstop; every external command here has a timeout too. What each stage
# measures: benchmarks/gpu/gpu_check.py. Exit 0 only if every stage passed.
#
# The carried wheels (.whl/*.whl) are installed as the device tool's notes say (pip --no-index --no-deps
# --target, then PYTHONPATH) on cuda, and on --cpu when GPU_CHECK_CARRY=1 (the rehearsal sets it).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
ARGS=()
DEADLINE="" PREV=""  # --deadline-s as given, for the backstop below
for a in "$@"; do
  case "$a" in
    --cpu) DEVICE=cpu ;;
    --deadline-s=*) DEADLINE="${a#*=}"; ARGS+=("$a") ;;
    *) if [[ "$PREV" == --deadline-s ]]; then DEADLINE="$a"; fi; ARGS+=("$a") ;;
  esac
  PREV="$a"
done
CARRY="${GPU_CHECK_CARRY:-$([[ "$DEVICE" == cuda ]] && echo 1 || echo 0)}"
SITE="${GPU_CHECK_SITE:-/tmp/gpu_check_site}"
export OUT="${OUT:-/tmp/gpu_check}" PYTHONUNBUFFERED=1 WANDB_SILENT=true
# the checkout's own code: nothing installs the project on the device
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
echo "gpu_check: device=$DEVICE start $(date -u +%FT%TZ) $(uname -m) $(python3 --version 2>&1) at $(command -v python3)"

if (( CARRY )) && compgen -G ".whl/*.whl" >/dev/null; then
  # the packages the device image lacks, carried as wheels (benchmarks/gpu/gpu_wheels.sh); no index, no deps
  rm -rf "$SITE"
  timeout 180 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    .whl/*.whl || { echo "gpu_check: FAILED to install the carried wheels in .whl/" >&2; exit 2; }
  export PYTHONPATH="$SITE:$PYTHONPATH"
  echo "gpu_check: carried wheels installed into $SITE: $(ls .whl | tr '\n' ' ')"
fi
if [[ "$DEVICE" == cuda ]]; then
  command -v nvidia-smi >/dev/null || { echo "gpu_check: FAILED: nvidia-smi not found (no NVIDIA driver?)" >&2; exit 2; }
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv \
    || timeout 20 nvidia-smi || true
fi

# every package the trainer imports, with its version, and the trainer itself: a missing one stops here, by name
timeout 120 python3 - <<'PY' || exit 2
import importlib, sys
need = ["torch", "deepspeed", "omegaconf", "sentencepiece", "sacrebleu", "numpy", "psutil", "tqdm", "yaml",
        "matplotlib", "trainer.training.build", "trainer.inference.translator", "trainer.planner.plan"]
missing = []
for name in need:
    try:
        mod = importlib.import_module(name)
        print(f"gpu_check: {name} {getattr(mod, '__version__', '')} ({getattr(mod, '__file__', '?')})")
    except Exception as e:  # an import that fails for any reason counts as missing
        missing.append(f"{name} ({type(e).__name__}: {e})")
try:
    import wandb
    print(f"gpu_check: wandb {wandb.__version__} (optional: its own last run)")
except Exception as e:
    print(f"gpu_check: wandb not importable ({type(e).__name__}: {e}); its run will say so")
if missing:
    sys.exit("gpu_check: FAILED: cannot import " + "; ".join(missing) +
             " -- carry them as wheels: bash benchmarks/gpu/gpu_wheels.sh, then carry .whl")
import torch
print(f"gpu_check: torch cuda {torch.version.cuda}, available {torch.cuda.is_available()}, devices {torch.cuda.device_count()}")
PY

# the backstop of the check's own deadline (the --deadline-s given or gpu_check.py's default, 510 s on cuda and
# 1200 on cpu, and 40 or 100 s to pack and report after it): SIGTERM (the check kills its run, packs, writes its
# report and exits), then SIGKILL
MARGIN=$([[ "$DEVICE" == cuda ]] && echo 40 || echo 100)
DEFAULT_BACKSTOP=$(python3 -c "import sys; print(int(float(sys.argv[1] or sys.argv[2])) + int(sys.argv[3]))" \
  "$DEADLINE" "$([[ "$DEVICE" == cuda ]] && echo 510 || echo 1200)" "$MARGIN" 2>/dev/null || echo $((1200 + MARGIN)))
BACKSTOP="${GPU_CHECK_BACKSTOP_S:-$DEFAULT_BACKSTOP}"
echo "gpu_check: backstop of the deadline: ${BACKSTOP}s"
timeout --kill-after=20 "$BACKSTOP" python3 -m benchmarks.gpu.gpu_check --device "$DEVICE" --out "$OUT" "${ARGS[@]}"
