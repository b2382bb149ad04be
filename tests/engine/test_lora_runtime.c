/* LoRA in the runtime (engine/runtime/adapters.*, runtime.c) on the LoRA
 * golden fixture (m3's configuration, two images) and the real tokenizer:
 * - one request per adapter (and the base model) reproduces PEFT +
 *   transformers' 16 greedy tokens end to end;
 * - a mixed batch (base, adapter 1, adapter 2; two images, one image, text
 *   only) joining at different steps gives exactly what each gives alone;
 * - more adapters than slots: requests wait for a slot, slots are swapped
 *   least-recently-used, and every output is still what it is alone;
 * - image states: an adapter that leaves images alone shares the base
 *   model's resident states, one that changes them gets its own;
 * - unknown adapters, a worker without slots and broken adapter files end
 *   the request with ML_REQERR_UNKNOWN_ADAPTER while others keep running. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "model/mllama.h"
#include "model/safetensors.h"
#include "runtime/runtime.h"

#define FIXTURE ML_SOURCE_DIR "/tests/golden/fixtures/lora"
#define TOKENIZER ML_SOURCE_DIR "/config/tokenizer/tokenizer.json"
#define A1 "a1_all_r8"
#define A2 "a2_text_rslora_r4"
#define GREEDY_STEPS 16
#define MAX_OUT 64
#define MAX_PROMPT 64
#define MAX_TILES 4
#define KV_BLOCKS 64

typedef struct fixture {
    ml_backend *be;
    ml_model *model;
    ml_tokenizer *tok;
    int n_prompt, T, slot_floats;
    int32_t prompt[MAX_PROMPT];
    float *pixels; /* (2, T, 3, S, S) */
    int ar_ids[2], n_tiles[2];
    uint8_t ar_mask[2][ML_RUNTIME_MAX_TILES];
} fixture;

typedef struct result {
    int32_t out[MAX_OUT];
    int n_out, done;
    ml_finish_reason reason;
    ml_request_error error;
    char message[256];
    ml_usage usage;
} result;

static void on_token(void *ctx, int32_t id, const char *text, size_t len, const ml_logprobs *lp)
{
    result *r = ctx;
    if (r->n_out < MAX_OUT)
        r->out[r->n_out++] = id;
}

static void on_finish(void *ctx, const char *tail, size_t tail_len, ml_finish_reason reason,
                      ml_request_error error, const char *message, const ml_usage *usage)
{
    result *r = ctx;
    r->done++;
    r->reason = reason;
    r->error = error;
    snprintf(r->message, sizeof r->message, "%s", message ? message : "");
    r->usage = *usage;
}

/* Adapter names the resolver knows: the fixture's, a second name for
 * adapter 1's files, and one whose directory holds no adapter. */
static int resolve(void *ctx, const char *name, char *dir, size_t n)
{
    static const struct {
        const char *name, *dir;
    } known[] = {
        {A1, FIXTURE "/" A1},
        {A2, FIXTURE "/" A2},
        {"a1_copy", FIXTURE "/" A1},
        {"broken", FIXTURE "/model"},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (!strcmp(name, known[i].name)) {
            snprintf(dir, n, "%s", known[i].dir);
            return 1;
        }
    }
    return 0;
}

static int64_t *read_i64(ml_safetensors *st, const char *name, size_t *n)
{
    char err[256];
    const ml_tensor_view *t = ml_safetensors_find(st, name);
    *n = t ? (size_t)ml_tensor_view_numel(t) : 0;
    int64_t *v = malloc(*n * sizeof *v + 1);
    if (t)
        ml_tensor_view_read_i64(t, v, err, sizeof err);
    return v;
}

