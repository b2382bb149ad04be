/* LoRA in the runtime (engine/runtime/adapters.*, scheduler.c) on the LoRA
 * golden fixture (m3's configuration, two images) and the real tokenizer:
 * - one request per adapter (and the base model) reproduces PEFT +
 *   transformers' 16 greedy tokens end to end (with Meta's row mask patched
 *   in: the default reference mode);
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

#include "harness.h"
#include "runtime_test_util.h"

#define FIXTURE ML_RT_LORA_FIXTURE
#define A1 "a1_all_r8"
#define A2 "a2_text_rslora_r4"
#define GREEDY_STEPS 16
#define MAX_LORA_RANK 8
#define KV_BLOCKS 64

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

/* The fixture's model, prompt and images, with slots up to MAX_LORA_RANK. */
static void load_fixture(ml_rt_fixture *f)
{
    ml_model_limits lim = ml_rt_limits();
    lim.max_lora_rank = MAX_LORA_RANK;
    ml_rt_fixture_open_lora(f, &lim);
}

/* The reference greedy tokens of a fixture case (base, A1, A2). */
static void reference_tokens(const char *ref, int32_t *out)
{
    char path[512];
    ml_rt_lora_expected_path(path, sizeof path, ref, ml_rt_limits().row_mask);
    ml_safetensors *st = ml_rt_safetensors_open(path);
    size_t n;
    int64_t *v = ml_rt_read_i64(st, "greedy_tokens", &n);
    if (n < GREEDY_STEPS) {
        fprintf(stderr, "%s: %zu greedy tokens, want %d\n", path, n, GREEDY_STEPS);
        exit(1);
    }
    for (size_t i = 0; i < GREEDY_STEPS; i++)
        out[i] = (int32_t)v[i];
    free(v);
    ml_safetensors_destroy(st);
}

static ml_runtime *runtime(ml_rt_fixture *f, int slots, int image_slots, int max_running)
{
    ml_runtime_config rc = ml_rt_config(f, KV_BLOCKS, image_slots);
    rc.max_running = max_running;
    rc.max_adapters = slots;
    rc.resolve_adapter = resolve;
    return ml_rt_runtime_create(f, &rc);
}

/* Submit a greedy request of kind k with adapter (NULL: base); resident != 0
 * names the images by key only. */
static void submit(ml_rt_fixture *f, ml_runtime *rt, ml_rt_kind k, const char *adapter,
                   int max_tokens, int resident, ml_rt_result *r)
{
    ml_rt_request q = {
        .kind = k, .max_tokens = max_tokens, .resident = resident, .adapter = adapter,
    };
    ml_rt_submit(f, rt, &q, r);
}

/* ---- cases ------------------------------------------------------------- */

