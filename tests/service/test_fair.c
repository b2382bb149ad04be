/* Fair share across tenants (service/worker/fair.c): admission by weight,
 * work conservation, no credit banked while idle, FIFO within a tenant,
 * removal of queued items, and the fetch plan's per-tenant caps and global
 * mark. */
#include <stdbool.h>
#include <stddef.h>

#include "harness.h"
#include "worker/fair.h"

#define N_ITEMS 64

typedef struct item {
    svc_fair_item link; /* first: an svc_fair_item * is an item * */
    size_t tenant;
    int seq;
} item;

static item pool[N_ITEMS];
static int n_pool;

static item *make(size_t tenant, int seq)
{
    item *it = &pool[n_pool++ % N_ITEMS];
    *it = (item){.tenant = tenant, .seq = seq};
    return it;
}

/* Push `count` items for tenant, numbered from seq0. */
static void push_n(svc_fair *f, size_t tenant, int count, int seq0)
{
    for (int i = 0; i < count; i++)
        svc_fair_push(f, tenant, &make(tenant, seq0 + i)->link);
}

static void test_create_refuses(void)
{
    int zero[] = {1, 0};
    check(!svc_fair_create(zero, 2), "a weight of 0 is refused");
    check(!svc_fair_create(zero, 0), "no tenants is refused");
    svc_fair_destroy(NULL);
}

/* Weights 3:1, both backlogged: of 40 admissions 30 and 10, interleaved
 * (no window of 8 is all one tenant), each tenant in its own order. */
static void test_weights(void)
{
    int w[] = {3, 1};
    svc_fair *f = svc_fair_create(w, 2);
    n_pool = 0;
    push_n(f, 0, 30, 0);
    push_n(f, 1, 10, 0);
    check(svc_fair_total(f) == 40 && svc_fair_waiting(f, 1) == 10, "counts");
    int got[2] = {0, 0}, next[2] = {0, 0}, run = 0, longest = 0;
    size_t last = 9;
    for (int i = 0; i < 40; i++) {
        size_t t = 9;
        item *it = (item *)svc_fair_pop(f, &t);
        check(it && t == it->tenant, "pop %d", i);
        if (!it)
            break;
        check(it->seq == next[t]++, "tenant %zu in arrival order", t);
        got[t]++;
        run = t == last ? run + 1 : 1;
        longest = run > longest ? run : longest;
        last = t;
        if (i == 19)
            check(got[0] == 15 && got[1] == 5, "first 20: %d and %d, want 15 and 5", got[0], got[1]);
    }
    check(got[0] == 30 && got[1] == 10, "all of them");
    check(longest <= 3, "the heavy tenant ran %d in a row, want <= 3", longest);
    check(!svc_fair_pop(f, NULL) && svc_fair_total(f) == 0, "empty");
    svc_fair_destroy(f);
}

/* Equal weights, tenant 0's requests of 4 choices (cost 4), tenant 1's of
 * one: of the first 10 admissions, 2 and 8, as if tenant 0 had sent
 * requests of one choice 4 times as often. */
static void test_cost(void)
{
    int w[] = {1, 1};
    svc_fair *f = svc_fair_create(w, 2);
    n_pool = 0;
    for (int i = 0; i < 10; i++) {
        item *it = make(0, i);
        it->link.cost = 4;
        svc_fair_push(f, 0, &it->link);
    }
    push_n(f, 1, 10, 0);
    int got[2] = {0, 0};
    for (int i = 0; i < 10; i++) {
        size_t t = 9;
        check(svc_fair_pop(f, &t) != NULL, "pop %d", i);
        got[t < 2 ? t : 0]++;
    }
    check(got[0] == 2 && got[1] == 8, "cost 4 against 1: %d and %d admissions, want 2 and 8",
          got[0], got[1]);
    svc_fair_destroy(f);
}

/* A flood from tenant 0; tenant 1's request, pushed behind 500 of them, is
 * the next or second admission, not the 501st. FIFO would make it last. */
static void test_flood_does_not_starve(void)
{
    int w[] = {1, 1};
    svc_fair *f = svc_fair_create(w, 2);
    n_pool = 0;
    for (int i = 0; i < 40; i++) /* the flood has been running a while */
        svc_fair_push(f, 0, &make(0, i)->link), svc_fair_pop(f, NULL);
    push_n(f, 0, N_ITEMS - 2, 0);
    svc_fair_push(f, 1, &make(1, 0)->link);
    int at = -1;
    for (int i = 0; at < 0; i++) {
        size_t t;
        if (!svc_fair_pop(f, &t))
            break;
        if (t == 1)
            at = i;
    }
    check(at >= 0 && at <= 1, "the quiet tenant's request went at %d, want 0 or 1", at);
    svc_fair_destroy(f);
}

/* Work conserving and no banked credit: tenant 1 idle while tenant 0 got
 * 100 admissions; when tenant 1 comes back both alternate from there (it
 * does not get 100 in a row). */
static void test_idle_banks_nothing(void)
{
    int w[] = {1, 1};
    svc_fair *f = svc_fair_create(w, 2);
    n_pool = 0;
    for (int i = 0; i < 100; i++) {
        svc_fair_push(f, 0, &make(0, i)->link);
        size_t t = 9;
        check(svc_fair_pop(f, &t) && t == 0, "alone, tenant 0 gets every slot");
    }
    push_n(f, 0, 10, 0);
    push_n(f, 1, 10, 0);
    int ones = 0;
    for (int i = 0; i < 10; i++) {
        size_t t;
        svc_fair_pop(f, &t);
        ones += t == 1;
    }
    check(ones >= 4 && ones <= 6, "first 10 after the return: %d of tenant 1, want about 5", ones);
    svc_fair_destroy(f);
}

