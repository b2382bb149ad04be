#!/bin/sh
# The compose stack's one-shot client: submits one chat request with the
# sample image to the request topic and prints the streamed answer as it
# arrives. With Redis given, `mllama submit` sends the request to a partition
# of the worker that already holds the image, so a second run skips the
# vision tower (mllama_image_cache_hits_total). Run it again with
#
#   docker compose -f ops/compose.yaml run --rm client
#   docker compose -f ops/compose.yaml run --rm -e PROMPT="What is in the background?" client
set -eu

brokers=${BROKERS:-kafka:9092}
redis=${REDIS_URL:-redis://redis:6379/0}
image=${IMAGE:-/samples/astronaut.jpg}
prompt=${PROMPT:-Describe this image.}
max_tokens=${MAX_TOKENS:-48}
# A CPU worker on the tiny model answers in seconds; the bound only keeps a
# broken stack from holding the client forever.
timeout_s=${TIMEOUT_S:-300}

echo "client: $image: $prompt"
exec mllama submit --brokers "$brokers" --redis "$redis" --image "$image" \
  --max-tokens "$max_tokens" --timeout "$timeout_s" "$prompt"
