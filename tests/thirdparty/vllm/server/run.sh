#!/usr/bin/env bash
# One server run: start serve.py in its own session, wait (bounded) for /health, probe.py in
# each MODE, stop the whole process group.
#   bash tests/thirdparty/vllm/server/run.sh FIXTURE K OUT_DIR [MODES] [-- serve.py args]
# e.g. bash tests/thirdparty/vllm/server/run.sh fixtures/accept_step3p7 3 /tmp/s37 "sequential concurrent"
set -euo pipefail
FIXTURE=$1; K=$2; OUT=$3; MODES=${4:-"sequential concurrent batched"}; shift 4 || shift $#
[ "${1:-}" = "--" ] && shift
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${MTPCHECK_VLLM_VENV:-$HERE/../../../../.venv-vllm}/bin/python"
PORT=${PORT:-8765}
mkdir -p "$OUT"
t0=$(date +%s.%N)
setsid "$PY" "$HERE/serve.py" "$FIXTURE" --draft-tokens "$K" --port "$PORT" \
    --work-dir "$OUT/work" "$@" >"$OUT/server.log" 2>&1 &
PGID=$!
trap 'kill -TERM -- -$PGID 2>/dev/null || true; sleep 3; kill -KILL -- -$PGID 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do  # at most ~240 s
    curl -sf -m 2 "http://127.0.0.1:$PORT/health" >/dev/null && break
    kill -0 $PGID 2>/dev/null || { echo "server died"; tail -30 "$OUT/server.log"; exit 1; }
    sleep 1
done
echo "startup_s $(python3 -c "import time;print(round(time.time()-$t0,1))")"
ps -o pid,rss,args -g $PGID | cut -c1-90
WL="$FIXTURE/workloads/in_domain.jsonl"
for MODE in $MODES; do
    timeout 600 "$PY" "$HERE/probe.py" "$OUT/work/$(basename "$FIXTURE")" --workload "$WL" \
        --port "$PORT" --mode "$MODE" --out "$OUT/$MODE.json" 2>>"$OUT/probe.err" \
        | python3 -c "import json,sys;d=json.load(sys.stdin);print(d['mode'],d['seconds'],json.dumps(d['metrics_diff']),d['per_request_sum'])"
done