static bool is_seq(const svc_fair_item *it, void *ctx)
{
    return ((const item *)it)->seq == *(int *)ctx;
}

static void test_take(void)
{
    int w[] = {1, 2};
    svc_fair *f = svc_fair_create(w, 2);
    n_pool = 0;
    push_n(f, 0, 3, 0);
    push_n(f, 1, 3, 10);
    int want = 12; /* tenant 1's tail */
    item *it = (item *)svc_fair_take(f, is_seq, &want);
    check(it && it->seq == 12 && svc_fair_waiting(f, 1) == 2, "took the tail");
    want = 0; /* tenant 0's head */
    it = (item *)svc_fair_take(f, is_seq, &want);
    check(it && it->seq == 0 && svc_fair_waiting(f, 0) == 2 && svc_fair_total(f) == 4,
          "took the head");
    want = 99;
    check(!svc_fair_take(f, is_seq, &want), "no match: nothing taken");
    svc_fair_push(f, 1, &make(1, 13)->link); /* the tail moved correctly */
    int seqs[5], n = 0;
    for (item *p; (p = (item *)svc_fair_pop(f, NULL));)
        seqs[n++] = p->seq;
    check(n == 5, "five left, got %d", n);
    int ones[3], k = 0;
    for (int i = 0; i < n; i++)
        if (seqs[i] >= 10)
            ones[k++] = seqs[i];
    check(k == 3 && ones[0] == 10 && ones[1] == 11 && ones[2] == 13, "tenant 1 in order");
    svc_fair_destroy(f);
}

/* ---- fetch plan ----------------------------------------------------------------- */

/* One tenant with cap = high is today's hysteresis: pause at high, resume
 * at low. */
static void test_plan_single(void)
{
    svc_fair_fetch t = {.weight = 1, .max_in_flight = 32};
    int high = 32, low = 16;
    t.in_flight = 31;
    svc_fair_fetch_plan(&t, 1, high, low, false);
    check(!t.paused, "below the mark: fetching");
    t.in_flight = 32;
    svc_fair_fetch_plan(&t, 1, high, low, false);
    check(t.paused, "at the mark: paused");
    t.in_flight = 17;
    svc_fair_fetch_plan(&t, 1, high, low, false);
    check(t.paused, "above low: still paused");
    t.in_flight = 16;
    svc_fair_fetch_plan(&t, 1, high, low, false);
    check(!t.paused, "at low: resumed");
    svc_fair_fetch_plan(&t, 1, high, low, true);
    check(t.paused, "draining pauses");
}

/* Tenant 0 floods to the global mark: it pauses, tenant 1 keeps fetching
 * up to its share; tenant 1's own cap pauses only tenant 1. */
static void test_plan_flood(void)
{
    int high = 16, low = 8;
    svc_fair_fetch t[2] = {{.weight = 1, .max_in_flight = 16}, {.weight = 1, .max_in_flight = 16}};
    t[0].in_flight = 16;
    svc_fair_fetch_plan(t, 2, high, low, false);
    check(t[0].paused && !t[1].paused, "flooding tenant paused, the other fetching");
    t[1].in_flight = 7;
    svc_fair_fetch_plan(t, 2, high, low, false);
    check(!t[1].paused, "below its share of 8 while the total is 23: fetching");
    t[1].in_flight = 8;
    svc_fair_fetch_plan(t, 2, high, low, false);
    check(t[1].paused, "at its share with the total over the mark: paused");
    /* Tenant 0 finishes most of its work: resumes once under its share. */
    t[0].in_flight = 7;
    t[1].in_flight = 8;
    svc_fair_fetch_plan(t, 2, high, low, false);
    check(!t[0].paused, "under its share: resumed although the total is 15 > low");
    check(t[1].paused, "tenant 1 at its share, total above low: still paused");
    /* Per-tenant cap: tenant 1 capped at 2 pauses alone, even when idle
     * otherwise; resumes at cap * low / high = 1. */
    svc_fair_fetch c[2] = {{.weight = 1, .max_in_flight = 16}, {.weight = 1, .max_in_flight = 2}};
    c[1].in_flight = 2;
    svc_fair_fetch_plan(c, 2, high, low, false);
    check(!c[0].paused && c[1].paused, "the cap pauses its tenant only");
    c[1].in_flight = 1;
    svc_fair_fetch_plan(c, 2, high, low, false);
    check(!c[1].paused, "at half its cap: resumed");
}

/* Weighted shares: weights 3:1 of 16 are 12 and 4. */
static void test_plan_weights(void)
{
    int high = 16, low = 8;
    svc_fair_fetch t[2] = {{.weight = 3, .max_in_flight = 16}, {.weight = 1, .max_in_flight = 16}};
    t[0].in_flight = 11;
    t[1].in_flight = 5;
    svc_fair_fetch_plan(t, 2, high, low, false);
    check(!t[0].paused && t[1].paused, "over the mark: tenant 0 under 12 fetches, 1 over 4 stops");
}

int main(void)
{
    test_create_refuses();
    test_weights();
    test_cost();
    test_flood_does_not_starve();
    test_idle_banks_nothing();
    test_take();
    test_plan_single();
    test_plan_flood();
    test_plan_weights();
    return check_done();
}