static void load_fixture(fixture *f)
{
    char err[512];
    memset(f, 0, sizeof *f);
    f->be = ml_backend_cpu_create(2, err, sizeof err);
    ml_model_limits lim = ml_model_limits_default();
    lim.max_step_tokens = 128;
    lim.max_step_seqs = 8;
    lim.max_logit_rows = 8;
    lim.max_seq_images = 2;
    lim.max_lora_rank = 8;
    ml_safetensors *in = NULL;
    if (!f->be || ml_model_load(&f->model, FIXTURE "/model", f->be, &lim, err, sizeof err) ||
        ml_tokenizer_load(TOKENIZER, &f->tok, err, sizeof err) ||
        ml_safetensors_open(&in, FIXTURE "/inputs.safetensors", err, sizeof err)) {
        fprintf(stderr, "fixture: %s\n", err);
        exit(1);
    }
    const ml_config *cfg = ml_model_config(f->model);
    f->T = cfg->vision.max_num_tiles;
    f->slot_floats = f->T * 3 * cfg->vision.image_size * cfg->vision.image_size;
    size_t n;
    int64_t *ids = read_i64(in, "input_ids", &n), *ar = read_i64(in, "aspect_ratio_ids", &n);
    int64_t *mask = read_i64(in, "aspect_ratio_mask", &n);
    f->n_prompt = 0;
    for (size_t i = 0; i < (size_t)ml_tensor_view_numel(ml_safetensors_find(in, "input_ids"));
         i++)
        f->prompt[f->n_prompt++] = (int32_t)ids[i];
    const ml_tensor_view *real = ml_safetensors_find(in, "pixel_values_real_tiles");
    float *tiles = malloc((size_t)ml_tensor_view_numel(real) * sizeof *tiles);
    ml_tensor_view_read_f32(real, tiles, err, sizeof err);
    size_t tile = (size_t)f->slot_floats / f->T, next = 0;
    f->pixels = calloc(2 * (size_t)f->slot_floats, sizeof *f->pixels);
    for (int i = 0; i < 2; i++) {
        f->ar_ids[i] = (int)ar[i];
        for (int t = 0; t < f->T; t++) {
            f->ar_mask[i][t] = mask[i * f->T + t] != 0;
            f->n_tiles[i] += f->ar_mask[i][t];
            if (f->ar_mask[i][t])
                memcpy(f->pixels + (size_t)i * f->slot_floats + (size_t)t * tile,
                       tiles + tile * next++, tile * sizeof *tiles);
        }
    }
    free(tiles);
    free(ids);
    free(ar);
    free(mask);
    ml_safetensors_destroy(in);
}

/* The reference greedy tokens of a fixture case (base, A1, A2). */
static void reference_tokens(const char *ref, int32_t *out)
{
    char path[512], err[256];
    snprintf(path, sizeof path, FIXTURE "/%s/reference.safetensors", ref);
    ml_safetensors *st;
    if (ml_safetensors_open(&st, path, err, sizeof err) != ML_OK) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    size_t n;
    int64_t *v = read_i64(st, "greedy_tokens", &n);
    for (size_t i = 0; i < n && i < GREEDY_STEPS; i++)
        out[i] = (int32_t)v[i];
    free(v);
    ml_safetensors_destroy(st);
}

static ml_runtime *runtime(fixture *f, int slots, int image_slots, int max_running)
{
    const ml_config *cfg = ml_model_config(f->model);
    int n_self = cfg->text.num_hidden_layers - cfg->text.n_cross_layers;
    size_t block = ml_kv_cache_block_bytes(n_self, ml_model_limits_of(f->model)->kv_block_size,
                                           cfg->text.num_key_value_heads, cfg->text.head_dim,
                                           f->be->ops->kv_elem_size);
    ml_runtime_config rc = {
        .kv_bytes = KV_BLOCKS * block,
        .image_bytes = (size_t)image_slots * ml_model_image_state_bytes(f->model),
        .max_running = max_running,
        .max_step_tokens = 128,
        .max_adapters = slots,
        .resolve_adapter = resolve,
    };
    ml_runtime *rt;
    char err[256];
    if (ml_runtime_create(&rt, f->model, f->tok, &rc, err, sizeof err) != ML_OK) {
        fprintf(stderr, "runtime: %s\n", err);
        exit(1);
    }
    return rt;
}

