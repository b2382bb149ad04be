/* The engine's front door: what service/ may use (README.md "Contributing",
 * Layout: service/ includes only this header and never a backend's).
 *
 * An ml_engine is one model ready to serve: the backends chosen by name
 * (ggml_backend_init_by_name's shape), the model loaded on them (split over
 * a tensor-parallel group when asked), its tokenizer and image parameters,
 * and the runtime that schedules requests on it. The types of the calls a
 * caller then makes (runtime submit, tokenizer, chat template, image
 * preprocessing, sampling controls, JSON Schema grammars) come with the
 * headers included below.
 * @locality: open and close on the thread that will drive the runtime (the
 * runtime's own contract: runtime/runtime.h); the accessors and request
 * builders on any thread (what they read is immutable once open). */
#ifndef ML_ENGINE_H
#define ML_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h" /* JSON Schema grammars: the caller compiles and caches them */
#include "image/image.h"
#include "list.h" /* the engine's intrusive list, for the caller's registries too */
#include "checkpoint/mkmodel.h"
#include "image/prepare.h"
#include "model/lora.h" /* adapters: the worker checks one before it keeps it */
#include "model/mllama.h"
#include "runtime/runtime.h"
#include "runtime/sampler.h"
#include "runtime/stop.h"
#include "sha256.h"
#include "status.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

/* Largest tensor-parallel world: the CPU group's limit (backend.h
 * ML_CPU_GROUP_MAX; engine.c checks they agree). */
#define ML_ENGINE_MAX_WORLD 64

typedef struct ml_engine_config {
    const char *model_dir;   /* a Hugging Face checkpoint directory (borrowed) */
    /* "cpu", "cuda", or "auto" (CUDA when this build has it and a device is
     * present, else the CPU). */
    const char *backend;
    int world;               /* 1, or the tensor-parallel group's size */
    /* "0,1,2,3": exactly `world` CUDA devices; NULL or "" = 0 .. world-1
     * (the CPU ignores it once checked). */
    const char *devices;
    int threads;             /* CPU threads in all (0 = every core), shared by a group */
    size_t pool_bytes;       /* each CUDA device's pool (0 = most of its free memory) */
    /* CUDA only (the CPU backend is batch invariant always): nonzero makes
     * every op's result for a row independent of the other rows of the step
     * (ml_backend_cuda_create's batch_invariant), so a seeded request samples
     * the same tokens alone and in any batch; 0 keeps the fastest kernel
     * choice per shape. */
    int batch_invariant;
    /* CPU only: nonzero makes every bf16 Linear multiply its inputs rounded
     * to bf16 (ml_backend_cpu_bf16_activations; model.cpu_activations =
     * "bf16"), and the open fails with ML_ERR_UNSUPPORTED on a CPU without
     * AVX-512 BF16; 0 keeps f32 activations, the reference numerics. The
     * CUDA backend's GEMMs take bf16 inputs always. */
    int cpu_bf16_activations;
    /* CPU only: nonzero stores the K/V caches and the images' cross-attention
     * states in bf16 (ml_backend_cpu_bf16_kv_cache; model.cpu_kv_cache =
     * "bf16"), as the CUDA backend and transformers' bf16 models keep them:
     * half the memory per cached token and per image, half the bytes a
     * decode step's attention reads, at the rounding of every cached K and
     * V; any CPU. 0 keeps them f32, the reference numerics. */
    int cpu_bf16_kv_cache;
    ml_model_limits limits;  /* ml_model_limits_default() and the caller's changes */
    /* The tokenizer.json used when model_dir has none (borrowed; NULL: none). */
    const char *fallback_tokenizer;
    uint64_t max_image_pixels; /* one image's decoded pixels (0 = the parameters' own) */
    /* The runtime: callbacks and budgets as runtime/runtime.h says, except
     * that image_bytes 0 means room for `image_states` image states (at
     * least one), a size only the loaded model knows. */
    ml_runtime_config runtime;
    int image_states;
} ml_engine_config;

