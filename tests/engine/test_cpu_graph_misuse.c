/* Misuse of the CPU backend's graph ops (backend.h graph_begin, graph_end,
 * graph_replay): every misuse latches the error backend.h documents and
 * synchronize reports it once; a recording that latched one is discarded. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "cpu_graph_util.h"
#include "dtype.h"
#include "harness.h"
#include "test_rand.h"

/* ---- misuse ------------------------------------------------------------------------- */

#define BAD_SLOT 3
#define BUF_FLOATS 16

typedef enum forbidden_call {
    CALL_ALLOC,
    CALL_FREE,
    CALL_WEIGHT,
    CALL_UPLOAD,
    CALL_DOWNLOAD,
    CALL_SYNCHRONIZE,
    CALL_GRAPH_BEGIN,
    CALL_GRAPH_REPLAY,
    N_FORBIDDEN,
} forbidden_call;

static const char *const FORBIDDEN_NAMES[N_FORBIDDEN] = {
    "alloc", "free", "weight", "upload", "download", "synchronize", "graph_begin",
    "graph_replay"};

/* Fill buf with v through the backend, then check that it holds v. */
static void set_buf(ml_backend *be, float *buf, float v)
{
    float h[BUF_FLOATS];
    for (int i = 0; i < BUF_FLOATS; i++)
        h[i] = v;
    be->ops->upload(be, buf, h, sizeof h);
}

static int buf_is(ml_backend *be, const float *buf, float v)
{
    float h[BUF_FLOATS];
    be->ops->download(be, h, buf, sizeof h);
    for (int i = 0; i < BUF_FLOATS; i++)
        if (h[i] != v)
            return 0;
    return 1;
}

/* Slot `slot` holds a graph that zeroes buf. */
static void record_zero(ml_backend *be, int slot, float *buf)
{
    be->ops->graph_begin(be, slot);
    be->ops->zero(be, buf, BUF_FLOATS);
    be->ops->graph_end(be, slot);
}

static void test_forbidden_while_recording(ml_backend *be)
{
    const ml_backend_ops *eager = be->ops;
    float *buf = be->ops->alloc(be, BUF_FLOATS * sizeof(float));
    const uint16_t weight_host[BUF_FLOATS] = {0};
    if (!buf) {
        check(0, "alloc");
        return;
    }
    for (int c = 0; c < N_FORBIDDEN; c++) {
        const char *name = FORBIDDEN_NAMES[c];
        record_zero(be, 0, buf);
        record_zero(be, BAD_SLOT, buf); /* the failed recording must empty it */
        set_buf(be, buf, 1.0f);
        char err[ERRLEN];
        float host[BUF_FLOATS];
        for (int i = 0; i < BUF_FLOATS; i++)
            host[i] = 2.0f;

        be->ops->graph_begin(be, BAD_SLOT);
        check(be->ops != eager && strcmp(be->ops->name, eager->name) == 0,
              "%s: recording table in place, named %s", name, be->ops->name);
        switch ((forbidden_call)c) {
        case CALL_ALLOC:
            check(be->ops->alloc(be, 64) == NULL, "alloc while recording returns NULL");
            break;
        case CALL_FREE:
            be->ops->free(be, buf); /* must not free: buf is used below (ASan) */
            break;
        case CALL_WEIGHT:
            check(be->ops->weight(be, weight_host, sizeof weight_host) == NULL,
                  "weight while recording returns NULL");
            break;
        case CALL_UPLOAD:
            be->ops->upload(be, buf, host, sizeof host);
            break;
        case CALL_DOWNLOAD:
            be->ops->download(be, host, buf, sizeof host);
            break;
        case CALL_SYNCHRONIZE: {
            /* Reported at once, by the forbidden call itself. */
            ml_status st = sync_err(be, err);
            check(st == ML_ERR_INVALID_ARG &&
                      strstr(err, "synchronize: not allowed while recording graph slot 3"),
                  "synchronize while recording: %s \"%s\"", ml_status_name(st), err);
            break;
        }
        case CALL_GRAPH_BEGIN:
            be->ops->graph_begin(be, 5);
            check(be->ops != eager, "a nested graph_begin leaves the recording on");
            break;
        case CALL_GRAPH_REPLAY:
            be->ops->graph_replay(be, 0);
            break;
        case N_FORBIDDEN:
            break;
        }
        be->ops->zero(be, buf, BUF_FLOATS); /* recorded: a discarded graph must not keep it */
        be->ops->graph_end(be, BAD_SLOT);
        check(be->ops == eager, "%s: graph_end restores the op table", name);

        char want[ERRLEN];
        snprintf(want, sizeof want, "%s: not allowed while recording graph slot %d", name,
                 BAD_SLOT);
        if (c == CALL_SYNCHRONIZE)
            check_clean(be, "after synchronize while recording");
        else
            check_latched(be, ML_ERR_INVALID_ARG, want);

        /* It did nothing else. */
        check(buf_is(be, buf, 1.0f), "%s: backend memory unchanged", name);
        int host_same = 1;
        for (int i = 0; i < BUF_FLOATS; i++)
            host_same &= host[i] == 2.0f;
        check(host_same, "%s: host memory unchanged", name);

        /* The recording during which the error was latched emptied its slot. */
        be->ops->graph_replay(be, BAD_SLOT);
        check_latched(be, ML_ERR_INVALID_ARG, "graph_replay: slot 3 holds no graph");
        check(buf_is(be, buf, 1.0f), "%s: nothing replayed", name);
        /* Nested graph_begin(5) recorded nothing into slot 5. */
        be->ops->graph_replay(be, 5);
        check_latched(be, ML_ERR_INVALID_ARG, "graph_replay: slot 5 holds no graph");
    }
    be->ops->free(be, buf);
}

