/* The per-partition offset tracker (service/kafka/offsets.c): committable offsets
 * under out-of-order completion, duplicates, gaps, revocation and epochs,
 * plus a randomized comparison with a brute-force model. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "harness.h"
#include "kafka/offsets.h"

enum { T = 0, T2 = 1 }; /* topic ids */

static svc_offset_ticket begin_ok(svc_offsets *o, int32_t topic, int32_t part, int64_t off)
{
    svc_offset_ticket t = {0};
    svc_offsets_status st = svc_offsets_begin(o, topic, part, off, &t);
    check(st == SVC_OFFSETS_OK, "begin %d/%d@%lld: %s", topic, part, (long long)off,
          svc_offsets_status_name(st));
    check(t.offset == off && t.partition == part && t.topic_id == topic && t.epoch != 0,
          "ticket fields for @%lld", (long long)off);
    return t;
}

/* Finish and return the advanced commit (-1 when it did not advance). */
static int64_t finish_ok(svc_offsets *o, const svc_offset_ticket *t)
{
    int64_t commit = -2;
    svc_offsets_status st = svc_offsets_finish(o, t, &commit);
    check(st == SVC_OFFSETS_OK, "finish @%lld: %s", (long long)t->offset,
          svc_offsets_status_name(st));
    return commit;
}

static void test_in_order(void)
{
    svc_offsets *o = svc_offsets_create();
    check(o != NULL, "create");
    check(svc_offsets_assign(o, T, 0) == SVC_OFFSETS_OK, "assign");
    check(svc_offsets_committable(o, T, 0) == -1, "nothing begun: nothing to commit");
    svc_offset_ticket t[5];
    for (int i = 0; i < 5; i++)
        t[i] = begin_ok(o, T, 0, i);
    check(svc_offsets_committable(o, T, 0) == 0, "all pending: commit stays at the first");
    for (int i = 0; i < 5; i++) {
        int64_t c = finish_ok(o, &t[i]);
        check(c == i + 1, "in order: finish %d commits %lld", i, (long long)c);
    }
    check(svc_offsets_pending(o, T, 0, NULL, 0) == 0, "nothing pending");
    check(svc_offsets_committable(o, T, 0) == 5, "last finished + 1");
    svc_offsets_destroy(o);
}

static void test_out_of_order_and_gaps(void)
{
    svc_offsets *o = svc_offsets_create();
    svc_offsets_assign(o, T, 3);
    svc_offset_ticket a = begin_ok(o, T, 3, 10), b = begin_ok(o, T, 3, 11),
                      c = begin_ok(o, T, 3, 12), d = begin_ok(o, T, 3, 13);
    check(finish_ok(o, &c) == -1, "finishing 12 before 10 does not advance");
    check(svc_offsets_committable(o, T, 3) == 10, "committable is the first unfinished (10)");
    check(finish_ok(o, &a) == 11, "finishing 10 advances to the next unfinished, 11");
    check(finish_ok(o, &b) == 13, "finishing 11 skips the finished 12");
    check(finish_ok(o, &d) == 14, "finishing the last: last + 1");

    /* Gaps (compaction, transaction markers): the next begun offset counts. */
    svc_offset_ticket g1 = begin_ok(o, T, 3, 20), g2 = begin_ok(o, T, 3, 25),
                      g3 = begin_ok(o, T, 3, 40);
    check(finish_ok(o, &g2) == -1, "gap: 25 first, no advance");
    check(finish_ok(o, &g1) == 40, "gap: finishing 20 jumps to 40, the first unfinished");
    svc_offset_ticket mid = g3;
    mid.offset = 30;
    int64_t commit = 0;
    check(svc_offsets_finish(o, &mid, &commit) == SVC_OFFSETS_UNKNOWN && commit == -1,
          "an offset inside a gap was never begun");
    check(finish_ok(o, &g3) == 41, "gap: finish 40");
    svc_offsets_destroy(o);
}

static void test_duplicates(void)
{
    svc_offsets *o = svc_offsets_create();
    svc_offsets_assign(o, T, 0);
    svc_offset_ticket a = begin_ok(o, T, 0, 5);
    svc_offset_ticket untouched = {.offset = 777};
    check(svc_offsets_begin(o, T, 0, 5, &untouched) == SVC_OFFSETS_DUPLICATE,
          "the same offset twice while pending");
    check(untouched.offset == 777, "a refused begin leaves the ticket alone");
    check(svc_offsets_begin(o, T, 0, 4, &untouched) == SVC_OFFSETS_DUPLICATE,
          "an older offset is a redelivery");
    check(finish_ok(o, &a) == 6, "finish 5");
    int64_t commit = 0;
    check(svc_offsets_finish(o, &a, &commit) == SVC_OFFSETS_UNKNOWN && commit == -1,
          "finishing twice");
    check(svc_offsets_begin(o, T, 0, 5, &untouched) == SVC_OFFSETS_DUPLICATE,
          "redelivery of a finished offset");
    check(svc_offsets_begin(o, T, 0, -3, &untouched) == SVC_OFFSETS_INVALID,
          "negative offsets are refused");
    check(svc_offsets_committable(o, T, 0) == 6, "duplicates changed nothing");

    /* Finish twice while an earlier offset is still pending. */
    svc_offset_ticket b = begin_ok(o, T, 0, 6), c = begin_ok(o, T, 0, 7);
    check(finish_ok(o, &c) == -1, "finish 7 first");
    check(svc_offsets_finish(o, &c, &commit) == SVC_OFFSETS_UNKNOWN, "7 again: already done");
    check(finish_ok(o, &b) == 8, "finish 6 releases 6 and 7");
    svc_offsets_destroy(o);
}