typedef struct ml_engine ml_engine;

/* Open the engine cfg describes. Returns ML_OK and *out (owned: close it),
 * or an error naming what failed (the backend name, the device list, the
 * checkpoint, the tokenizer, the budgets) with *out NULL and nothing left
 * allocated: ML_ERR_INVALID_ARG (a backend name, world or device list that
 * cannot be), ML_ERR_UNSUPPORTED ("cuda" in a build without it),
 * ML_ERR_NOMEM (on the CPU, a memory plan above the memory the process may
 * hold: ml_engine_memory_plan), the errors of ml_model_load_tp,
 * ml_tokenizer_load, ml_image_params_load and ml_runtime_create. */
ml_status ml_engine_open(ml_engine **out, const ml_engine_config *cfg, char *err,
                         size_t errlen);

/* Destroy the runtime, the model, the tokenizer and the backends, in that
 * order. NULL is a no-op. */
void ml_engine_close(ml_engine *e);

/* Borrowed parts; they live as long as e. */
ml_model *ml_engine_model(const ml_engine *e);
ml_tokenizer *ml_engine_tokenizer(const ml_engine *e);
ml_runtime *ml_engine_runtime(const ml_engine *e);
const ml_image_params *ml_engine_image_params(const ml_engine *e);
/* "cpu" or "cuda" (static), and the devices the model is split over. */
const char *ml_engine_backend_name(const ml_engine *e);
int ml_engine_world(const ml_engine *e);
/* One device's memory plan of the open engine (model/memory_plan.h), and in
 * *spec (when non-NULL) what it was computed for: the device's usable bytes
 * (the CUDA pool: the config's pool_bytes, or backend.h's
 * ML_PLAN_CUDA_POOL_SHARE_TENTHS of the device's total; the CPU: the memory
 * the process may hold, host_memory.h), the backend's own workspace, the
 * runtime's budgets. On the CPU a plan that does not fit fails
 * ml_engine_open (ML_ERR_NOMEM, before the runtime's pools are made); on
 * CUDA it is the caller's to report. Borrowed; lives as long as e. */
const ml_memory_plan *ml_engine_memory_plan(const ml_engine *e, const ml_memory_plan_spec **spec);

/* The CPU backend's read of its packed weights (cpu/cpu_backend.h
 * ml_backend_cpu_weights_read: the fastest of `passes` streaming reads,
 * seconds, and the bytes in *bytes), for a benchmark to bound a decode step
 * by this process's own memory. 0 and *bytes 0 on the CUDA backend and with
 * tensor parallelism, whose shards are read at once by their own threads. */
double ml_engine_weights_read(const ml_engine *e, int passes, uint64_t *bytes);

/* ---- request builders ------------------------------------------------------------ */

/* Decode and preprocess image bytes into im's pixels (transferred to im),
 * aspect ratio and tile mask, with the engine's image parameters; im->key
 * is the caller's (an image's key depends on the adapter: runtime.h).
 * Errors: those of ml_image_prepare (ML_ERR_TOO_LARGE for an image over the
 * limits); im's pixels are NULL then. */
ml_status ml_engine_prepare_image(const ml_engine *e, const uint8_t *bytes, size_t n,
                                  ml_request_image *im, char *err, size_t errlen);

/* Append the model's end-of-sequence ids (config.json eos_token_id) to p's
 * stop ids, as many as fit. */
void ml_engine_add_stop_ids(const ml_engine *e, ml_sampling_params *p);

/* Parse a device list: comma-separated device numbers in [0, 1023], none
 * twice, at most max of them; NULL or "" is the empty list. Returns the
 * count with the numbers in out, or -1 with the reason in err. For
 * configuration checks before anything is opened. */
int ml_engine_parse_devices(const char *list, int *out, int max, char *err, size_t errlen);

#endif
