/* PEFT LoRA adapters for the micro model, made in a test: the two files of
 * an adapter of random weights, and their publication in Redis as a
 * publisher does it (both files and their digest, svc_redis_adapter_digest).
 * Header-only, for the tests that serve adapters (test_adapter_store,
 * test_worker_adapters). */
#ifndef ML_TEST_ADAPTER_UTIL_H
#define ML_TEST_ADAPTER_UTIL_H

#include "proc_util.h"

#include "checkpoint/safetensors.h"
#include "redis/redis.h"
#include "test_rand.h"

#define PU_ADAPTER_MAX_MODULES 8

/* One module of the micro model an adapter adapts (micro: text hidden 64,
 * 2 heads of 32, 1 K/V head; layer 1 is the cross-attention layer). */
typedef struct pu_lora_module {
    const char *name; /* after base_model.model. */
    int in, out;
} pu_lora_module;

/* An adapter's two files (malloc'd, the caller frees both). */
typedef struct pu_adapter_files {
    char *config, *weights;
    size_t config_len, weights_len;
} pu_adapter_files;

/* A rank-`rank` adapter of `modules` (n of them, at most
 * PU_ADAPTER_MAX_MODULES) with weights uniform in [-init, init), its
 * target_modules the regular expression `targets`; the weights file is
 * written to scratch/<tag>.safetensors on the way. */
static inline pu_adapter_files pu_adapter_make(const char *scratch, const char *tag,
                                               const char *targets, const pu_lora_module *modules,
                                               int n, int rank, int alpha, float init)
{
    char cfg[512], path[2 * PU_PATH_MAX], err[256];
    snprintf(cfg, sizeof cfg,
             "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": %d, \"bias\": \"none\", "
             "\"target_modules\": \"%s\"}",
             rank, alpha, targets);
    ml_tensor_view views[2 * PU_ADAPTER_MAX_MODULES];
    char names[2 * PU_ADAPTER_MAX_MODULES][128];
    float *data[2 * PU_ADAPTER_MAX_MODULES];
    for (int m = 0; m < n; m++) {
        for (int ab = 0; ab < 2; ab++) {
            int k = 2 * m + ab, rows = ab ? modules[m].out : rank, cols = ab ? rank : modules[m].in;
            snprintf(names[k], sizeof names[k], "base_model.model.%s.lora_%c.weight",
                     modules[m].name, "AB"[ab]);
            data[k] = xmalloc((size_t)rows * cols * sizeof *data[k]);
            fill(data[k], (size_t)rows * cols, -init, init);
            views[k] = (ml_tensor_view){.name = names[k], .dtype = ML_DTYPE_F32, .ndim = 2,
                                        .shape = {rows, cols}, .data = data[k],
                                        .nbytes = (size_t)rows * cols * sizeof *data[k]};
        }
    }
    snprintf(path, sizeof path, "%s/%s.safetensors", scratch, tag);
    ml_status st = ml_safetensors_write(path, views, (size_t)(2 * n), err, sizeof err);
    for (int k = 0; k < 2 * n; k++)
        free(data[k]);
    if (st != ML_OK)
        pu_die(err);
    pu_adapter_files f = {.config = strdup(cfg), .config_len = strlen(cfg)};
    f.weights = pu_slurp(path, &f.weights_len);
    if (!f.weights || !f.config)
        pu_die(path);
    return f;
}

static inline void pu_adapter_files_free(pu_adapter_files *f)
{
    free(f->config);
    free(f->weights);
}

/* HSET <prefix>:adapter:<name> config .. weights .. sha256 <digest> through
 * a plain connection to r (as the adapter publisher would); the digest into
 * sha (may be NULL). */
static inline void pu_adapter_publish(const pu_redis *r, const char *prefix, const char *name,
                                      const pu_adapter_files *f,
                                      char sha[SVC_SHA256_HEX_LEN + 1])
{
    char digest[SVC_SHA256_HEX_LEN + 1];
    svc_redis_adapter_digest(f->config, f->config_len, f->weights, f->weights_len, digest);
    redisReply *rep = pu_redis_cmd(r, "HSET %s:adapter:%s config %b weights %b sha256 %s",
                                   prefix, name, f->config, f->config_len, f->weights,
                                   f->weights_len, digest);
    check(rep && rep->type == REDIS_REPLY_INTEGER, "publish %s", name);
    freeReplyObject(rep);
    if (sha)
        memcpy(sha, digest, sizeof digest);
}

#endif
