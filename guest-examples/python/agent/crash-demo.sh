#!/bin/bash
# Kills `wasq dev` (kill -9) in the middle of an agent run, restarts it on the same data
# folder and checks that the run resumes, ends with the expected answer, and that no model
# call whose step had completed was sent again (only the one in flight may repeat).
#   ./crash-demo.sh            (needs agent.wasm: `wasq build` or the build line of wasq.toml)
# Env: WASQ (the wasq binary, default `wasq`), PORT (daemon, 17480), API_PORT (18480).
set -euo pipefail
cd "$(dirname "$0")"
WASQ=${WASQ:-wasq} PORT=${PORT:-17480} API_PORT=${API_PORT:-18480}
DATA=$(mktemp -d)
export WASQ_SERVER=http://127.0.0.1:$PORT
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; [ -n "${KEEP:-}" ] || rm -rf "$DATA"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "data: $DATA"; exit 1; }
# Bounded polling: `until_ok SECONDS COMMAND...`
until_ok() { local end=$((SECONDS + $1)); shift; until "$@"; do
  [ $SECONDS -lt $end ] || return 1; sleep 0.2; done; }
start_dev() {
  "$WASQ" dev --listen "127.0.0.1:$PORT" --data "$DATA/.wasq" --allow-loopback-egress \
    >>"$DATA/dev.log" 2>&1 & dev=$!; pids+=("$dev")
  until_ok 30 test -s "$DATA/.wasq/dev.key" || fail "wasq dev did not start"
  until_ok 30 "$WASQ" functions list --key "$(cat "$DATA/.wasq/dev.key")" >/dev/null 2>&1 \
    || fail "wasq dev does not answer"
}
calls() { curl -sf "http://127.0.0.1:$API_PORT/calls" | python3 -c \
  "import json,sys; print(json.load(sys.stdin).get('$1',{}).get('${2:-model_calls}',0))"; }

python3 standin.py --port "$API_PORT" --delay 2 >"$DATA/standin.log" 2>&1 & pids+=($!)
start_dev
export WASQ_KEY=$(cat "$DATA/.wasq/dev.key")
"$WASQ" deploy agent.wasm --name agent --timeout 5m --memory 128MiB --max-attempts 5 --backoff 1s \
  --allow-host 127.0.0.1 >/dev/null
id=$("$WASQ" run agent --output json --input \
  "{\"question\":\"What is the weather in Oslo?\",\"api\":\"http://127.0.0.1:$API_PORT\"}" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
echo "run $id started; waiting for its second model call"
at_call() { [ "$(calls "$id")" = "$1" ]; }
until_ok 60 at_call 2 || fail "no second model call"
sleep 0.5
kill -9 "$dev"; wait "$dev" 2>/dev/null || true
echo "killed wasq dev during model call 2; restarting it on the same data"
start_dev
status() { "$WASQ" runs show "$id" --output json | python3 -c \
  'import json,sys; print(json.load(sys.stdin)["status"])'; }
done_ok() { [ "$(status)" = succeeded ]; }
until_ok 90 done_ok || fail "run did not succeed: $(status)"
"$WASQ" runs show "$id"
out=$("$WASQ" runs show "$id" --output json | python3 -c \
  'import json,sys; print(json.load(sys.stdin)["output"]["answer"])')
echo "answer: $out"
curl -s "http://127.0.0.1:$API_PORT/calls" | python3 -c \
  "import json,sys; print(json.dumps(json.load(sys.stdin)['$id'], indent=1))"
[ "$out" = "In Oslo it is 29°C (84.2°F) and foggy." ] || fail "unexpected answer"
repeated=$(calls "$id" repeated)
[ "$repeated" = "['wasq-$id-model-2-0']" ] || fail "repeated calls: $repeated"
echo "OK: resumed after kill -9; only the in-flight model call (model-2) was sent twice"
