#!/usr/bin/env bash
# Rebuild the mcore-bridge 1.6.5 corpus in tests/data/mcore_bridge/ (CPU only).
#
#     bash tests/thirdparty/mcore_bridge/regenerate.sh [VENV_DIR]   # default /work/venvs/mcb
#
# Needs the venv of install_venv.sh.  One conversion at a time (each is one process of
# ~1.5 GB RAM, 10-20 s on 2 cores).  For every RUN below:
#   tests/data/mcore_bridge/RUN/convert.json   what ran, versions, seconds, error
#   tests/data/mcore_bridge/RUN/convert.log    the libraries' output
#   tests/data/mcore_bridge/RUN/megatron/      the torch_dist checkpoint (if import ran)
#   tests/data/mcore_bridge/RUN/hf/            the HF export (if export ran)
#   tests/data/mcore_bridge/RUN/report.json    compare.py (byte-for-byte vs the fixture)
# and SUMMARY.json over all runs.  A failing conversion is recorded, not fatal.
# Every fixture runs twice: as ms-swift without --mtp_num_layers (mcore-bridge then builds no MTP
# block, ms-swift issue 9504) and, as RUN-mtp1, with --mtp_num_layers 1.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
VENV=${1:-/work/venvs/mcb}
PY="$VENV/bin/python"
OUT="$REPO/tests/data/mcore_bridge"
FIX="$REPO/fixtures"
[ -x "$PY" ] || { echo "regenerate.sh: no $PY (run install_venv.sh first)" >&2; exit 2; }

# fixtures with MTP weights whose HF model_type mcore-bridge 1.6.5 registers, plus qwen3_5_text
# (Qwen3.5 text-only; mcore-bridge registers only the VLM model_types qwen3_5/qwen3_5_moe)
FIXTURES=(
    qwen3_5_text
    qwen3_next
    accept_qwen3_next
    deepseek_v3
    accept_deepseek_v3
    glm4_moe
    qwen3_5_moe
    glm_moe_dsa
    hy_v3
    nemotron_h
    mimo
    bailing_hybrid
    minimax_m2
    deepseek_v4
    glm5_next
)
RUNS=()
for f in "${FIXTURES[@]}"; do
    RUNS+=("$f $f" "$f-mtp1 $f --mtp-num-layers 1")
done

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

"$PY" - "$OUT" <<'PYEOF'
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
        "mcore_model_type": c.get("mcore_model_type"),
        "bridge": c.get("bridge"),
        "mtp_num_layers_built": c.get("import_mtp_num_layers"),
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
PYEOF
echo "regenerate.sh: $(( $(date +%s) - start )) s, corpus $(du -sh "$OUT" | cut -f1)"
