#!/usr/bin/env bash
# The main job on the embedded defaults (README "Run it"): install what is
# missing, build, make a random-weight model of the real architecture when no
# model is given, and generate from the sample image with the Instruct
# template, streaming the tokens to the terminal.
#
#   MLLAMA_MODEL=/path/to/Llama-3.2-11B-Vision-Instruct bash ops/demo.sh
#
# uses a real checkpoint instead (config.json + safetensors + tokenizer.json).
set -euo pipefail
cd "$(dirname "$0")/.."

bash ops/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target mllama

model=${MLLAMA_MODEL:-build/models/tiny}
if [ ! -f "$model/config.json" ]; then
  echo "demo: no model at $model; writing the random-weight 'tiny' preset there"
  build/service/mllama mkmodel --preset tiny --out "$model"
fi

image=${MLLAMA_IMAGE:-config/samples/astronaut.jpg}
prompt=${MLLAMA_PROMPT:-"Describe this image in one sentence."}
echo "demo: $model, image $image"
echo "demo: >>> $prompt"
build/service/mllama run --model "$model" --image "$image" --chat "$prompt" --max-tokens 32
