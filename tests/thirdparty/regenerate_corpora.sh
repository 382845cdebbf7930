#!/usr/bin/env bash
# Rewrites every shipped tool corpus with the real tools, each in a venv of its own, into OUT
# (a folder of its own: OUT/<tool>), and says per tool whether the files came out byte for
# byte as shipped in tests/data/<tool>:
#
#   bash tests/thirdparty/regenerate_corpora.sh OUT [TOOL ...]
#
# TOOLs: bitsandbytes mlx autoround peft mergekit speculators (default: all). .ci/run then runs the corpus
# tests on OUT (MTPCHECK_TOOL_OUTPUTS=OUT), so the verdicts are pinned on what the tools write
# on the machine at hand, not only on the shipped copies. Each tool's regenerate.sh makes its
# venv (.venv-<tool> at the repository root) the first time.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: regenerate_corpora.sh OUT [TOOL ...]}"
shift
tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(bitsandbytes mlx autoround peft mergekit speculators)
mkdir -p "$out"
out="$(cd "$out" && pwd)"
for tool in "${tools[@]}"; do
  start=$(date +%s)
  log="$out/$tool.log"
  bash "tests/thirdparty/$tool/regenerate.sh" "" "$out/$tool" > "$log" 2>&1 \
    || { tail -n 30 "$log"; echo "$tool: regenerate.sh failed" >&2; exit 1; }
  if diff -rq -x '*.log' "tests/data/$tool" "$out/$tool" > "$out/$tool.diff" 2>&1; then
    same="byte for byte as shipped"
  else
    same="differs from the shipped copy in $(wc -l < "$out/$tool.diff") places ($out/$tool.diff)"
  fi
  echo "$tool: rewritten in $(( $(date +%s) - start )) s, $same"
done
