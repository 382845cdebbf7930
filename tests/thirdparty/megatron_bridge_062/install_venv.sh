#!/usr/bin/env bash
# Build the Python 3.12 venv that runs the real Megatron-Bridge 0.6.2 on CPU (for convert.py).
#
#     bash install_venv.sh [VENV_DIR]        # default /work/venvs/mb062
#
# Builds from nothing (an existing VENV_DIR is removed first) and prints the time and size.
# Measured here (2 cores, PyPI over the network, empty pip cache): 142 s, 5.1 GB
# (torch's CUDA 13 libraries are ~4.5 GB of that; they are never loaded on CPU).
#
# What is installed and why (every pin below is the exact version that worked):
#   * torch 2.13.0 from PyPI: for cp312 PyPI only has the CUDA build; it runs on CPU.  Its own
#     dependencies (nvidia-*, triton 3.7.1, ...) come with it.
#   * megatron-core 0.19.2, megatron-bridge 0.6.2, nvidia-modelopt 0.47.0, flash-linear-attention
#     + fla-core 0.4.2: --no-deps.  The bridge's declared requirements (megatron-core[dev,mlm],
#     transformer-engine via extras, flashinfer, nvidia-resiliency-ext, wandb, mlflow, comet-ml,
#     diffusers, open-clip-torch, timm, datasets, ...) are training/inference stacks and CUDA
#     builds that conversion does not import; convert.py stubs the three it imports at module
#     level without using them (datasets, megatron.energon, tensorboard) for the importing
#     module only.  modelopt is imported by bridge.training.checkpointing and save_hf_weights;
#     fla (pure Python + Triton) by megatron-core's GatedDeltaNet (Qwen3.5, Qwen3-Next) at
#     construction; megatron-core's dev extra pins flash-linear-attention~=0.4.0.
#   * mamba-ssm 2.3.2.post1 built from the sdist with MAMBA_SKIP_CUDA_BUILD=TRUE (no nvcc here):
#     megatron-core's MambaMixer (Nemotron-H) needs its pure-Python/Triton RMSNormGated and
#     ssd_combined modules; convert.py stubs the unbuilt CUDA extension selective_scan_cuda.
#   * transformers 5.18.0, although the bridge declares transformers<=5.12.1,>=5.8:
#       - 5.12.1 cannot read the shipped fixtures' configs (written by transformers 5.24):
#         glm_moe_dsa "The `layer_types` entries must be in (...) but got ['indexed_attention',
#         'indexed_attention']", nemotron_h "`layers_block_type` contains invalid types", step3p7
#         "model type `step3p7` ... Transformers does not recognize this architecture";
#       - 5.24.0 removed transformers.modeling_attn_mask_utils, which the bridge imports
#         ("ModuleNotFoundError: No module named 'transformers.modeling_attn_mask_utils'");
#       - 5.18.0 is the oldest release that parses every fixture config (5.13 adds nemotron_h's
#         block types, 5.16 step3p7, 5.18 glm_moe_dsa's indexed_attention), and gives the same
#         conversion results as 5.12.1 for the five fixtures both can read (checked).
#     `pip check` then reports "megatron-bridge 0.6.2 has requirement transformers<=5.12.1,>=5.8,
#     but you have transformers 5.18.0." and 24 "requires X, which is not installed" lines for
#     the --no-deps packages -- expected.
#   * the small pure-Python modules the conversion path imports: einops, omegaconf, six, rich,
#     psutil, pyyaml, requests, PuLP, scipy (modelopt), pillow (bridge.data VLM builders).
set -euo pipefail

VENV=${1:-/work/venvs/mb062}
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

CONSTRAINTS=$(mktemp /tmp/mb062_constraints.XXXXXX)
trap 'rm -f "$CONSTRAINTS"' EXIT
# exact versions of everything that ends up in the venv (pip freeze of the venv that worked)
cat >"$CONSTRAINTS" <<'EOF'
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
certifi==2026.10.19.post1
charset-normalizer==3.5.3
click==8.5.1
cuda-bindings==13.5.0
cuda-pathfinder==1.9.1
cuda-toolkit==13.0.3.0
einops==0.8.2
filelock==4.3.1
fla-core==0.4.2
flash-linear-attention==0.4.2
fsspec==2026.9.0
h11==0.16.0
hf-xet==1.8.0
httpcore==1.0.9
httpx==0.28.1
huggingface_hub==1.33.0
idna==3.20
Jinja2==3.1.6
mamba-ssm==2.3.2.post1
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mdurl==0.1.2
megatron-bridge==0.6.2
megatron-core==0.19.2
mpmath==1.3.0
networkx==3.7
numpy==2.5.5
nvidia-cublas==13.1.1.3
nvidia-cuda-cupti==13.0.85
nvidia-cuda-nvrtc==13.0.88
nvidia-cuda-runtime==13.0.96
nvidia-cudnn-cu13==9.20.0.48
nvidia-cufft==12.0.0.61
nvidia-cufile==1.15.1.6
nvidia-curand==10.4.0.35
nvidia-cusolver==12.0.4.66
nvidia-cusparse==12.6.3.3
nvidia-cusparselt-cu13==0.8.1
nvidia-modelopt==0.47.0
nvidia-nccl-cu13==2.29.7
nvidia-nvjitlink==13.5.37
nvidia-nvshmem-cu13==3.4.5
nvidia-nvtx==13.0.85
omegaconf==2.4.0
packaging==26.4
pillow==13.0.0
psutil==7.2.2
PuLP==3.3.2
pydantic==2.14.4
pydantic_core==2.50.5
Pygments==2.21.0
PyYAML==6.0.4
regex==2026.11.19
requests==2.34.2
rich==15.0.0
safetensors==0.8.0
scipy==1.18.1
setuptools==84.2.1
shellingham==1.5.4
six==1.17.0
sympy==1.14.0
tokenizers==0.23.3
torch==2.13.0
tqdm==4.70.1
transformers==5.18.0
triton==3.7.1
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0
EOF

echo "== torch (PyPI CUDA build; runs on CPU)"
"${PIP[@]}" install -c "$CONSTRAINTS" torch==2.13.0 setuptools==84.2.1
echo "== transformers and the pure-Python modules the conversion path imports"
"${PIP[@]}" install -c "$CONSTRAINTS" transformers==5.18.0 numpy packaging einops omegaconf six \
    rich psutil pyyaml requests PuLP scipy pillow safetensors
echo "== Megatron-Core, Megatron-Bridge, ModelOpt, FLA (--no-deps)"
"${PIP[@]}" install --no-deps -c "$CONSTRAINTS" megatron-core==0.19.2 megatron-bridge==0.6.2 \
    nvidia-modelopt==0.47.0 flash-linear-attention==0.4.2 fla-core==0.4.2
echo "== mamba-ssm without its CUDA extension"
MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE \
    "${PIP[@]}" install --no-deps --no-build-isolation -c "$CONSTRAINTS" mamba-ssm==2.3.2.post1

"$VENV/bin/python" - <<'EOF'
from importlib.metadata import version
for p in ("torch", "megatron-core", "megatron-bridge", "transformers", "nvidia-modelopt",
          "flash-linear-attention", "mamba-ssm", "safetensors"):
    print(f"  {p}=={version(p)}")
EOF
end=$(date +%s)
echo "install_venv.sh: built $VENV in $((end - start)) s, size $(du -sh "$VENV" | cut -f1)"