/* Bad input answered at once: begin and finish back to back. */
static void test_immediate_finish(void)
{
    svc_offsets *o = svc_offsets_create();
    svc_offsets_assign(o, T, 0);
    svc_offset_ticket slow = begin_ok(o, T, 0, 0);
    svc_offset_ticket bad = begin_ok(o, T, 0, 1);
    check(finish_ok(o, &bad) == -1, "error reply delivered while 0 still generates");
    svc_offset_ticket bad2 = begin_ok(o, T, 0, 2);
    check(finish_ok(o, &bad2) == -1, "second bad input, still behind 0");
    check(finish_ok(o, &slow) == 3, "0 done: everything up to 2 is committable");
    svc_offsets_destroy(o);
}

static void test_revoke_and_epochs(void)
{
    svc_offsets *o = svc_offsets_create();
    svc_offset_ticket t = {0};
    check(svc_offsets_begin(o, T, 1, 0, &t) == SVC_OFFSETS_NOT_ASSIGNED,
          "begin on a partition not assigned");
    svc_offsets_assign(o, T, 1);
    svc_offsets_assign(o, T2, 1);
    svc_offset_ticket old5 = begin_ok(o, T, 1, 5), old6 = begin_ok(o, T, 1, 6);
    svc_offset_ticket other = begin_ok(o, T2, 1, 5);
    check(svc_offsets_assign(o, T, 1) == SVC_OFFSETS_OK, "assigning again keeps state");
    check(svc_offsets_pending(o, T, 1, NULL, 0) == 2, "state survived a repeated assign");

    svc_offset_ticket pend[4];
    check(finish_ok(o, &old6) == -1, "finish 6");
    size_t n = svc_offsets_pending(o, T, 1, pend, 4);
    check(n == 1 && pend[0].offset == 5 && pend[0].epoch == old5.epoch,
          "pending lists only the unfinished 5 with its epoch");

    svc_offsets_revoke(o, T, 1);
    check(svc_offsets_pending(o, T, 1, pend, 4) == 0, "revoked: nothing pending");
    check(svc_offsets_committable(o, T, 1) == -1, "revoked: nothing to commit");
    int64_t commit = 0;
    check(svc_offsets_finish(o, &old5, &commit) == SVC_OFFSETS_NOT_ASSIGNED && commit == -1,
          "a late finish after revoke is stale");
    svc_offsets_revoke(o, T, 1); /* not tracked: no-op */

    /* Assigned back, 5 redelivered and begun again: the old ticket must not
     * finish the new attempt. */
    svc_offsets_assign(o, T, 1);
    svc_offset_ticket new5 = begin_ok(o, T, 1, 5);
    check(new5.epoch != old5.epoch, "a new assignment gets a new epoch");
    check(svc_offsets_finish(o, &old5, &commit) == SVC_OFFSETS_NOT_ASSIGNED,
          "old epoch's finish does not touch the new attempt");
    check(svc_offsets_pending(o, T, 1, NULL, 0) == 1, "new attempt still pending");
    check(finish_ok(o, &new5) == 6, "new attempt finishes");

    check(finish_ok(o, &other) == 6, "the other topic's partition 1 was never affected");
    svc_offsets_destroy(o);
}

static void test_pending_cap(void)
{
    svc_offsets *o = svc_offsets_create();
    svc_offsets_assign(o, T, 0);
    svc_offset_ticket t[6];
    for (int i = 0; i < 6; i++)
        t[i] = begin_ok(o, T, 0, 100 + i);
    finish_ok(o, &t[2]);
    svc_offset_ticket out[2];
    size_t n = svc_offsets_pending(o, T, 0, out, 2);
    check(n == 5, "pending count (%zu) exceeds the cap", n);
    check(out[0].offset == 100 && out[1].offset == 101, "the first two in offset order");
    svc_offset_ticket all[8];
    n = svc_offsets_pending(o, T, 0, all, 8);
    check(n == 5 && all[2].offset == 103 && all[4].offset == 105, "finished 102 is not listed");
    svc_offsets_destroy(o);
}

