/* LoRA adapter slots (adapters.h). Lookups scan the slots: a worker holds a
 * handful of slots and a lookup happens once per request, never per token. */
#include "runtime/adapters.h"

#include <assert.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"

struct ml_adapter {
    char name[ML_ADAPTER_NAME_MAX]; /* "" when the slot is empty */
    ml_lora *lora;                  /* owned */
    int index;
    int refs;
    uint64_t last_use;              /* ml_adapters.tick at the last acquire */
};

struct ml_adapters {
    ml_model *model;                /* borrowed */
    ml_adapter *slots;              /* owned (n_slots) */
    int n_slots, max_rank;
    ml_adapter_resolve_fn resolve;
    void *resolve_ctx;
    uint64_t tick;
    ml_adapters_stats stats;
};

ml_status ml_adapters_create(ml_adapters **out, ml_model *m, int n_slots, int max_rank,
                             ml_adapter_resolve_fn resolve, void *resolve_ctx, char *err,
                             size_t errlen)
{
    *out = NULL;
    if (n_slots < 1 || !resolve)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "adapters: need at least one slot and a resolver (slots %d)", n_slots);
    ml_adapters *a = calloc(1, sizeof *a);
    if (!a)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "adapters: out of memory");
    a->model = m;
    a->max_rank = max_rank;
    a->resolve = resolve;
    a->resolve_ctx = resolve_ctx;
    a->slots = calloc((size_t)n_slots, sizeof *a->slots);
    if (!a->slots) {
        free(a);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "adapters: out of memory");
    }
    for (int i = 0; i < n_slots; i++) {
        ml_status st = ml_lora_create(&a->slots[i].lora, m, max_rank, err, errlen);
        if (st != ML_OK) {
            ml_adapters_destroy(a);
            return st;
        }
        a->slots[i].index = i;
        a->n_slots = i + 1;
    }
    a->stats.slots = n_slots;
    /* Per device: a tensor-parallel model's slots hold each shard's share. */
    a->stats.bytes = (size_t)n_slots * ml_lora_slot_bytes(m, max_rank);
    *out = a;
    return ML_OK;
}

void ml_adapters_destroy(ml_adapters *a)
{
    if (!a)
        return;
    for (int i = 0; i < a->n_slots; i++) {
        assert(a->slots[i].refs == 0);
        ml_lora_destroy(a->slots[i].lora);
    }
    free(a->slots);
    free(a);
}

static ml_adapter *find(ml_adapters *a, const char *name)
{
    for (int i = 0; i < a->n_slots; i++)
        if (a->slots[i].name[0] && !strcmp(a->slots[i].name, name))
            return &a->slots[i];
    return NULL;
}

/* An empty slot, else the least recently used one no sequence references,
 * else NULL. */
static ml_adapter *victim(ml_adapters *a)
{
    ml_adapter *best = NULL;
    for (int i = 0; i < a->n_slots; i++) {
        ml_adapter *s = &a->slots[i];
        if (!s->name[0])
            return s;
        if (s->refs == 0 && (!best || s->last_use < best->last_use))
            best = s;
    }
    return best;
}

/* Load `name` from its directory into slot s. */
static ml_adapter_result load_into(ml_adapters *a, ml_adapter *s, const char *name, char *err,
                                   size_t errlen)
{
    char dir[PATH_MAX];
    if (!a->resolve(a->resolve_ctx, name, dir, sizeof dir)) {
        ml_fail(err, errlen, ML_ERR_NOT_FOUND, "unknown adapter '%s'", name);
        return ML_ADAPTER_UNKNOWN;
    }
    dir[sizeof dir - 1] = '\0'; /* whatever the resolver wrote */
    double t0 = ml_clock_ms();
    ml_lora_adapter *host = NULL;
    ml_status st = ml_lora_adapter_load(&host, dir, ml_model_config(a->model), err, errlen);
    if (st == ML_OK && ml_lora_adapter_rank(host) > a->max_rank)
        st = ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                     "adapter '%s' has rank %d; adapter slots hold ranks up to %d", name,
                     ml_lora_adapter_rank(host), a->max_rank);
    if (st != ML_OK) {
        ml_lora_adapter_destroy(host);
        a->stats.load_failures++;
        return ML_ADAPTER_INVALID;
    }
    /* From here the slot's previous adapter is gone, whatever happens. */
    int evicting = s->name[0] != '\0';
    a->stats.evictions += evicting;
    a->stats.resident -= evicting;
    s->name[0] = '\0';
    st = ml_lora_set(s->lora, host, err, errlen);
    ml_lora_adapter_destroy(host);
    if (st != ML_OK) {
        a->stats.load_failures++;
        return ML_ADAPTER_INVALID;
    }
    memcpy(s->name, name, strlen(name) + 1); /* the caller checked the length */
    a->stats.resident++;
    a->stats.loads++;
    a->stats.load_ms += ml_clock_ms() - t0;
    return ML_ADAPTER_READY;
}

ml_adapter_result ml_adapters_acquire(ml_adapters *a, const char *name, ml_adapter **out,
                                      char *err, size_t errlen)
{
    *out = NULL;
    if (strlen(name) >= ML_ADAPTER_NAME_MAX) {
        ml_fail(err, errlen, ML_ERR_INVALID_ARG, "adapter name of %zu bytes, limit %d",
                strlen(name), ML_ADAPTER_NAME_MAX - 1);
        return ML_ADAPTER_UNKNOWN;
    }
    ml_adapter *s = find(a, name);
    if (!s) {
        s = victim(a);
        if (!s)
            return ML_ADAPTER_BUSY;
        ml_adapter_result r = load_into(a, s, name, err, errlen);
        if (r != ML_ADAPTER_READY)
            return r;
    }
    a->stats.in_use += s->refs == 0;
    s->refs++;
    s->last_use = ++a->tick;
    *out = s;
    return ML_ADAPTER_READY;
}

void ml_adapters_release(ml_adapters *a, ml_adapter *s)
{
    assert(s->refs > 0);
    s->refs--;
    a->stats.in_use -= s->refs == 0;
}

int ml_adapters_known(ml_adapters *a, const char *name)
{
    if (strlen(name) >= ML_ADAPTER_NAME_MAX)
        return 0;
    if (find(a, name))
        return 1;
    char dir[PATH_MAX];
    return a->resolve(a->resolve_ctx, name, dir, sizeof dir);
}

const ml_lora *ml_adapter_lora(const ml_adapter *s) { return s->lora; }
const char *ml_adapter_name(const ml_adapter *s) { return s->name; }
int ml_adapter_index(const ml_adapter *s) { return s->index; }

void ml_adapters_get_stats(const ml_adapters *a, ml_adapters_stats *st) { *st = a->stats; }
