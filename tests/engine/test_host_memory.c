/* The memory the process may hold (engine/host_memory.h) and the CPU
 * engine's check of its memory plan against it (engine.c): the cgroup
 * limit's parser on every form the kernel writes and on malformed text,
 * the host's figure on this machine, and ml_engine_open on a fixture model
 * refusing, before it makes any pool, a K/V budget above that memory,
 * then opening with a small one. */
#include <stdint.h>
#include <string.h>

#include "engine.h"
#include "harness.h"
#include "host_memory.h"
#include "model/memory_plan.h"

#define MODEL ML_SOURCE_DIR "/tests/golden/fixtures/models/m1_instruct_1tile_mqa"
#define TOKENIZER ML_SOURCE_DIR "/config/tokenizer/tokenizer.json"
/* A K/V budget no host holds (256 TiB). */
#define HUGE_KV_BYTES ((size_t)1 << 48)
/* The budget of the open that fits: a few blocks of the fixture's. */
#define SMALL_KV_BYTES ((size_t)ML_PLAN_MIB)

static void test_parse(void)
{
    static const struct {
        const char *text;
        int ok;
        uint64_t bytes;
    } cases[] = {
        {"8589934592\n", 1, 8589934592ull},           /* v2: 8 GiB */
        {"9223372036854771712\n", 1, 9223372036854771712ull}, /* v1: no limit */
        {"max\n", 0, 0},                               /* v2: no limit */
        {"0", 1, 0},
        {"18446744073709551615", 1, UINT64_MAX},
        {"18446744073709551616", 0, 0}, /* past 64 bits */
        {"", 0, 0},
        {"\n", 0, 0},
        {"12\n\n", 0, 0},
        {" 12", 0, 0},
        {"-1", 0, 0},
        {"12k", 0, 0},
        {"1 2", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t bytes = 7;
        const int ok = ml_host_memory_parse_limit(cases[i].text, strlen(cases[i].text), &bytes);
        check(ok == cases[i].ok && (!ok || bytes == cases[i].bytes),
              "parse_limit(\"%s\") = %d, %llu", cases[i].text, ok, (unsigned long long)bytes);
        check(ok || bytes == 7, "parse_limit(\"%s\") left *bytes alone", cases[i].text);
    }
}

static void test_host(void)
{
    ml_host_memory_source src;
    const uint64_t bytes = ml_host_memory(&src);
    fprintf(stderr, "  this host: %.2f GiB (%s)\n", ml_plan_gib(bytes),
            ml_host_memory_source_name(src));
    check(bytes > 0 && src != ML_HOST_MEMORY_UNKNOWN, "a Linux host's memory is known");
    check(ml_host_memory(NULL) == bytes, "the source is optional");
}

static ml_status open_with(size_t kv_bytes, ml_engine **e, char *err, size_t errlen)
{
    ml_engine_config cfg = {.model_dir = MODEL, .backend = "cpu", .world = 1, .threads = 1,
                            .limits = ml_model_limits_default(),
                            .fallback_tokenizer = TOKENIZER,
                            .runtime = {.kv_bytes = kv_bytes}};
    cfg.runtime.max_running = cfg.limits.max_step_seqs;
    cfg.runtime.max_step_tokens = cfg.limits.max_step_tokens;
    return ml_engine_open(e, &cfg, err, errlen);
}

static void test_open(void)
{
    const uint64_t host = ml_host_memory(NULL);
    check(host < HUGE_KV_BYTES, "this host holds less than 256 TiB");
    char err[512] = "";
    ml_engine *e = NULL;
    /* Past x86-64's 128 TiB of user addresses as well as the host's memory:
     * without the check the pool's mapping fails at once, where a pool
     * the addresses could hold would be faulted in until the OOM killer
     * ended the test (and the machine's other processes might go first). */
    const ml_status st = open_with(HUGE_KV_BYTES, &e, err, sizeof err);
    check(st == ML_ERR_NOMEM && e == NULL, "a K/V pool of 256 TiB: %d", st);
    check(strstr(err, "memory plan") && strstr(err, "runtime.kv_mib"),
          "the error gives the plan and what to lower: %s", err);

    const ml_status small = open_with(SMALL_KV_BYTES, &e, err, sizeof err);
    check(small == ML_OK, "a small pool opens: %s", err);
    if (small != ML_OK)
        return;
    const ml_memory_plan_spec *spec;
    const ml_memory_plan *plan = ml_engine_memory_plan(e, &spec);
    check(plan->fits && spec->device_bytes == host, "its plan fits the host's memory");
    ml_engine_close(e);
}

int main(void)
{
    test_parse();
    test_host();
    test_open();
    return check_done();
}
