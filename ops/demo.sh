#!/usr/bin/env bash
# The main job on the embedded defaults (README "Run it"): install what is
# missing, build, start a local Kafka (librdkafka's mock cluster, a real Kafka
# protocol server on loopback) and a local redis-server, start a worker on a
# random-weight model of the real architecture (or yours), submit a chat
# request with an image and stream its tokens to the terminal. The same
# request is sent twice: the second is served from the resident
# cross-attention cache (see "images_cached" and "ttft_ms"). Then the HTTP
# gateway starts on the same Kafka: its chat page is at http://127.0.0.1:8080/
# (OpenAI's API under /v1), until Ctrl-C.
#
#   MLLAMA_MODEL=/path/to/Llama-3.2-11B-Vision-Instruct bash ops/demo.sh
#
# uses a real checkpoint instead (config.json + safetensors + tokenizer.json);
# MLLAMA_GATEWAY_PORT=8081 moves the gateway, MLLAMA_DEMO_GATEWAY=0 ends the
# demo after the terminal part.
set -euo pipefail
cd "$(dirname "$0")/.."

bash ops/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target mllama
bin=build/service/mllama

model=${MLLAMA_MODEL:-build/models/tiny}
image=${MLLAMA_IMAGE:-config/samples/astronaut.jpg}
prompt=${MLLAMA_PROMPT:-"Describe this image in one sentence."}
run=build/demo
mkdir -p "$run"
if [ ! -f "$model/config.json" ]; then
  echo "demo: no model at $model; writing the random-weight 'tiny' preset there"
  "$bin" mkmodel --preset tiny --out "$model"
fi

pids=()
cleanup() {
  # SIGTERM drains the worker (commit, leave the group) before the cluster goes.
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# The gateway's reply topic is mllama.replies.gw-<gateway.instance>.
gateway_instance=demo
topics=mllama.requests:4,mllama.replies:4,mllama.dlt:1,mllama.cancel:1,mllama.replies.gw-$gateway_instance:4
rm -f "$run/bootstrap"
"$bin" mock-kafka --brokers 1 --topics "$topics" --port-file "$run/bootstrap" >/dev/null 2>"$run/kafka.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$run/bootstrap" ] && break; sleep 0.1; done
brokers=$(cat "$run/bootstrap")

redis_port=$((20000 + RANDOM % 20000))
redis-server --port "$redis_port" --save "" --appendonly no --dir "$run" >"$run/redis.log" 2>&1 &
pids+=($!)
redis="redis://127.0.0.1:$redis_port/0"

"$bin" worker --set kafka.brokers="$brokers" --set redis.url="$redis" \
  --set model.dir="$model" --set http.listen=127.0.0.1:0 >"$run/worker.log" 2>&1 &
pids+=($!)
echo "demo: kafka $brokers, redis $redis, worker log $run/worker.log"
for _ in $(seq 600); do
  grep -q partitions_assigned "$run/worker.log" && break
  if ! kill -0 "${pids[-1]}" 2>/dev/null; then cat "$run/worker.log"; exit 1; fi
  sleep 0.1
done

for pass in 1 2; do
  echo
  echo "demo: request $pass >>> [image: $image] $prompt"
  "$bin" submit --brokers "$brokers" --redis "$redis" --image "$image" --max-tokens 32 "$prompt"
done

[ "${MLLAMA_DEMO_GATEWAY:-1}" = 0 ] && exit 0
gateway_port=${MLLAMA_GATEWAY_PORT:-8080}
rm -f "$run/gateway.ports"
"$bin" gateway --set kafka.brokers="$brokers" --set redis.url="$redis" \
  --set model.dir="$model" --set gateway.instance="$gateway_instance" \
  --set gateway.listen=127.0.0.1:"$gateway_port" --set http.listen=127.0.0.1:0 \
  --port-file "$run/gateway.ports" >"$run/gateway.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  [ -s "$run/gateway.ports" ] && break
  if ! kill -0 "${pids[-1]}" 2>/dev/null; then cat "$run/gateway.log"; exit 1; fi
  sleep 0.1
done
[ -s "$run/gateway.ports" ] || { echo "demo: the gateway did not start; $run/gateway.log"; exit 1; }
echo
echo "demo: the chat page: http://127.0.0.1:$gateway_port/   (gateway log $run/gateway.log)"
echo "demo: or: curl -N http://127.0.0.1:$gateway_port/v1/chat/completions -H 'Content-Type: application/json' \\"
echo "        -d '{\"model\": \"$(basename "$model")\", \"stream\": true, \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}'"
echo "demo: Ctrl-C stops everything"
wait "${pids[-1]}"
