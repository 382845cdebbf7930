#!/usr/bin/env bash
# Regenerates tests/data/autoround/ with the real auto-round 0.16.1 and gptqmodel 7.7.0, on CPU:
#   bash tests/thirdparty/autoround/regenerate.sh [VENV] [OUT] [GPTQ_VENV]
# VENV (default .venv-autoround) gets torch 2.13.0 and auto-round 0.16.1 if it lacks them;
# GPTQ_VENV (default VENV-gptqmodel) gets torch 2.13.0 and gptqmodel 7.7.0 (installed with
# --no-deps, then its other requirements: gptqmodel 7.7.0 asks for torch>=2.14.1 but runs
# these cases on 2.13.0, see NOTES.md). OUT defaults to tests/data/autoround.
# About 4 minutes on 2 CPU cores once the venvs exist; NOTES.md says what comes out.
set -euo pipefail
cd "$(dirname "$0")/../../.."
venv="${1:-.venv-autoround}"
out="${2:-tests/data/autoround}"
gvenv="${3:-$venv-gptqmodel}"
pin_common="transformers==5.25.0 accelerate==1.16.0 safetensors==0.8.0 tokenizers==0.23.3 numpy==2.4.6"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import auto_round" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.13.0
  "$venv/bin/pip" install -q auto-round==0.16.1 $pin_common
fi
if [ ! -x "$gvenv/bin/python" ] || ! "$gvenv/bin/python" -c "import gptqmodel" 2>/dev/null; then
  python3 -m venv "$gvenv"
  "$gvenv/bin/pip" install -q torch==2.13.0
  "$gvenv/bin/pip" install -q --no-deps gptqmodel==7.7.0
  # gptqmodel 7.7.0's requirements.txt, less torch
  "$gvenv/bin/pip" install -q $pin_common torchao==0.18.0 defuser==0.0.28 tokenicer==0.0.14 \
    logbar==0.4.15 device-smi==0.5.7 pypcre==0.6.4 threadpoolctl==3.8.0 protobuf==7.36.2 \
    pillow==13.0.0 jinja2==3.1.6 ninja==1.13.2 maturin==1.16.0 datasets==5.2.0 pyarrow==26.0.1 \
    dill==0.4.1 requests==2.34.2 packaging==26.4 filelock==4.3.2
fi
mkdir -p "$out"
"$venv/bin/python" tests/thirdparty/autoround/make.py --tool autoround --out "$out"
"$gvenv/bin/python" tests/thirdparty/autoround/make.py --tool gptqmodel --out "$out"
"$venv/bin/python" tests/thirdparty/autoround/make.py --verify --out "$out"
"$gvenv/bin/python" tests/thirdparty/autoround/make.py --verify --out "$out"
echo "wrote $out"
