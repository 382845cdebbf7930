#!/usr/bin/env bash
# Build the Python 3.12 venv that runs the real mcore-bridge 1.6.5 on CPU (for convert.py).
#
#     bash install_venv.sh [VENV_DIR]                 # default /work/venvs/mcb
#     MCB_STANDALONE=1 bash install_venv.sh [VENV_DIR] # no base venv, everything in VENV_DIR
#
# Builds VENV_DIR from nothing (an existing one is removed first) and prints the time and size.
#
# Default (overlay) mode: VENV_DIR gets a .pth file that puts the site-packages of the
# Megatron-Bridge 0.6.2 venv (MCB_BASE_VENV, default /work/venvs/mb062, built by
# ../megatron_bridge_062/install_venv.sh if missing) on sys.path, and only the packages below on
# top.  That base venv has exactly the stack mcore-bridge needs: torch 2.13.0 (PyPI CUDA build,
# runs on CPU), megatron-core 0.19.2 (mcore-bridge 1.6.5 requires megatron-core>=0.16,<0.20),
# transformers 5.18.0, safetensors, fla 0.4.2 (megatron-core's GatedDeltaNet), mamba-ssm
# (Nemotron-H), einops, ...; megatron-bridge/modelopt in it are never imported by convert.py.
# Measured here (2 cores, PyPI, warm pip cache for the 8 wheels): 14 s, 115 MB (+5.2 GB base).
#
# MCB_STANDALONE=1: installs the base stack into VENV_DIR itself with the pins of
# ../megatron_bridge_062/install_venv.sh (minus megatron-bridge / nvidia-modelopt / PuLP / scipy /
# pillow / omegaconf, which mcore-bridge does not import), then the packages below.  NOT
# exercised here (it downloads the ~5 GB torch CUDA stack); the overlay mode is what built the
# corpus.
#
# On top (every pin is the exact version that worked; all --no-deps):
#   * mcore-bridge 1.6.5 (latest on PyPI).  Its declared requirements: megatron-core>=0.16,<0.20
#     (0.19.2 here), modelscope, peft>=0.11,<0.21, safetensors, tqdm, transformers>=4.33.
#   * peft 0.20.0: mcore_bridge.patcher imports it at module level; peft needs accelerate 1.15.0.
#   * modelscope 1.40.2 + modelscope-hub 0.5.1 + cryptography 50.0.2 (+ cffi 2.1.1, pycparser 3.12):
#     mcore_bridge.utils.torch_utils does `from modelscope.hub.utils.utils import get_cache_dir`,
#     modelscope.hub imports modelscope_hub, which imports cryptography.
#   * NOT installed: datasets (mcore_bridge.utils.torch_utils imports
#     datasets.utils.filelock.FileLock, a re-export of filelock.FileLock -- convert.py serves that
#     to this one importer) and transformer-engine (CUDA only; convert.py stubs it for mcore_bridge.*
#     and gives megatron-core CPU stand-ins for the TE modules).
#   `pip check` (overlay mode) then reports nothing for mcore-bridge, peft, accelerate or
#   modelscope; its remaining lines are the base venv's own (megatron-bridge, mamba-ssm,
#   nvidia-modelopt --no-deps requirements, see ../megatron_bridge_062/install_venv.sh).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${1:-/work/venvs/mcb}
BASE=${MCB_BASE_VENV:-/work/venvs/mb062}
PY=${PYTHON312:-}
if [ -z "$PY" ]; then
    for cand in python3.12 "$HOME/.pyenv/versions/3.12.1/bin/python3.12"; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
            PY=$(command -v "$cand"); break
        fi
    done
fi
[ -n "$PY" ] || { echo "install_venv.sh: need a Python 3.12 (set PYTHON312=...)" >&2; exit 2; }

start=$(date +%s)
rm -rf "$VENV"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
SITE=$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')

if [ -z "${MCB_STANDALONE:-}" ]; then
    if [ ! -x "$BASE/bin/python" ]; then
        echo "== base venv $BASE missing: building it with ../megatron_bridge_062/install_venv.sh"
        PYTHON312="$PY" bash "$HERE/../megatron_bridge_062/install_venv.sh" "$BASE"
    fi
    BASE_SITE=$("$BASE/bin/python" -c 'import site; print(site.getsitepackages()[0])')
    echo "$BASE_SITE" >"$SITE/_mcb_base_venv.pth"
    echo "== overlay on $BASE_SITE"
else
    echo "== standalone: torch, megatron-core, transformers, fla, mamba-ssm with the mb062 pins"
    CONSTRAINTS=$(mktemp /tmp/mcb_constraints.XXXXXX)
    trap 'rm -f "$CONSTRAINTS"' EXIT
    # the pins of ../megatron_bridge_062/install_venv.sh (its pip freeze)
    sed -n "/^cat >\"\$CONSTRAINTS\" <<'EOF'$/,/^EOF$/p" "$HERE/../megatron_bridge_062/install_venv.sh" \
        | sed '1d;$d' >"$CONSTRAINTS"
    "${PIP[@]}" install -c "$CONSTRAINTS" torch==2.13.0 setuptools==84.2.1
    "${PIP[@]}" install -c "$CONSTRAINTS" transformers==5.18.0 numpy packaging einops six rich \
        psutil pyyaml requests safetensors
    "${PIP[@]}" install --no-deps -c "$CONSTRAINTS" megatron-core==0.19.2 \
        flash-linear-attention==0.4.2 fla-core==0.4.2
    MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE \
        "${PIP[@]}" install --no-deps --no-build-isolation -c "$CONSTRAINTS" mamba-ssm==2.3.2.post1
fi

echo "== mcore-bridge and the modules it imports (--no-deps)"
"${PIP[@]}" install --no-deps mcore-bridge==1.6.5 peft==0.20.0 accelerate==1.15.0 \
    modelscope==1.40.2 modelscope-hub==0.5.1 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12

"$VENV/bin/python" - <<'PYEOF'
from importlib.metadata import version
for p in ("torch", "megatron-core", "mcore-bridge", "transformers", "peft", "accelerate",
          "modelscope", "safetensors"):
    print(f"  {p}=={version(p)}")
PYEOF
end=$(date +%s)
echo "install_venv.sh: built $VENV in $((end - start)) s, size $(du -sh "$VENV" | cut -f1)"
