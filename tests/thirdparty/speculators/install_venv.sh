#!/usr/bin/env bash
# Makes the venv speculators 0.9.0 runs in, once (regenerate.sh, .ci/run and the drafter round
# trip's test use it):
#   bash tests/thirdparty/speculators/install_venv.sh VENV
set -euo pipefail
venv="${1:?usage: install_venv.sh VENV}"
[ -x "$venv/bin/speculators" ] && exit 0
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0 speculators==0.9.0
# speculators requires torchvision and torchaudio; PyPI's builds are for CUDA torch and their
# extensions cannot load beside torch 2.13.0+cpu (importing transformers' Llama then fails:
# "operator torchvision::nms does not exist"). Nothing here uses either.
"$venv/bin/pip" uninstall -q -y torchvision torchaudio
