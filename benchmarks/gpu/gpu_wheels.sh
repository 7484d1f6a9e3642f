#!/usr/bin/env bash
# Build .whl/ (ignored by git) with the Python packages benchmarks/gpu/gpu_check.sh needs that the
# device machine lacks, and prepare the check's data into .gpudata/ (also ignored): the raw enja corpus
# and its two DATA_DIRs (8k BPE per side, 32k joint BPE), prepared here, where MeCab is installed, so
# nothing on the device needs it (nor spends its minutes on SentencePiece; the patent-length DATA_DIR is
# derived from the 32k one there, in seconds). A session with the device then carries both
# (`carry: [".whl", ".gpudata"]`), since neither the package registries nor ../shared/data can be
# reached from there.
#
#   bash benchmarks/gpu/gpu_wheels.sh [--no-wandb] [--wheels-only]      # from any shell, in any folder
#   PYTHON=/path/to/python bash benchmarks/gpu/gpu_wheels.sh             # the project's Python, if not found
#   bash benchmarks/gpu/gpu_wheels.sh --which-python                      # print the Python it would use
#
# The device's image (benchmarks/gpu/gpu_image.txt, from /work/.library/device/KINDS.md) has torch 2.11,
# numpy, psutil, tqdm, pyyaml, protobuf, requests, click, msgpack, ninja, py-cpuinfo, einops, ... but
# not deepspeed, omegaconf, wandb, hjson or pydantic, and other versions of sentencepiece. Listed below:
# our pins from requirements.txt and, for their dependencies missing there, the versions pip resolved for
# them here; --no-deps everywhere, so nothing else (torch above all) is pulled in. The target is CPython
# 3.12 on manylinux x86-64 (the device's python3). deepspeed is published as source only: it is built
# here into a pure-Python wheel (DS_BUILD_OPS=0; its CUDA ops compile just in time there if ever used;
# the trainer uses torch's fused Adam). At the end every carried wheel's requirements are checked against
# the image and the other carried wheels (benchmarks/gpu/gpu_rehearsal.py --check-wheels); the rehearsal
# (benchmarks/gpu/gpu_rehearsal.sh) then runs the check in a copy of that image's Python.
#
# pip's own messages are shown (in full when it fails); this machine's pip configuration names local
# package folders that may not exist, and pip's warnings about those alone are left out.
set -euo pipefail
cd "$(dirname "$0")/../.."
WANDB=1 DATA=1 WHICH=0
for a in "$@"; do
  case "$a" in
    --no-wandb) WANDB=0 ;;
    --wheels-only) DATA=0 ;;
    --which-python) WHICH=1 ;;
    *) echo "gpu_wheels: unknown argument $a (--no-wandb, --wheels-only, --which-python)" >&2; exit 2 ;;
  esac
done

CORE=(omegaconf==2.4.0 sentencepiece==0.2.3 sacrebleu==2.6.0
      hjson==3.1.0 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2)
DEEPSPEED=deepspeed==0.19.8
WANDB_PKGS=(wandb==0.31.0 platformdirs==4.14.9 cwevals==0.0.1b1 distro==1.9.0 sniffio==1.3.1
            googleapis-common-protos==1.76.0 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2
            opentelemetry-proto==1.45.2 opentelemetry-semantic-conventions==0.66b2
            opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2
            opentelemetry-exporter-http-transport==0.66b2 opentelemetry-exporter-otlp-common==0.66b2)
PKGS=("${CORE[@]}")
(( WANDB )) && PKGS+=("${WANDB_PKGS[@]}")

# The project's Python: the data is prepared with the project's code and packages (torch,
# sentencepiece, MeCab); a fresh shell's python3 may be the system's, without them.
project_python() {
  local py
  for py in "${PYTHON:-}" python3 "${PYENV_ROOT:-$HOME/.pyenv}/shims/python3" python3.11 python3.12 python; do
    [[ -n "$py" ]] && command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c "import torch, sentencepiece, numpy, pip" >/dev/null 2>&1; then echo "$py"; return 0; fi
  done
  return 1
}
PY=$(project_python) || { echo "gpu_wheels: no Python here imports torch, sentencepiece and numpy (the project's" \
  "packages: python3 -m pip install -r requirements.txt); name one with PYTHON=/path/to/python" >&2; exit 2; }
(( WHICH )) && { command -v "$PY"; exit 0; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the project's code, installed or not
echo "gpu_wheels: $("$PY" --version 2>&1) at $(command -v "$PY")"

LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
pip_step() {  # what, then pip's arguments: its messages shown, all of them when it fails
  local what=$1; shift
  if ! "$PY" -m pip "$@" >"$LOG" 2>&1; then
    grep -v "is ignored: it is neither a file nor a directory" "$LOG" >&2 || true
    echo "gpu_wheels: FAILED: $what (pip's messages above)" >&2
    exit 1
  fi
  grep -v "is ignored: it is neither a file nor a directory" "$LOG" | grep -E "^(ERROR|WARNING|Saved|Successfully)" || true
}

PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do PLATFORMS+=(--platform "$p"); done

rm -rf .whl && mkdir -p .whl
pip_step "downloading ${PKGS[*]}" download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d .whl "${PKGS[@]}"
# no wheel on PyPI: a pure-Python one built here, in pip's isolated build environment (no torch needed)
DS_BUILD_OPS=0 pip_step "building $DEEPSPEED" wheel --no-deps --no-binary deepspeed -w .whl "$DEEPSPEED"
for whl in .whl/*.whl; do
  case "$whl" in *-cp312-cp312-*|*-py3-none-any.whl|*-py2.py3-none-any.whl|*-py3-none-manylinux*|*-abi3-*) ;;
    *) echo "gpu_wheels: $whl does not look installable on CPython 3.12 x86-64" >&2; exit 1;;
  esac
done
"$PY" benchmarks/gpu/gpu_rehearsal.py --check-wheels .whl

if (( DATA )); then
  mkdir -p .gpudata/small_parallel_enja
  src=../shared/data/small_parallel_enja
  [[ -d "$src" ]] || { echo "gpu_wheels: $src not found (the shared data folder beside the checkout)" >&2; exit 1; }
  cp "$src"/{train,dev,test}.{en,ja} "$src"/README.md .gpudata/small_parallel_enja/
  "$PY" -m benchmarks.gpu.gpu_check --prepare-only --device cuda --work .gpudata --corpus .gpudata/small_parallel_enja
fi

ls -la .whl
du -sh .whl $( (( DATA )) && echo .gpudata)
echo "gpu_wheels: done; carry [\".whl\", \".gpudata\"] and run: bash benchmarks/gpu/gpu_check.sh"
