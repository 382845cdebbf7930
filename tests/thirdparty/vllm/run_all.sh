#!/usr/bin/env bash
# Run every measurement of NOTES.md, one after the other, into results/ (one JSON per run),
# and print a line per run with its wall time. Needs the venv of install_venv.sh.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
PY="${VLLM_PY:-${MTPCHECK_VLLM_VENV:-$REPO/.venv-vllm}/bin/python}"
OUT="$HERE/results"
WORK="${TMPDIR:-/tmp}/mtpcheck-vllm-runs"
mkdir -p "$OUT" "$WORK"
cd "$REPO"

run() {  # name fixture k [extra args...]
  local name=$1 fixture=$2 k=$3; shift 3
  local start end
  start=$(date +%s.%N)
  "$PY" "$HERE/run_vllm.py" "fixtures/$fixture" \
      --workload "fixtures/$fixture/workloads/in_domain.jsonl" \
      --draft-tokens "$k" --new-tokens 40 --prompt-tokens 9 \
      --work-dir "$WORK/$name" "$@" > "$OUT/$name.json" 2> "$WORK/$name.log"
  end=$(date +%s.%N)
  "$PY" - "$OUT/$name.json" "$(echo "$end - $start" | bc)" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
pos = ", ".join(f"{a:.3f}" for a in d["acceptance_per_pos"])
print(f"{sys.argv[1].rsplit('/', 1)[-1]:28s} drafts {d['drafts']:4d}  draft tokens "
      f"{d['draft_tokens']:4d}  accepted {d['accepted_tokens']:4d}  acceptance "
      f"{d['acceptance']:.4f}  per position [{pos}]  mean length "
      f"{d['mean_acceptance_length']:.3f}  wall {float(sys.argv[2]):.1f} s "
      f"(generate {d['seconds']['generate']} s)")
PY
}

run deepseek_v3_k1 accept_deepseek_v3 1
run deepseek_v3_k2 accept_deepseek_v3 2
run deepseek_v3_k3 accept_deepseek_v3 3
run deepseek_v3_k1_without_rope_patch accept_deepseek_v3 1 --skip-patch rope
run step3p7_k1 accept_step3p7 1
run step3p7_k3 accept_step3p7 3
run step3p7_k3_without_rope_patch accept_step3p7 3 --skip-patch rope