typedef enum req_kind {
    REQ_TWO_IMAGES, /* the fixture prompt */
    REQ_ONE_IMAGE,  /* its second <|image|> replaced by a text token */
    REQ_TEXT_ONLY,  /* both replaced */
} req_kind;

/* Submit a request of kind k with adapter (NULL: base); resident != 0 names
 * the images by key only. */
static void submit(fixture *f, ml_runtime *rt, req_kind k, const char *adapter, int max_tokens,
                   int resident, result *r)
{
    const int32_t image_token = ml_model_config(f->model)->image_token_index;
    const int32_t filler = 17; /* an ordinary text token of the small vocabulary */
    int32_t prompt[MAX_PROMPT];
    ml_request_image images[2];
    int n_images = 0, seen = 0;
    for (int i = 0; i < f->n_prompt; i++) {
        prompt[i] = f->prompt[i];
        if (prompt[i] != image_token)
            continue;
        if (!(k == REQ_TWO_IMAGES || (k == REQ_ONE_IMAGE && seen == 0))) {
            prompt[i] = filler;
            seen++;
            continue;
        }
        ml_request_image *im = &images[n_images++];
        memset(im, 0, sizeof *im);
        im->key[0] = (uint8_t)(seen + 1);
        im->aspect_ratio_id = f->ar_ids[seen];
        im->n_tiles = f->n_tiles[seen];
        memcpy(im->aspect_ratio_mask, f->ar_mask[seen], sizeof im->aspect_ratio_mask);
        if (!resident) {
            im->pixels = malloc((size_t)f->slot_floats * sizeof(float));
            memcpy(im->pixels, f->pixels + (size_t)seen * f->slot_floats,
                   (size_t)f->slot_floats * sizeof(float));
        }
        seen++;
    }
    ml_request req = {
        .prompt = prompt, .n_prompt = f->n_prompt, .images = images, .n_images = n_images,
        .adapter = adapter,
        .cb = {.on_token = on_token, .on_finish = on_finish, .ctx = r},
    };
    ml_sampling_params_default(&req.sampling);
    req.sampling.temperature = 0;
    req.sampling.max_tokens = (uint32_t)max_tokens;
    uint64_t h;
    char err[256];
    check(ml_runtime_submit(rt, &req, &h, err, sizeof err) == ML_OK, "submit: %s", err);
}

static void drain(ml_runtime *rt)
{
    char err[256];
    for (int guard = 0; ml_runtime_active(rt) > 0 && guard < 10000; guard++)
        check(ml_runtime_step(rt, err, sizeof err) == ML_OK, "step: %s", err);
    check(ml_runtime_active(rt) == 0, "runtime drained");
}

static int same_output(const result *a, const result *b)
{
    return a->done == 1 && b->done == 1 && a->reason == b->reason && a->n_out == b->n_out &&
           !memcmp(a->out, b->out, (size_t)a->n_out * sizeof a->out[0]);
}

/* ======================================================================== */
/* cases                                                                    */
/* ======================================================================== */

