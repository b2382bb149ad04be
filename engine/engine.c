/* The engine's front door (engine.h): backend selection by name, then the
 * model, tokenizer, image parameters and runtime on those backends. */
#include "engine.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "host_memory.h"

#ifdef MLLAMA_HAVE_CUDA
#include "mlk_backend.h"
#include "mlk_device.h"
#endif

static_assert(ML_ENGINE_MAX_WORLD == ML_CPU_GROUP_MAX, "engine.h's world limit is the CPU group's");

/* Largest device number a list may name. */
#define DEVICE_MAX 1023

struct ml_engine {
    ml_backend *be[ML_ENGINE_MAX_WORLD]; /* owned: be[0 .. world) */
    int world;
    const char *backend_name;            /* static */
    ml_model *model;                     /* owned */
    ml_tokenizer *tok;                   /* owned */
    ml_image_params image_params;
    ml_runtime *rt;                      /* owned */
    /* One device's memory plan, computed at open (ml_engine_memory_plan). */
    ml_memory_plan_spec plan_spec;
    ml_memory_plan plan;
    /* The CPU backend's device: what bounds its bytes (ML_HOST_MEMORY_UNKNOWN
     * on CUDA, whose plan is not checked here). */
    ml_host_memory_source host_memory;
};

/* ---- backends by name -------------------------------------------------------------- */

int ml_engine_parse_devices(const char *list, int *out, int max, char *err, size_t errlen)
{
    int n = 0;
    for (const char *p = list ? list : ""; *p;) {
        char *end;
        errno = 0;
        long d = strtol(p, &end, 10);
        if (errno || end == p || d < 0 || d > DEVICE_MAX || (*end && *end != ',') ||
            (*end == ',' && !end[1])) {
            ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                    "device list '%s': expected device numbers in [0, %d] separated by commas",
                    list, DEVICE_MAX);
            return -1;
        }
        for (int i = 0; i < n; i++)
            if (out[i] == (int)d) {
                ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                        "device list '%s': device %ld is listed twice", list, d);
                return -1;
            }
        if (n == max) {
            ml_fail(err, errlen, ML_ERR_INVALID_ARG, "device list '%s': more than %d devices", list,
                    max);
            return -1;
        }
        out[n++] = (int)d;
        p = *end ? end + 1 : end;
    }
    return n;
}

static ml_status cpu_open(ml_engine *e, int world, int threads, int bf16_activations,
                          int bf16_kv_cache, char *err, size_t errlen)
{
    /* The CPU "devices" of a group share the memory the process may hold
     * (the host's, or its cgroup's limit). Its working buffers are left out
     * of the plan: a few MiB of scratch per thread, and one op's converted
     * inputs (the act buffer: the vision attention's K and V by head or in
     * bf16 pairs, 66 MB for a 4-tile image at the real widths; a matmul's
     * rows rounded to bf16 pairs or quantized by W8A8). */
    e->plan_spec.device_bytes = ml_host_memory(&e->host_memory);
    e->plan_spec.backend_bytes = 0;
    e->backend_name = "cpu";
    ml_status st;
    if (world == 1) {
        e->be[0] = ml_backend_cpu_create(threads, err, errlen);
        st = e->be[0] ? ML_OK : ML_ERR_UNSUPPORTED;
    } else {
        int each = threads == 0 ? 0 : threads / world > 0 ? threads / world : 1;
        st = ml_backend_cpu_create_group(world, each, e->be, err, errlen);
    }
    for (int r = 0; st == ML_OK && bf16_activations && r < world; r++)
        st = ml_backend_cpu_bf16_activations(e->be[r], err, errlen);
    for (int r = 0; st == ML_OK && bf16_kv_cache && r < world; r++)
        st = ml_backend_cpu_bf16_kv_cache(e->be[r], err, errlen);
    if (st != ML_OK)
        for (int r = 0; r < world; r++)
            if (e->be[r]) {
                e->be[r]->ops->destroy(e->be[r]);
                e->be[r] = NULL;
            }
    return st;
}

#ifdef MLLAMA_HAVE_CUDA
static ml_status cuda_open(ml_engine *e, int world, const int *devices, size_t pool_bytes,
                           int batch_invariant, char *err, size_t errlen)
{
    e->backend_name = "cuda";
    /* The pool the backend takes: pool_bytes, or its share of the free
     * memory, planned here on the device's total (an upper bound); 0 when
     * the device cannot be queried (the plan then fits nothing). */
    mlk_device_info info;
    char qerr[256];
    e->plan_spec.device_bytes =
        pool_bytes ? pool_bytes
        : mlk_device_query(devices[0], &info, qerr, sizeof qerr) == 0
            ? (uint64_t)info.total_bytes * ML_PLAN_CUDA_POOL_SHARE_TENTHS / 10
            : 0;
    e->plan_spec.backend_bytes = ML_PLAN_CUDA_WORKSPACE_BYTES;
    if (world == 1) {
        e->be[0] = ml_backend_cuda_create(devices[0], pool_bytes, batch_invariant, err, errlen);
        return e->be[0] ? ML_OK : ML_ERR_UNSUPPORTED;
    }
    return ml_backend_cuda_create_group(world, devices, pool_bytes, batch_invariant, e->be, err,
                                        errlen);
}
#endif

