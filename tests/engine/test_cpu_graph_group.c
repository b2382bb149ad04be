/* The CPU backend's graph ops in a two-member tensor-parallel group: each
 * member records all_reduce_sum without running it, and the replay from two
 * threads equals the eager step. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "cpu_graph_util.h"
#include "dtype.h"
#include "harness.h"
#include "test_rand.h"

/* ---- a tensor-parallel group ------------------------------------------------------ */

#define TP_WORLD 2
#define TP_ROWS 2
#define TP_K 32
#define TP_N 24
#define TP_ARENA_BYTES ((size_t)64 << 10)
#define TP_SLOT 11

typedef struct tp_bufs {
    arena a;
    float *x;          /* (TP_ROWS, TP_K) */
    uint16_t *w1;      /* (TP_N, TP_K) packed: this rank's shard */
    uint16_t *w2;      /* (TP_N, TP_N) packed */
    uint16_t *norm_w;  /* (TP_N) */
    float *y, *z, *y2; /* (TP_ROWS, TP_N) */
    float *logits;     /* (TP_ROWS, TP_N) */
    ml_sample_row *sample_rows; /* (TP_ROWS) greedy */
    ml_sample_out *sampled;     /* (TP_ROWS) */
    void *sample_scratch;
} tp_bufs;

static void tp_bufs_init(tp_bufs *b, ml_backend *be)
{
    b->a = arena_open(be, TP_ARENA_BYTES);
    arena *a = &b->a;
    b->x = carve(a, TP_ROWS * TP_K * sizeof(float));
    b->w1 = carve(a, LINEAR_ELEMS(TP_N, TP_K) * sizeof(uint16_t));
    b->w2 = carve(a, LINEAR_ELEMS(TP_N, TP_N) * sizeof(uint16_t));
    b->norm_w = carve(a, TP_N * sizeof(uint16_t));
    b->y = carve(a, TP_ROWS * TP_N * sizeof(float));
    b->z = carve(a, TP_ROWS * TP_N * sizeof(float));
    b->y2 = carve(a, TP_ROWS * TP_N * sizeof(float));
    b->logits = carve(a, TP_ROWS * TP_N * sizeof(float));
    b->sample_rows = carve(a, TP_ROWS * sizeof *b->sample_rows);
    b->sampled = carve(a, TP_ROWS * sizeof *b->sampled);
    b->sample_scratch = carve(a, be->ops->sample_scratch_bytes(be, TP_ROWS, TP_N));
}