static void test_golden(ml_rt_fixture *f)
{
    static const struct {
        const char *adapter, *ref;
    } cases[] = {{NULL, "base"}, {A1, A1}, {A2, A2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t want[GREEDY_STEPS];
        reference_tokens(cases[i].ref, want);
        ml_runtime *rt = runtime(f, 1, 2, 8);
        ml_rt_result r = {0};
        submit(f, rt, ML_RT_TWO_IMAGES, cases[i].adapter, GREEDY_STEPS, 0, &r);
        ml_rt_drain(rt, 0);
        check(r.done == 1 && r.reason == ML_FINISH_REASON_LENGTH && r.n_out == GREEDY_STEPS &&
                  !memcmp(r.out, want, sizeof want),
              "%s: runtime greedy tokens equal PEFT generate() (%d tokens, %s)", cases[i].ref,
              r.n_out, r.message);
        ml_runtime_destroy(rt);
    }
}

/* Each request alone, then all together joining every few steps. */
static void run_mixed(ml_rt_fixture *f, const ml_rt_kind *kinds, const char *const *adapters,
                      const int *max_tokens, int n, int slots, int max_running, const char *what)
{
    ml_rt_result alone[16], together[16];
    memset(alone, 0, sizeof alone);
    memset(together, 0, sizeof together);
    for (int i = 0; i < n; i++) {
        ml_runtime *rt = runtime(f, 1, 2, 8);
        submit(f, rt, kinds[i], adapters[i], max_tokens[i], 0, &alone[i]);
        ml_rt_drain(rt, 0);
        ml_runtime_destroy(rt);
    }
    /* Images of three adapter identities (base, a1, a1_copy) in flight: room
     * for all of them, so only slots limit admission. */
    ml_runtime *rt = runtime(f, slots, 6, max_running);
    for (int i = 0; i < n; i++) {
        submit(f, rt, kinds[i], adapters[i], max_tokens[i], 0, &together[i]);
        ml_rt_steps(rt, 2);
    }
    ml_rt_drain(rt, 0);
    ml_runtime_stats st;
    ml_runtime_get_stats(rt, &st);
    fprintf(stderr, "  %s: %llu steps, %llu adapter loads, %llu evictions\n", what,
            (unsigned long long)st.steps, (unsigned long long)st.adapters.loads,
            (unsigned long long)st.adapters.evictions);
    for (int i = 0; i < n; i++)
        check(ml_rt_same_output(&together[i], &alone[i]),
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

static void test_mixed_batch(ml_rt_fixture *f)
{
    static const ml_rt_kind kinds[] = {ML_RT_TWO_IMAGES, ML_RT_TWO_IMAGES, ML_RT_TEXT_ONLY,
                                     ML_RT_TWO_IMAGES, ML_RT_ONE_IMAGE, ML_RT_TWO_IMAGES,
                                     ML_RT_TEXT_ONLY};
    static const char *const adapters[] = {A1, NULL, A2, A2, A1, A1, NULL};
    static const int max_tokens[] = {14, 10, 12, 16, 8, 6, 9};
    run_mixed(f, kinds, adapters, max_tokens, 7, 2, 8, "mixed batch, 2 slots for 2 adapters");
}

static void test_lru(ml_rt_fixture *f)
{
    /* Three adapter names (a1_copy is a1's files under another name) for
     * two slots: the third waits until a slot is idle, then replaces the
     * least recently used. */
    static const ml_rt_kind kinds[] = {ML_RT_TWO_IMAGES, ML_RT_TEXT_ONLY, ML_RT_TWO_IMAGES,
                                     ML_RT_ONE_IMAGE,  ML_RT_TEXT_ONLY, ML_RT_TWO_IMAGES};
    static const char *const adapters[] = {A1, A2, "a1_copy", A2, A1, "a1_copy"};
    static const int max_tokens[] = {6, 12, 8, 5, 7, 6};
    run_mixed(f, kinds, adapters, max_tokens, 6, 2, 8, "3 adapters, 2 slots");
    run_mixed(f, kinds, adapters, max_tokens, 6, 1, 2, "3 adapters, 1 slot, 2 running");
}

static void test_image_states(ml_rt_fixture *f)
{
    ml_runtime *rt = runtime(f, 2, 6, 8);
    ml_image_cache *cache = ml_runtime_image_cache(rt);
    ml_rt_result base = {0}, text_adapter = {0}, vision_adapter = {0}, again = {0}, missing = {0};

    /* A resident image named for an adapter that changes images, before any
     * state for it exists: refused at admission. */
    submit(f, rt, ML_RT_ONE_IMAGE, A1, 2, 1, &missing);
    ml_rt_drain(rt, 0);
    check(missing.done == 1 && missing.error == ML_REQERR_INVALID_IMAGE,
          "no state for (image, a1) yet: invalid image (%s)", missing.message);

    submit(f, rt, ML_RT_TWO_IMAGES, NULL, 2, 0, &base);
    ml_rt_drain(rt, 0);
    check(ml_image_cache_count(cache) == 2, "base: two states");
    submit(f, rt, ML_RT_TWO_IMAGES, A2, 2, 0, &text_adapter);
    ml_rt_drain(rt, 0);
    check(ml_image_cache_count(cache) == 2 && text_adapter.usage.images_cached == 2,
          "a2 leaves images alone: it reuses the base states");
    submit(f, rt, ML_RT_TWO_IMAGES, A1, 2, 0, &vision_adapter);
    ml_rt_drain(rt, 0);
    check(ml_image_cache_count(cache) == 4 && vision_adapter.usage.images_cached == 0,
          "a1 changes images: two states of its own");
    submit(f, rt, ML_RT_TWO_IMAGES, A1, 2, 1, &again);
    ml_rt_drain(rt, 0);
    check(again.done == 1 && again.reason == ML_FINISH_REASON_LENGTH &&
              again.usage.images_cached == 2 && ml_rt_same_output(&again, &vision_adapter),
          "a1 by resident keys: its own states, same output (%s)", again.message);
    ml_runtime_destroy(rt);
}

/* Image states are partitioned by cache salt, and a state an adapter made
 * can never be named by a digest (README.md issue 23 items 2 and 9). */
static void test_image_partitions(ml_rt_fixture *f)
{
    enum { SALT_A = 1, SALT_B = 2 };
    ml_runtime *rt = runtime(f, 2, 6, 8);
    ml_image_cache *cache = ml_runtime_image_cache(rt);
    ml_rt_result base = {0}, adapted = {0}, forged = {0}, other = {0}, other_pixels = {0},
                 other_adapter = {0}, same = {0};
    ml_rt_submit(f, rt, &(ml_rt_request){.kind = ML_RT_TWO_IMAGES, .max_tokens = 2,
                                         .cache_salt = SALT_A},
                 &base);
    ml_rt_submit(f, rt, &(ml_rt_request){.kind = ML_RT_TWO_IMAGES, .max_tokens = 2,
                                         .adapter = A1, .cache_salt = SALT_A},
                 &adapted);
    ml_rt_drain(rt, 0);
    check(ml_image_cache_count(cache) == 4, "salt A: base and a1 states (%d)",
          ml_image_cache_count(cache));

    /* A base request naming a1's states by their keys, as a client that can
     * compute them would: its digests are taken as content, so nothing. */
    uint8_t keys[ML_RT_IMAGES][ML_IMAGE_KEY_BYTES] = {{1}, {2}};
    uint8_t salt[ML_CACHE_SALT_BYTES] = {SALT_A};
    for (int i = 0; i < 2; i++)
        ml_image_state_key(salt, keys[i], A1, keys[i]);
    ml_rt_submit(f, rt, &(ml_rt_request){.kind = ML_RT_TWO_IMAGES, .max_tokens = 2,
                                         .resident = 1, .keys = keys, .cache_salt = SALT_A},
                 &forged);
    check(forged.done == 1 && forged.error == ML_REQERR_INVALID_IMAGE,
          "an adapter's state named by its key from a base request: invalid image (%s)",
          forged.message);

    /* Salt B sees none of salt A's states, by name or by content. */
    ml_rt_submit(f, rt, &(ml_rt_request){.kind = ML_RT_TWO_IMAGES, .max_tokens = 2,
                                         .resident = 1, .cache_salt = SALT_B},
                 &other);
    check(other.done == 1 && other.error == ML_REQERR_INVALID_IMAGE,
          "salt B names salt A's image: invalid image (%s)", other.message);
    ml_rt_submit(f, rt, &(ml_rt_request){.kind = ML_RT_TWO_IMAGES, .max_tokens = 2,
                                         .resident = 1, .adapter = A1, .cache_salt = SALT_B},
                 &other_adapter);
    ml_rt_submit(f, rt, &(ml_rt_request){.kind = ML_RT_TWO_IMAGES, .max_tokens = 2,
                                         .cache_salt = SALT_B},
                 &other_pixels);
    ml_rt_drain(rt, 0);
    check(other_adapter.done == 1 && other_adapter.error == ML_REQERR_INVALID_IMAGE,
          "salt B names salt A's a1 image: invalid image (%s)", other_adapter.message);
    check(other_pixels.done == 1 && other_pixels.usage.images_cached == 0 &&
              ml_rt_same_output(&other_pixels, &base) && ml_image_cache_count(cache) == 6,
          "salt B with pixels: states of its own (%d cached), same output",
          other_pixels.usage.images_cached);

    /* An equal salt shares. */
    ml_rt_submit(f, rt, &(ml_rt_request){.kind = ML_RT_TWO_IMAGES, .max_tokens = 2,
                                         .resident = 1, .cache_salt = SALT_A},
                 &same);
    ml_rt_drain(rt, 0);
    check(same.done == 1 && same.usage.images_cached == 2 && ml_rt_same_output(&same, &base),
          "salt A again by key: its states (%s)", same.message);
    ml_runtime_destroy(rt);
}

static void test_unknown(ml_rt_fixture *f)
{
    ml_runtime *rt = runtime(f, 1, 2, 8);
    ml_rt_result unknown = {0}, broken = {0}, fine = {0};
    submit(f, rt, ML_RT_TEXT_ONLY, "no_such_adapter", 4, 0, &unknown);
    check(unknown.done == 1 && unknown.reason == ML_FINISH_REASON_ERROR &&
              unknown.error == ML_REQERR_UNKNOWN_ADAPTER && strstr(unknown.message, "unknown"),
          "unknown adapter refused at submit (%s)", unknown.message);
    /* Known name, files that are no adapter: refused at admission; the
     * request beside it runs. */
    submit(f, rt, ML_RT_TEXT_ONLY, "broken", 4, 0, &broken);
    submit(f, rt, ML_RT_TEXT_ONLY, A2, 4, 0, &fine);
    ml_rt_drain(rt, 0);
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
    ml_rt_result off = {0};
    submit(f, rt, ML_RT_TEXT_ONLY, A1, 4, 0, &off);
    check(off.done == 1 && off.error == ML_REQERR_UNKNOWN_ADAPTER,
          "no adapter slots: unknown_adapter (%s)", off.message);
    ml_rt_result empty_name = {0};
    submit(f, rt, ML_RT_TEXT_ONLY, "", 2, 0, &empty_name);
    ml_rt_drain(rt, 0);
    check(empty_name.done == 1 && empty_name.reason == ML_FINISH_REASON_LENGTH,
          "an empty adapter name is the base model");
    ml_runtime_destroy(rt);
}

/* Batch invariance: a seeded sampled request gets bit-identical tokens and
 * logprobs alone, joined mid-stream by other requests' prefill chunks (text
 * only, with images, with either adapter), and joining theirs: its decode
 * rows go into GEMMs, LoRA segments and eager steps where alone they ran
 * the GEMV regime and decode-graph replays, its prompt into mixed steps;
 * and alone with its prompt prefilled in small chunks (what a prefix cache
 * relies on: a row's K/V does not depend on how its prompt was cut). Temperature 1 over 64 tokens: a
 * logit moved by one rounding changes a draw sooner or later. */
static void test_sampled_joined(ml_rt_fixture *f)
{
    enum { JOINERS = 5, JOIN_EVERY = 3, CHUNK = 5 };
    static const ml_rt_kind kinds[JOINERS] = {ML_RT_TEXT_ONLY, ML_RT_TWO_IMAGES, ML_RT_ONE_IMAGE,
                                              ML_RT_TEXT_ONLY, ML_RT_TWO_IMAGES};
    static const char *const adapters[JOINERS] = {NULL, A1, NULL, A2, A2};
    static const ml_rt_kind subjects[] = {ML_RT_TEXT_ONLY, ML_RT_ONE_IMAGE};
    static const char *const subject_adapters[] = {NULL, A1};
    ml_sampling_params p;
    ml_sampling_params_default(&p);
    p.seed = 77;
    p.temperature = 1.0f;
    p.logprobs = true;
    p.top_logprobs = 3;
    for (size_t s = 0; s < sizeof subjects / sizeof subjects[0]; s++) {
        ml_rt_request q = {.kind = subjects[s], .max_tokens = ML_RT_MAX_OUT,
                           .adapter = subject_adapters[s], .sampling = &p};
        ml_rt_result alone = {0}, joined = {0}, others[JOINERS];
        memset(others, 0, sizeof others);
        ml_runtime *rt = runtime(f, 2, 6, 8);
        ml_rt_submit(f, rt, &q, &alone);
        ml_rt_drain(rt, 0);
        ml_runtime_destroy(rt);

        /* late = 0: the others join the subject's decode; late = 1: the
         * subject's own prefill joins theirs; late = 2: alone again, its
         * prompt prefilled CHUNK tokens a step. */
        for (int late = 0; late < 3; late++) {
            ml_runtime_config rc = ml_rt_config(f, KV_BLOCKS, 6);
            rc.max_adapters = 2;
            rc.resolve_adapter = resolve;
            if (late == 2) {
                rc.max_step_tokens = CHUNK;
                rc.max_running = 1;
            }
            rt = ml_rt_runtime_create(f, &rc);
            if (late != 1)
                ml_rt_submit(f, rt, &q, &joined);
            for (int i = 0; i < JOINERS && late < 2; i++) {
                ml_rt_steps(rt, late ? 1 : JOIN_EVERY);
                submit(f, rt, kinds[i], adapters[i], 8, 0, &others[i]);
            }
            if (late == 1)
                ml_rt_submit(f, rt, &q, &joined);
            ml_rt_drain(rt, 0);
            ml_runtime_destroy(rt);
            check(alone.n_out == ML_RT_MAX_OUT && ml_rt_same_output(&alone, &joined),
                  "subject %zu, late %d: the same %d sampled tokens alone and joined (%d)", s,
                  late, alone.n_out, joined.n_out);
            check(!memcmp(alone.lp, joined.lp, (size_t)alone.n_out * sizeof alone.lp[0]),
                  "subject %zu, late %d: the same logprobs alone and joined", s, late);
            for (int i = 0; i < JOINERS && late < 2; i++) {
                check(others[i].done == 1 && others[i].n_out == 8,
                      "subject %zu, late %d: joiner %d ran", s, late, i);
                ml_rt_result_deinit(&others[i]);
            }
            ml_rt_result_deinit(&joined);
            memset(&joined, 0, sizeof joined);
            memset(others, 0, sizeof others);
        }
        ml_rt_result_deinit(&alone);
    }
}

int main(void)
{
    ml_rt_fixture f;
    load_fixture(&f);
#ifdef ML_TEST_CUDA
    /* On a batch-invariant CUDA backend: the invariance case only (the
     * golden and slot cases are the CPU build's). */
    test_sampled_joined(&f);
    ml_rt_fixture_close(&f);
    return check_done();
#endif
    test_golden(&f);
    test_mixed_batch(&f);
    test_lru(&f);
    test_image_states(&f);
    test_image_partitions(&f);
    test_unknown(&f);
    test_sampled_joined(&f);
    ml_rt_fixture_close(&f);
    return check_done();
}