static void test_misuse(void)
{
    char err[ERRLEN];
    ml_backend *be = ml_backend_cpu_create(1, err, sizeof err);
    if (!be) {
        check(0, "cpu backend: %s", err);
        return;
    }
    const ml_backend_ops *eager = be->ops;
    check_clean(be, "fresh backend");

    test_forbidden_while_recording(be);

    /* Slots outside the range. */
    const int bad[] = {-1, ML_GRAPH_SLOTS};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char want[ERRLEN];
        be->ops->graph_begin(be, bad[i]);
        check(be->ops == eager, "graph_begin(%d) does not record", bad[i]);
        snprintf(want, sizeof want, "graph_begin: slot %d outside [0, %d)", bad[i],
                 ML_GRAPH_SLOTS);
        check_latched(be, ML_ERR_INVALID_ARG, want);
        be->ops->graph_replay(be, bad[i]);
        snprintf(want, sizeof want, "graph_replay: slot %d outside [0, %d)", bad[i],
                 ML_GRAPH_SLOTS);
        check_latched(be, ML_ERR_INVALID_ARG, want);
        be->ops->graph_end(be, bad[i]);
        snprintf(want, sizeof want, "graph_end: slot %d is not being recorded", bad[i]);
        check_latched(be, ML_ERR_INVALID_ARG, want);
    }

    /* A slot never recorded; graph_end without graph_begin. */
    be->ops->graph_replay(be, 7);
    check_latched(be, ML_ERR_INVALID_ARG, "cpu graph_replay: slot 7 holds no graph");
    be->ops->graph_end(be, 2);
    check_latched(be, ML_ERR_INVALID_ARG, "graph_end: slot 2 is not being recorded");

    /* graph_end of another slot: refused, the recording goes on, and is
     * discarded at its own graph_end (an error was latched in it). */
    float *buf = be->ops->alloc(be, BUF_FLOATS * sizeof(float));
    if (!buf) {
        check(0, "alloc");
        be->ops->destroy(be);
        return;
    }
    record_zero(be, 4, buf);
    be->ops->graph_begin(be, 4);
    be->ops->zero(be, buf, BUF_FLOATS);
    be->ops->graph_end(be, 6);
    check(be->ops != eager, "graph_end of another slot leaves the recording on");
    be->ops->graph_end(be, 4);
    check(be->ops == eager, "graph_end of the slot ends it");
    check_latched(be, ML_ERR_INVALID_ARG, "graph_end: slot 6 is not being recorded");
    be->ops->graph_replay(be, 4);
    check_latched(be, ML_ERR_INVALID_ARG, "graph_replay: slot 4 holds no graph");

    /* The first error wins. */
    be->ops->graph_replay(be, 9);
    be->ops->graph_begin(be, -5);
    be->ops->graph_end(be, 1);
    check_latched(be, ML_ERR_INVALID_ARG, "graph_replay: slot 9 holds no graph");

    /* The eager table still works after all that, and a fresh recording too. */
    set_buf(be, buf, 3.0f);
    record_zero(be, 4, buf);
    check(buf_is(be, buf, 3.0f), "recording did not run zero");
    be->ops->graph_replay(be, 4);
    check(buf_is(be, buf, 0.0f), "replay ran zero");
    check_clean(be, "after the misuses");

    /* Destroyed in the middle of a recording: nothing leaks (ASan). */
    be->ops->graph_begin(be, 8);
    be->ops->zero(be, buf, BUF_FLOATS);
    be->ops->free(be, buf); /* refused: freed by hand below */
    be->ops->graph_end(be, 8);
    check_latched(be, ML_ERR_INVALID_ARG, "free: not allowed while recording graph slot 8");
    be->ops->free(be, buf);
    const ml_lora_segment seg = {.row_start = 0, .n_rows = 1, .rank = 1, .scale = 1.0f};
    be->ops->graph_begin(be, 8);
    be->ops->zero(be, NULL, 0);
    be->ops->lora(be, NULL, NULL, &seg, 1, 1, 1, NULL, 1); /* recorded, never run */
    be->ops->destroy(be);
}


int main(void)
{
    test_misuse();
    return check_done();
}
