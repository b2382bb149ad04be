#!/usr/bin/env bash
# The gateway end to end, as its clients see it: a Kafka mock cluster
# (`mllama mock-kafka`), a redis-server, a worker on the random-weight micro
# model and `mllama gateway` in front of them, with one tenant and an API key;
# then openai_conformance.py (the official openai client, curl -N) and
# chat_page.py (the chat page in headless Chromium) against the gateway.
# Logs and the screenshot stay in BUILD_DIR/gw-test/; the processes are
# stopped on the way out, whatever happens.
#   run.sh MLLAMA_BIN BUILD_DIR
# Exit 77 (ctest: skipped) without redis-server, curl, chromium or
# chromium-driver (bash ops/install-deps.sh), or when PyPI is unreachable.
set -euo pipefail
bin=$(realpath "$1")
build=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)

# Seconds to wait for a process to say it is up; the worker loads the model
# and joins its group, on a loaded CI machine.
start_timeout_s=60
poll_s=0.1
tenant=acme
instance=test
image=$src/config/samples/astronaut.jpg

skip() { echo "SKIPPED: $*" >&2; exit 77; }
for tool in redis-server curl chromium chromedriver; do
  command -v "$tool" >/dev/null || skip "needs $tool on PATH (bash ops/install-deps.sh)"
done
venv=$build/gw-venv
bash "$here/venv.sh" "$venv" || exit $?

out=$build/gw-test
rm -rf "$out"
mkdir -p "$out"
pids=()
cleanup() {
  local rc=$?
  # SIGTERM, newest first, one at a time: the gateway and the worker drain
  # while the cluster is still there.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    for log in "$out"/*.log; do echo "---- $log (last lines)"; tail -n 30 "$log"; done
  fi
  exit "$rc"
}
trap cleanup EXIT

# wait_for WHAT PID COMMAND...: until COMMAND succeeds; fails when PID exits
# or after start_timeout_s.
wait_for() {
  local what=$1 pid=$2
  shift 2
  local deadline=$((SECONDS + start_timeout_s))
  until "$@" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "run.sh: $what exited" >&2; return 1; }
    [ $SECONDS -lt $deadline ] || { echo "run.sh: no $what after ${start_timeout_s} s" >&2; return 1; }
    sleep "$poll_s"
  done
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

"$bin" mkmodel --preset micro --out "$out/micro" >"$out/mkmodel.log" 2>&1

# The tenant's topics (service/protocol/README.md, tenants) and the
# gateway's reply topic, <first reply topic of the tenant>.gw-<instance>.
topics=mllama.requests.$tenant:4,mllama.cancel.$tenant:1,mllama.dlt:1
topics+=,mllama.replies.$tenant.gw-$instance:4
"$bin" mock-kafka --brokers 1 --topics "$topics" --port-file "$out/bootstrap" \
  >"$out/mock-kafka.log" 2>&1 &
pids+=($!)
wait_for mock-kafka "${pids[-1]}" test -s "$out/bootstrap"
brokers=$(cat "$out/bootstrap")

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$out" \
  >"$out/redis.log" 2>&1 &
pids+=($!)
wait_for redis-server "${pids[-1]}" grep -q "Ready to accept connections" "$out/redis.log"

common=(--set kafka.brokers="$brokers" --set redis.url="redis://127.0.0.1:$redis_port/0"
        --set model.dir="$out/micro" --set "tenants=[{\"name\": \"$tenant\"}]"
        --set http.listen=127.0.0.1:0 --set kafka.fetch.wait.max.ms=20)

"$bin" worker "${common[@]}" --set worker_id=gw-test-worker >"$out/worker.log" 2>&1 &
pids+=($!)
wait_for worker "${pids[-1]}" grep -q partitions_assigned "$out/worker.log"

# The key is checked by its sha256 (gateway.api_keys_file: "<sha256> <tenant> [label]").
key=mk-$(head -c 32 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
echo "$(printf %s "$key" | sha256sum | cut -d' ' -f1) $tenant conformance" >"$out/keys"

# Image URLs from the conformance script's own web server: http, on loopback.
"$bin" gateway "${common[@]}" --set gateway.listen=127.0.0.1:0 \
  --set gateway.image_fetch_http=true --set gateway.image_fetch_private=true \
  --set gateway.instance="$instance" --set gateway.api_keys_file="$out/keys" \
  --port-file "$out/gateway.port" >"$out/gateway.log" 2>&1 &
pids+=($!)
wait_for gateway "${pids[-1]}" test -s "$out/gateway.port"
read -r port ops_port <"$out/gateway.port"
wait_for "gateway /readyz" "${pids[-1]}" curl -sf "http://127.0.0.1:$ops_port/readyz" -o /dev/null
base=http://127.0.0.1:$port
echo "run.sh: gateway $base (ops $ops_port), kafka $brokers, logs in $out"

rc=0
"$venv/bin/python" "$here/openai_conformance.py" --base-url "$base" --image "$image" \
  --webp "$src/tests/golden/fixtures/images/webp_lossy_640x480.webp" \
  --gif "$src/tests/golden/fixtures/images/gif_pillow_animated_48x36.gif" \
  --api-key "$key" || rc=1
"$venv/bin/python" "$here/chat_page.py" --base-url "$base" --image "$image" \
  --api-key "$key" --ops-url "http://127.0.0.1:$ops_port" --out "$out" || rc=1
exit "$rc"