/* Many partitions: growth of the partition table and removal from its
 * middle must not disturb the others. */
static void test_many_partitions(void)
{
    enum { N = 100 };
    svc_offsets *o = svc_offsets_create();
    svc_offset_ticket t[N];
    for (int p = 0; p < N; p++) {
        check(svc_offsets_assign(o, T, p) == SVC_OFFSETS_OK, "assign %d", p);
        t[p] = begin_ok(o, T, p, p * 10);
    }
    for (int p = 0; p < N; p += 3)
        svc_offsets_revoke(o, T, p);
    for (int p = 0; p < N; p++) {
        int64_t commit = -2;
        svc_offsets_status st = svc_offsets_finish(o, &t[p], &commit);
        if (p % 3 == 0)
            check(st == SVC_OFFSETS_NOT_ASSIGNED, "revoked partition %d", p);
        else
            check(st == SVC_OFFSETS_OK && commit == p * 10 + 1, "partition %d commits %lld", p,
                  (long long)commit);
    }
    svc_offsets_destroy(o);
}

/* ---- randomized comparison with a brute-force model ------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Up to MAXOFF offsets per partition; the model keeps begun/done flags. */
enum { MAXOFF = 20000, NPART = 3 };
static unsigned char begun[NPART][MAXOFF], done_[NPART][MAXOFF];

/* First begun-and-unfinished offset at or after *scan, else last + 1. The
 * answer never moves backwards (new offsets begin above `last`), so *scan
 * remembers where the previous answer was and the scans cost O(MAXOFF). */
static int64_t model_committable(int p, int64_t last, int64_t *scan)
{
    while (*scan <= last && !(begun[p][*scan] && !done_[p][*scan]))
        (*scan)++;
    return *scan <= last ? *scan : last + 1;
}

static void test_random_model(void)
{
    svc_offsets *o = svc_offsets_create();
    svc_offset_ticket *live[NPART];
    size_t n_live[NPART] = {0};
    int64_t next[NPART] = {0}, last[NPART] = {-1, -1, -1}, committed[NPART] = {-1, -1, -1};
    int64_t scan[NPART] = {0};
    for (int p = 0; p < NPART; p++) {
        svc_offsets_assign(o, T, p);
        live[p] = malloc(MAXOFF * sizeof *live[p]);
    }
    int mismatches = 0;
    long steps = 0;
    for (;;) {
        int p = (int)(rng() % NPART);
        /* In flight stays bounded (a batch), as in the worker: at most 64. */
        bool can_begin = next[p] < MAXOFF - 8 && n_live[p] < 64;
        if (!can_begin && n_live[p] == 0) {
            bool all_done = true;
            for (int q = 0; q < NPART; q++)
                all_done = all_done && next[q] >= MAXOFF - 8 && n_live[q] == 0;
            if (all_done)
                break;
            continue;
        }
        steps++;
        if (can_begin && (n_live[p] == 0 || rng() % 2)) {
            int64_t off = next[p] + (int64_t)(rng() % 4 == 0 ? rng() % 5 : 0);
            svc_offset_ticket t;
            if (svc_offsets_begin(o, T, p, off, &t) != SVC_OFFSETS_OK) {
                mismatches++;
                continue;
            }
            begun[p][off] = 1;
            last[p] = off;
            next[p] = off + 1;
            live[p][n_live[p]++] = t;
        } else {
            size_t k = (size_t)(rng() % n_live[p]);
            svc_offset_ticket t = live[p][k];
            live[p][k] = live[p][--n_live[p]];
            int64_t before = model_committable(p, last[p], &scan[p]);
            int64_t commit;
            if (svc_offsets_finish(o, &t, &commit) != SVC_OFFSETS_OK) {
                mismatches++;
                continue;
            }
            done_[p][t.offset] = 1;
            int64_t want = model_committable(p, last[p], &scan[p]);
            /* An advance is reported exactly when the model's answer moved. */
            if (want != before ? commit != want : commit != -1)
                mismatches++;
            if (commit != -1)
                committed[p] = commit;
            if (svc_offsets_committable(o, T, p) != want)
                mismatches++;
        }
    }
    for (int p = 0; p < NPART; p++) {
        check(committed[p] == last[p] + 1, "partition %d drained to %lld (last begun %lld)", p,
              (long long)committed[p], (long long)last[p]);
        free(live[p]);
    }
    check(mismatches == 0, "random model: %d mismatches in %ld steps", mismatches, steps);
    fprintf(stderr, "  random model: %ld steps over %d partitions\n", steps, NPART);
    svc_offsets_destroy(o);
}

int main(void)
{
    test_in_order();
    test_out_of_order_and_gaps();
    test_duplicates();
    test_immediate_finish();
    test_revoke_and_epochs();
    test_pending_cap();
    test_many_partitions();
    test_random_model();
    svc_offsets_destroy(NULL);
    return check_done();
}