static void tp_image(const tp_bufs *b, unsigned char *img, uint64_t seed, int rank)
{
    const arena *a = &b->a;
    rand_seed(0x2545f4914f6cdd1dull * seed + (uint64_t)rank + 7);
    memset(img, 0, a->bytes);
    fill(host_of(a, img, b->x), TP_ROWS * TP_K, -1, 1);
    fill_bf16(host_of(a, img, b->w1), LINEAR_ELEMS(TP_N, TP_K), -W_MAX, W_MAX);
    fill_bf16(host_of(a, img, b->w2), LINEAR_ELEMS(TP_N, TP_N), -W_MAX, W_MAX);
    fill_bf16(host_of(a, img, b->norm_w), TP_N, -W_MAX, W_MAX);
    ml_sample_row *rows = host_of(a, img, b->sample_rows);
    for (int r = 0; r < TP_ROWS; r++)
        rows[r] = (ml_sample_row){.temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
}

/* A sharded block: two row-parallel matmuls, each followed by its sum over
 * the group. */
static void tp_step(ml_backend *be, const tp_bufs *b)
{
    const ml_backend_ops *o = be->ops;
    o->matmul(be, b->y, b->x, b->w1, NULL, TP_ROWS, TP_K, TP_N, 0);
    o->all_reduce_sum(be, b->y, TP_ROWS * TP_N);
    o->rmsnorm(be, b->z, b->y, b->norm_w, TP_ROWS, TP_N, EPS);
    o->matmul(be, b->y2, b->z, b->w2, NULL, TP_ROWS, TP_N, TP_N, 0);
    o->all_reduce_sum(be, b->y2, TP_ROWS * TP_N);
    o->matmul(be, b->logits, b->y2, b->w2, NULL, TP_ROWS, TP_N, TP_N, 0);
    ml_sample_params sample = {.out = b->sampled, .logits = b->logits, .row = b->sample_rows,
                               .scratch = b->sample_scratch, .rows = TP_ROWS, .vocab = TP_N};
    o->sample(be, &sample);
}

typedef struct tp_member {
    ml_backend *be;
    const tp_bufs *b;
    const unsigned char *in;
    unsigned char *out;
    int replay;
} tp_member;

static void *tp_thread(void *arg)
{
    tp_member *m = arg;
    m->be->ops->upload(m->be, m->b->a.base, m->in, m->b->a.bytes);
    if (m->replay)
        m->be->ops->graph_replay(m->be, TP_SLOT);
    else
        tp_step(m->be, m->b);
    m->be->ops->download(m->be, m->out, m->b->a.base, m->b->a.bytes);
    return NULL;
}

/* Each member driven by its own thread, as the collective wants. */
static void tp_run(tp_member *m)
{
    pthread_t th[TP_WORLD];
    int started[TP_WORLD] = {0};
    for (int r = 0; r < TP_WORLD; r++)
        started[r] = pthread_create(&th[r], NULL, tp_thread, &m[r]) == 0;
    for (int r = 0; r < TP_WORLD; r++) {
        check(started[r], "thread %d started", r);
        if (started[r])
            pthread_join(th[r], NULL);
    }
}

static void test_group(void)
{
    char err[ERRLEN];
    ml_backend *be[TP_WORLD];
    if (ml_backend_cpu_create_group(TP_WORLD, 1, be, err, sizeof err) != ML_OK) {
        check(0, "cpu group: %s", err);
        return;
    }
    tp_bufs b[TP_WORLD];
    unsigned char *in[TP_WORLD], *rec[TP_WORLD], *got[TP_WORLD], *want[TP_WORLD];
    for (int r = 0; r < TP_WORLD; r++) {
        tp_bufs_init(&b[r], be[r]);
        in[r] = xmalloc(TP_ARENA_BYTES);
        rec[r] = xmalloc(TP_ARENA_BYTES);
        got[r] = xmalloc(TP_ARENA_BYTES);
        want[r] = xmalloc(TP_ARENA_BYTES);
        tp_image(&b[r], rec[r], SEED_RECORD, r);
        tp_image(&b[r], in[r], SEED_REPLAY, r);
    }
    /* Recorded one member after the other on this thread: a collective
     * that ran while recording would wait forever for the other member. */
    for (int r = 0; r < TP_WORLD; r++) {
        be[r]->ops->upload(be[r], b[r].a.base, rec[r], TP_ARENA_BYTES);
        be[r]->ops->graph_begin(be[r], TP_SLOT);
        check(be[r]->ops->all_reduce_sum != NULL, "a member records all_reduce_sum");
        tp_step(be[r], &b[r]);
        be[r]->ops->graph_end(be[r], TP_SLOT);
        be[r]->ops->download(be[r], got[r], b[r].a.base, TP_ARENA_BYTES);
        check(memcmp(got[r], rec[r], TP_ARENA_BYTES) == 0, "rank %d: recording ran nothing", r);
        check_clean(be[r], "group record");
    }
    tp_member m[TP_WORLD];
    for (int r = 0; r < TP_WORLD; r++)
        m[r] = (tp_member){.be = be[r], .b = &b[r], .in = in[r], .out = got[r], .replay = 1};
    tp_run(m);
    for (int r = 0; r < TP_WORLD; r++) {
        m[r].out = want[r];
        m[r].replay = 0;
    }
    tp_run(m);
    for (int r = 0; r < TP_WORLD; r++) {
        check(memcmp(got[r], want[r], TP_ARENA_BYTES) == 0, "rank %d: replay equals eager", r);
        check_clean(be[r], "group replay");
    }
    /* The sums are the group's: every rank holds the same y and y2. */
    const size_t y_off = (size_t)((char *)b[0].y - b[0].a.base);
    const size_t y2_off = (size_t)((char *)b[0].y2 - b[0].a.base);
    check(memcmp(got[0] + y_off, got[1] + y_off, TP_ROWS * TP_N * sizeof(float)) == 0 &&
              memcmp(got[0] + y2_off, got[1] + y2_off, TP_ROWS * TP_N * sizeof(float)) == 0,
          "every rank holds the all-reduced values");
    for (int r = 0; r < TP_WORLD; r++) {
        free(in[r]);
        free(rec[r]);
        free(got[r]);
        free(want[r]);
        be[r]->ops->free(be[r], b[r].a.base);
        be[r]->ops->destroy(be[r]);
    }
}


int main(void)
{
    test_group();
    return check_done();
}