static void test_golden(fixture *f)
{
    static const struct {
        const char *adapter, *ref;
    } cases[] = {{NULL, "base"}, {A1, A1}, {A2, A2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t want[GREEDY_STEPS];
        reference_tokens(cases[i].ref, want);
        ml_runtime *rt = runtime(f, 1, 2, 8);
        result r = {0};
        submit(f, rt, REQ_TWO_IMAGES, cases[i].adapter, GREEDY_STEPS, 0, &r);
        drain(rt);
        check(r.done == 1 && r.reason == ML_FINISH_REASON_LENGTH && r.n_out == GREEDY_STEPS &&
                  !memcmp(r.out, want, sizeof want),
              "%s: runtime greedy tokens equal PEFT generate() (%d tokens, %s)", cases[i].ref,
              r.n_out, r.message);
        ml_runtime_destroy(rt);
    }
}

/* Each request alone, then all together joining every few steps. */
static void run_mixed(fixture *f, const req_kind *kinds, const char *const *adapters,
                      const int *max_tokens, int n, int slots, int max_running, const char *what)
{
    result alone[16], together[16];
    memset(alone, 0, sizeof alone);
    memset(together, 0, sizeof together);
    for (int i = 0; i < n; i++) {
        ml_runtime *rt = runtime(f, 1, 2, 8);
        submit(f, rt, kinds[i], adapters[i], max_tokens[i], 0, &alone[i]);
        drain(rt);
        ml_runtime_destroy(rt);
    }
    /* Images of three adapter identities (base, a1, a1_copy) in flight: room
     * for all of them, so only slots limit admission. */
    ml_runtime *rt = runtime(f, slots, 6, max_running);
    char err[256];
    for (int i = 0; i < n; i++) {
        submit(f, rt, kinds[i], adapters[i], max_tokens[i], 0, &together[i]);
        for (int s = 0; s < 2; s++)
            check(ml_runtime_step(rt, err, sizeof err) == ML_OK, "step: %s", err);
    }
    drain(rt);
    ml_runtime_stats st;
    ml_runtime_get_stats(rt, &st);
    fprintf(stderr, "  %s: %llu steps, %llu adapter loads, %llu evictions\n", what,
            (unsigned long long)st.steps, (unsigned long long)st.adapters.loads,
            (unsigned long long)st.adapters.evictions);
    for (int i = 0; i < n; i++)
        check(same_output(&together[i], &alone[i]),
              "%s: request %d (%s, kind %d) batched equals alone (%d vs %d tokens; %s)", what, i,
              adapters[i] ? adapters[i] : "base", kinds[i], together[i].n_out, alone[i].n_out,
              together[i].message);
    check(st.adapters.in_use == 0 && st.adapters.resident <= slots, "%s: slots released",
          what);
    int distinct = 0;
    for (int i = 0; i < n; i++) {
        int seen = !adapters[i];
        for (int j = 0; j < i && !seen; j++)
            seen = adapters[j] && !strcmp(adapters[i], adapters[j]);
        distinct += !seen;
    }
    if (distinct > slots)
        check(st.adapters.evictions > 0 && st.adapters.loads > (uint64_t)slots,
              "%s: slots were swapped", what);
    else
        check(st.adapters.evictions == 0 && st.adapters.loads == (uint64_t)distinct,
              "%s: each adapter loaded once", what);
    ml_runtime_destroy(rt);
}

static void test_mixed_batch(fixture *f)
{
    static const req_kind kinds[] = {REQ_TWO_IMAGES, REQ_TWO_IMAGES, REQ_TEXT_ONLY,
                                     REQ_TWO_IMAGES, REQ_ONE_IMAGE, REQ_TWO_IMAGES,
                                     REQ_TEXT_ONLY};
    static const char *const adapters[] = {A1, NULL, A2, A2, A1, A1, NULL};
    static const int max_tokens[] = {14, 10, 12, 16, 8, 6, 9};
    run_mixed(f, kinds, adapters, max_tokens, 7, 2, 8, "mixed batch, 2 slots for 2 adapters");
}

static void test_lru(fixture *f)
{
    /* Three adapter names (a1_copy is a1's files under another name) for
     * two slots: the third waits until a slot is idle, then replaces the
     * least recently used. */
    static const req_kind kinds[] = {REQ_TWO_IMAGES, REQ_TEXT_ONLY, REQ_TWO_IMAGES,
                                     REQ_ONE_IMAGE,  REQ_TEXT_ONLY, REQ_TWO_IMAGES};
    static const char *const adapters[] = {A1, A2, "a1_copy", A2, A1, "a1_copy"};
    static const int max_tokens[] = {6, 12, 8, 5, 7, 6};
    run_mixed(f, kinds, adapters, max_tokens, 6, 2, 8, "3 adapters, 2 slots");
    run_mixed(f, kinds, adapters, max_tokens, 6, 1, 2, "3 adapters, 1 slot, 2 running");
}

static void test_image_states(fixture *f)
{
    ml_runtime *rt = runtime(f, 2, 6, 8);
    ml_image_cache *cache = ml_runtime_image_cache(rt);
    result base = {0}, text_adapter = {0}, vision_adapter = {0}, again = {0}, missing = {0};

    /* A resident image named for an adapter that changes images, before any
     * state for it exists: refused at admission. */
    submit(f, rt, REQ_ONE_IMAGE, A1, 2, 1, &missing);
    drain(rt);
    check(missing.done == 1 && missing.error == ML_REQERR_INVALID_IMAGE,
          "no state for (image, a1) yet: invalid image (%s)", missing.message);

    submit(f, rt, REQ_TWO_IMAGES, NULL, 2, 0, &base);
    drain(rt);
    check(ml_image_cache_count(cache) == 2, "base: two states");
    submit(f, rt, REQ_TWO_IMAGES, A2, 2, 0, &text_adapter);
    drain(rt);
    check(ml_image_cache_count(cache) == 2 && text_adapter.usage.images_cached == 2,
          "a2 leaves images alone: it reuses the base states");
    submit(f, rt, REQ_TWO_IMAGES, A1, 2, 0, &vision_adapter);
    drain(rt);
    check(ml_image_cache_count(cache) == 4 && vision_adapter.usage.images_cached == 0,
          "a1 changes images: two states of its own");
    submit(f, rt, REQ_TWO_IMAGES, A1, 2, 1, &again);
    drain(rt);
    check(again.done == 1 && again.reason == ML_FINISH_REASON_LENGTH &&
              again.usage.images_cached == 2 && same_output(&again, &vision_adapter),
          "a1 by resident keys: its own states, same output (%s)", again.message);
    ml_runtime_destroy(rt);
}

static void test_unknown(fixture *f)
{
    ml_runtime *rt = runtime(f, 1, 2, 8);
    result unknown = {0}, broken = {0}, fine = {0};
    submit(f, rt, REQ_TEXT_ONLY, "no_such_adapter", 4, 0, &unknown);
    check(unknown.done == 1 && unknown.reason == ML_FINISH_REASON_ERROR &&
              unknown.error == ML_REQERR_UNKNOWN_ADAPTER && strstr(unknown.message, "unknown"),
          "unknown adapter refused at submit (%s)", unknown.message);
    /* Known name, files that are no adapter: refused at admission; the
     * request beside it runs. */
    submit(f, rt, REQ_TEXT_ONLY, "broken", 4, 0, &broken);
    submit(f, rt, REQ_TEXT_ONLY, A2, 4, 0, &fine);
    drain(rt);
    check(broken.done == 1 && broken.error == ML_REQERR_UNKNOWN_ADAPTER &&
              strstr(broken.message, "adapter_config.json"),
          "broken adapter: unknown_adapter with the loader's reason (%s)", broken.message);
    check(fine.done == 1 && fine.reason == ML_FINISH_REASON_LENGTH && fine.n_out == 4,
          "the other request ran");
    ml_runtime_stats st;
    ml_runtime_get_stats(rt, &st);
    check(st.adapters.load_failures == 1 && st.adapters.slots == 1 && st.adapters.bytes > 0,
          "stats count the failed load and the slot memory");
    ml_runtime_destroy(rt);

    rt = runtime(f, 0, 2, 8);
    result off = {0};
    submit(f, rt, REQ_TEXT_ONLY, A1, 4, 0, &off);
    check(off.done == 1 && off.error == ML_REQERR_UNKNOWN_ADAPTER,
          "no adapter slots: unknown_adapter (%s)", off.message);
    result empty_name = {0};
    submit(f, rt, REQ_TEXT_ONLY, "", 2, 0, &empty_name);
    drain(rt);
    check(empty_name.done == 1 && empty_name.reason == ML_FINISH_REASON_LENGTH,
          "an empty adapter name is the base model");
    ml_runtime_destroy(rt);
}

int main(void)
{
    fixture f;
    load_fixture(&f);
    test_golden(&f);
    test_mixed_batch(&f);
    test_lru(&f);
    test_image_states(&f);
    test_unknown(&f);
    free(f.pixels);
    ml_tokenizer_destroy(f.tok);
    ml_model_destroy(f.model);
    f.be->ops->destroy(f.be);
    return check_done();
}