static ml_status open_backends(ml_engine *e, const ml_engine_config *cfg, char *err,
                               size_t errlen)
{
    const char *name = cfg->backend ? cfg->backend : "auto";
    int want_cuda = !strcmp(name, "cuda");
    if (!want_cuda && strcmp(name, "auto") && strcmp(name, "cpu"))
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "backend '%s': expected auto, cpu or cuda",
                       name);
    int world = cfg->world;
    if (world < 1 || world > ML_ENGINE_MAX_WORLD)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "tensor parallel world %d: expected 1 to %d", world, ML_ENGINE_MAX_WORLD);
    int ids[ML_ENGINE_MAX_WORLD];
    int n = ml_engine_parse_devices(cfg->devices, ids, ML_ENGINE_MAX_WORLD, err, errlen);
    if (n < 0)
        return ML_ERR_INVALID_ARG;
    if (n != 0 && n != world)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "%d devices listed ('%s') for a tensor-parallel world of %d", n,
                       cfg->devices, world);
    for (int i = n; i < world; i++)
        ids[i] = i;
    ml_status st;
#ifdef MLLAMA_HAVE_CUDA
    if (want_cuda || (!strcmp(name, "auto") && mlk_device_count() > 0))
        st = cuda_open(e, world, ids, cfg->pool_bytes, cfg->batch_invariant, err, errlen);
    else
        st = cpu_open(e, world, cfg->threads, cfg->cpu_bf16_activations,
                      cfg->cpu_bf16_kv_cache, err, errlen);
#else
    if (want_cuda)
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                       "backend 'cuda': this build has no CUDA backend (nvcc was not found)");
    st = cpu_open(e, world, cfg->threads, cfg->cpu_bf16_activations, cfg->cpu_bf16_kv_cache,
                  err, errlen);
#endif
    if (st == ML_OK)
        e->world = world;
    else
        memset(e->be, 0, sizeof e->be);
    return st;
}

/* ---- open / close ---------------------------------------------------------------- */

/* The model directory's tokenizer.json, else the fallback. */
static ml_status open_tokenizer(ml_engine *e, const ml_engine_config *cfg, char *err,
                                size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", cfg->model_dir);
    FILE *f = fopen(path, "rb");
    if (f)
        fclose(f);
    else if (cfg->fallback_tokenizer)
        snprintf(path, sizeof path, "%s", cfg->fallback_tokenizer);
    return ml_tokenizer_load(path, &e->tok, err, errlen);
}

/* On the CPU, a plan above the memory the process may hold fails here,
 * before the runtime makes its pools: the pools are faulted in when they
 * are made, so past that memory the kernel's OOM killer would end the
 * process mid-start, without a word. A CPU group's ranks share that memory,
 * each holding a device's plan. (A device's plan is a warning: its
 * allocations fail with their own errors, engine.h.) */
static ml_status check_host_plan(const ml_engine *e, char *err, size_t errlen)
{
    const ml_memory_plan *p = &e->plan;
    const uint64_t need = p->used * (uint64_t)e->world;
    if (e->host_memory == ML_HOST_MEMORY_UNKNOWN || need <= e->plan_spec.device_bytes)
        return ML_OK;
    char ranks[48] = "";
    if (e->world > 1)
        snprintf(ranks, sizeof ranks, " a rank, %.2f GiB for %d ranks", ml_plan_gib(need),
                 e->world);
    return ml_fail(err, errlen, ML_ERR_NOMEM,
                   "memory plan: weights %.2f GiB + K/V pool %.2f + image states %.2f + adapter "
                   "slots %.2f + workspace %.2f = %.2f GiB%s, above the %.2f GiB of this host's "
                   "%s; lower runtime.kv_mib or runtime.image_mib",
                   ml_plan_gib(p->weights), ml_plan_gib(p->kv_pool_bytes),
                   ml_plan_gib(p->image_pool_bytes), ml_plan_gib(e->plan_spec.adapter_bytes),
                   ml_plan_gib(p->workspace), ml_plan_gib(p->used), ranks,
                   ml_plan_gib(e->plan_spec.device_bytes),
                   ml_host_memory_source_name(e->host_memory));
}

