#!/usr/bin/env bash
# Build .whl/ (ignored by git) with the Python packages benchmarks/gpu/gpu_check.sh needs that the
# device machine lacks, and prepare the check's data into .gpudata/ (also ignored): the raw enja corpus
# and its two DATA_DIRs (8k BPE per side, 32k joint BPE), prepared here, where MeCab is installed, so
# nothing on the device needs it (nor spends its minutes on SentencePiece). A session with the device
# then carries both (`carry: [".whl", ".gpudata"]`), since neither the package registries nor
# ../shared/data can be reached from there.
#
#   bash benchmarks/gpu/gpu_wheels.sh [--no-wandb]
#
# The device's image (/work/.library/device/KINDS.md) has torch, numpy, psutil, tqdm, pyyaml,
# protobuf, requests, click, msgpack, ninja, py-cpuinfo, einops, ... but not deepspeed, omegaconf,
# wandb, hjson or pydantic, and other versions of sentencepiece and sacrebleu. Listed below: our
# pins from requirements.txt and, for their dependencies missing there, the versions pip resolved
# for them here; --no-deps everywhere, so nothing else (torch above all) is pulled in. The target is
# CPython 3.12 on manylinux x86-64 (the device's python3). deepspeed is published as source only:
# it is built here into a pure-Python wheel (DS_BUILD_OPS=0; its CUDA ops compile just in time there
# if ever used; the trainer uses torch's fused Adam).
set -euo pipefail
cd "$(dirname "$0")/../.."
WANDB=1
[[ "${1:-}" == "--no-wandb" ]] && WANDB=0

CORE=(deepspeed==0.19.8 omegaconf==2.4.0 sentencepiece==0.2.3 sacrebleu==2.6.0
      hjson==3.1.0 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2)
WANDB_PKGS=(wandb==0.31.0 platformdirs==4.14.9 cwevals==0.0.1b1 distro==1.9.0 sniffio==1.3.1
            googleapis-common-protos==1.76.0 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2
            opentelemetry-proto==1.45.2 opentelemetry-semantic-conventions==0.66b2
            opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2
            opentelemetry-exporter-http-transport==0.66b2 opentelemetry-exporter-otlp-common==0.66b2)
PKGS=("${CORE[@]}")
(( WANDB )) && PKGS+=("${WANDB_PKGS[@]}")

PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do PLATFORMS+=(--platform "$p"); done

rm -rf .whl && mkdir -p .whl
for pkg in "${PKGS[@]}"; do
  if ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
       "${PLATFORMS[@]}" -d .whl "$pkg" 2>/dev/null; then
    # no wheel for CPython 3.12 / manylinux: build one here (pure-Python packages only)
    echo "gpu_wheels: building $pkg from source" >&2
    DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl "$pkg"
  fi
done
for whl in .whl/*.whl; do
  case "$whl" in *-cp3*-cp3*-*|*-py3-none-any.whl|*-py2.py3-none-any.whl|*-py3-none-manylinux*|*-abi3-*) ;;
    *) echo "gpu_wheels: $whl does not look installable on CPython 3.12 x86-64" >&2; exit 1;;
  esac
done

mkdir -p .gpudata/small_parallel_enja
src=../shared/data/small_parallel_enja
[[ -d "$src" ]] || { echo "gpu_wheels: $src not found (the shared data folder beside the checkout)" >&2; exit 1; }
cp "$src"/{train,dev,test}.{en,ja} "$src"/README.md .gpudata/small_parallel_enja/
python3 -m benchmarks.gpu.gpu_check --prepare-only --device cuda --work .gpudata --corpus .gpudata/small_parallel_enja

ls -la .whl
du -sh .whl .gpudata
echo "gpu_wheels: done; carry [\".whl\", \".gpudata\"] and run: bash benchmarks/gpu/gpu_check.sh"
