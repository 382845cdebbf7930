#!/usr/bin/env bash
# Rebuild the Megatron-Bridge 0.6.2 corpus in tests/data/megatron_bridge_062/ (CPU only).
#
#     bash tests/thirdparty/megatron_bridge_062/regenerate.sh [VENV_DIR]   # default /work/venvs/mb062
#
# Needs the venv of install_venv.sh.  One conversion at a time (each is one process of
# ~1.5 GB RAM, 10-20 s on 2 cores); 330 s in all here.  For every RUN below:
#   tests/data/megatron_bridge_062/RUN/convert.json   what ran, versions, seconds, error
#   tests/data/megatron_bridge_062/RUN/convert.log    the libraries' output
#   tests/data/megatron_bridge_062/RUN/megatron/      the torch_dist checkpoint (if import ran)
#   tests/data/megatron_bridge_062/RUN/hf/            the HF export (if export ran)
#   tests/data/megatron_bridge_062/RUN/report.json    compare.py (byte-for-byte vs the fixture)
# and SUMMARY.json over all runs.  A failing conversion is recorded, not fatal.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
VENV=${1:-/work/venvs/mb062}
PY="$VENV/bin/python"
OUT="$REPO/tests/data/megatron_bridge_062"
FIX="$REPO/fixtures"
[ -x "$PY" ] || { echo "regenerate.sh: no $PY (run install_venv.sh first)" >&2; exit 2; }

# RUN  FIXTURE  [extra convert.py args]
RUNS=(
    "qwen3_5_text qwen3_5_text"
    "qwen3_5_moe qwen3_5_moe"
    "qwen3_next qwen3_next"
    "qwen3_next-mtp1 qwen3_next --mtp-num-layers 1"
    "accept_qwen3_next accept_qwen3_next"
    "accept_qwen3_next-mtp1 accept_qwen3_next --mtp-num-layers 1"
    "deepseek_v3 deepseek_v3"
    "accept_deepseek_v3 accept_deepseek_v3"
    "glm4_moe glm4_moe"
    "glm_moe_dsa glm_moe_dsa"
    "glm_moe_dsa-mtp1 glm_moe_dsa --mtp-num-layers 1"
    "hy_v3 hy_v3"
    "nemotron_h nemotron_h"
    "exaone_moe exaone_moe"
    "exaone4_5 exaone4_5"
    "exaone4_5-mtp1 exaone4_5 --mtp-num-layers 1"
    "minimax_m3 minimax_m3"
    "minimax_m3-mtp1 minimax_m3 --mtp-num-layers 1"
    "deepseek_v4 deepseek_v4"
    "mimo mimo"
    "mimo_v2_flash mimo_v2_flash"
    "step3p7 step3p7"
    "accept_step3p7 accept_step3p7"
)

mkdir -p "$OUT"
start=$(date +%s)
for spec in "${RUNS[@]}"; do
    read -r run fixture extra <<<"$spec"
    dst="$OUT/$run"
    rm -rf "$dst"
    # shellcheck disable=SC2086
    "$PY" "$HERE/convert.py" "$FIX/$fixture" "$dst" $extra
    "$PY" "$HERE/compare.py" "$FIX/$fixture" "$dst" >/dev/null || echo "compare.py failed for $run" >&2
done

"$PY" - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
summary = {}
for run in sorted(os.listdir(out)):
    d = os.path.join(out, run)
    if not os.path.isdir(d):
        continue
    c = json.load(open(os.path.join(d, "convert.json")))
    r = json.load(open(os.path.join(d, "report.json"))) if os.path.exists(os.path.join(d, "report.json")) else {}
    summary[run] = {
        "fixture": c["fixture"],
        "mtp_num_layers_arg": c.get("mtp_num_layers_arg"),
        "model_bridge": c.get("model_bridge"),
        "bridge_mtp_num_layers": c.get("bridge_mtp_num_layers"),
        "steps": {s["step"]: s["ok"] for s in c["steps"]},
        "ok": c["ok"],
        "error": c["error"],
        "fixture_config_defaults": c.get("fixture_config_defaults"),
        "result": r.get("summary"),
    }
with open(os.path.join(out, "SUMMARY.json"), "w") as f:
    json.dump(summary, f, indent=1)
    f.write("\n")
print(json.dumps({k: (v["ok"], v["result"]) for k, v in summary.items()}, indent=0))
EOF
echo "regenerate.sh: $(( $(date +%s) - start )) s, corpus $(du -sh "$OUT" | cut -f1)"