ml_status ml_engine_open(ml_engine **out, const ml_engine_config *cfg, char *err,
                         size_t errlen)
{
    *out = NULL;
    if (!cfg->model_dir)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "engine: no model directory");
    ml_engine *e = calloc(1, sizeof *e);
    if (!e)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "engine: out of memory");
    ml_status st = open_backends(e, cfg, err, errlen);
    if (st == ML_OK)
        st = ml_model_load_tp(&e->model, cfg->model_dir, e->be, e->world, &cfg->limits, err,
                              errlen);
    if (st == ML_OK)
        st = open_tokenizer(e, cfg, err, errlen);
    if (st == ML_OK)
        st = ml_image_params_load(cfg->model_dir, &e->image_params, err, errlen);
    if (st == ML_OK) {
        if (cfg->max_image_pixels)
            e->image_params.limits.max_pixels = cfg->max_image_pixels;
        ml_runtime_config rc = cfg->runtime;
        if (rc.image_bytes == 0)
            rc.image_bytes = ml_model_image_state_bytes(e->model) *
                             (size_t)(cfg->image_states > 0 ? cfg->image_states : 1);
        e->plan_spec.kv_bytes = rc.kv_bytes;
        e->plan_spec.image_bytes = rc.image_bytes;
        const int rank = rc.max_adapter_rank ? rc.max_adapter_rank : cfg->limits.max_lora_rank;
        e->plan_spec.adapter_bytes =
            rc.max_adapters > 0 ? (uint64_t)rc.max_adapters * ml_lora_slot_bytes(e->model, rank)
                                : 0;
        st = ml_model_memory_plan(e->model, &e->plan_spec, &e->plan, err, errlen);
        if (st == ML_OK)
            st = check_host_plan(e, err, errlen);
        if (st == ML_OK)
            st = ml_runtime_create(&e->rt, e->model, e->tok, &rc, err, errlen);
    }
    if (st != ML_OK) {
        ml_engine_close(e);
        return st;
    }
    *out = e;
    return ML_OK;
}

void ml_engine_close(ml_engine *e)
{
    if (!e)
        return;
    ml_runtime_destroy(e->rt);
    ml_model_destroy(e->model);
    ml_tokenizer_destroy(e->tok);
    for (int r = 0; r < e->world; r++)
        e->be[r]->ops->destroy(e->be[r]);
    free(e);
}

ml_model *ml_engine_model(const ml_engine *e) { return e->model; }
ml_tokenizer *ml_engine_tokenizer(const ml_engine *e) { return e->tok; }
ml_runtime *ml_engine_runtime(const ml_engine *e) { return e->rt; }
const ml_image_params *ml_engine_image_params(const ml_engine *e) { return &e->image_params; }
const char *ml_engine_backend_name(const ml_engine *e) { return e->backend_name; }
int ml_engine_world(const ml_engine *e) { return e->world; }

double ml_engine_weights_read(const ml_engine *e, int passes, uint64_t *bytes)
{
    *bytes = 0;
    if (strcmp(e->backend_name, "cpu") != 0 || e->world != 1)
        return 0;
    return ml_backend_cpu_weights_read(e->be[0], passes, bytes);
}

const ml_memory_plan *ml_engine_memory_plan(const ml_engine *e, const ml_memory_plan_spec **spec)
{
    if (spec)
        *spec = &e->plan_spec;
    return &e->plan;
}

/* ---- request builders ------------------------------------------------------------ */

ml_status ml_engine_prepare_image(const ml_engine *e, const uint8_t *bytes, size_t n,
                                  ml_request_image *im, char *err, size_t errlen)
{
    ml_image_layout layout;
    ml_status st = ml_image_prepare(bytes, n, &e->image_params, &im->pixels, &layout, err,
                                    errlen);
    if (st != ML_OK)
        return st;
    im->aspect_ratio_id = (int)layout.aspect_ratio_id;
    im->n_tiles = (int)layout.n_tiles;
    for (uint32_t t = 0; t < layout.max_tiles && t < ML_RUNTIME_MAX_TILES; t++)
        im->aspect_ratio_mask[t] = layout.aspect_ratio_mask[t];
    return ML_OK;
}

void ml_engine_add_stop_ids(const ml_engine *e, ml_sampling_params *p)
{
    const ml_text_config *tc = &ml_model_config(e->model)->text;
    for (int i = 0; i < tc->n_eos && p->n_stop_ids < ML_SAMPLER_MAX_STOP_IDS; i++)
        p->stop_ids[p->n_stop_ids++] = tc->eos_token_ids[i];
}
