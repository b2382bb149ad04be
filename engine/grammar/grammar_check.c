/* ml_grammar_check (grammar_internal.h): the five guarantees of the grammar
 * tables verified from the tables alone, written apart from schema_emit.c
 * so that a mistake there is not repeated here. For tests and fuzzing. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"

#define CHECK_NONE UINT32_MAX

static const uint8_t check_ws_bytes[] = {' ', '\t', '\n', '\r'};

static uint32_t entry(const ml_grammar *g, uint32_t s, int b)
{
    return g->next[(size_t)s * g->n_classes + g->byte_class[b]];
}

static bool bit(const uint8_t *set, int b)
{
    return (set[b >> 3] >> (b & 7)) & 1;
}

/* The machine (by its start state's index in starts) of every state: states
 * reached from a start through byte edges and return states, never into a
 * callee. False when a state is in two machines or none. */
static bool check_machines(const ml_grammar *g, const uint32_t *starts, uint32_t n_starts,
                           uint32_t *mach, uint32_t *stack, char *err, size_t errlen)
{
    for (uint32_t s = 0; s < g->n_states; s++)
        mach[s] = CHECK_NONE;
    for (uint32_t m = 0; m < n_starts; m++) {
        uint32_t top = 0;
        if (mach[starts[m]] != CHECK_NONE && mach[starts[m]] != m) {
            ml_fail(err, errlen, ML_ERR_FORMAT, "state %u starts two machines", starts[m]);
            return false;
        }
        mach[starts[m]] = m;
        stack[top++] = starts[m];
        while (top) {
            uint32_t s = stack[--top];
            for (uint32_t c = 0; c < g->n_classes; c++) {
                uint32_t e = g->next[(size_t)s * g->n_classes + c];
                if (e == ML_GRAMMAR_DEAD)
                    continue;
                uint32_t t = e & ML_GRAMMAR_CALL ? g->calls[e & ~ML_GRAMMAR_CALL].ret : e;
                if (mach[t] == CHECK_NONE) {
                    mach[t] = m;
                    stack[top++] = t;
                } else if (mach[t] != m) {
                    ml_fail(err, errlen, ML_ERR_FORMAT, "state %u is in two machines", t);
                    return false;
                }
            }
        }
    }
    for (uint32_t s = 0; s < g->n_states; s++)
        if (mach[s] == CHECK_NONE) {
            ml_fail(err, errlen, ML_ERR_FORMAT, "state %u is unreachable (guarantee 3)", s);
            return false;
        }
    return true;
}

/* need[] recomputed by relaxation to a fixpoint and compared (full), or
 * only checked to be each state's minimum over its entries (not full:
 * local, one pass). */
static bool check_need(const ml_grammar *g, bool full, uint32_t *need, char *err, size_t errlen)
{
    for (uint32_t s = 0; s < g->n_states; s++)
        need[s] = g->flags[s] & ML_GRAMMAR_ACCEPT ? 0 : full ? CHECK_NONE : g->need[s];
    if (!full) {
        for (uint32_t s = 0; s < g->n_states; s++) {
            uint32_t best = g->flags[s] & ML_GRAMMAR_ACCEPT ? 0 : CHECK_NONE;
            for (uint32_t c = 0; c < g->n_classes; c++) {
                uint32_t e = g->next[(size_t)s * g->n_classes + c], v;
                if (e == ML_GRAMMAR_DEAD)
                    continue;
                if (e & ML_GRAMMAR_CALL) {
                    const ml_grammar_call *k = &g->calls[e & ~ML_GRAMMAR_CALL];
                    v = need[k->enter] + 1u > need[k->ret] ? need[k->enter] + 1u : need[k->ret];
                } else {
                    v = need[e];
                }
                best = v < best ? v : best;
            }
            need[s] = best;
        }
    }
    for (bool changed = full; changed;) {
        changed = false;
        for (uint32_t s = g->n_states; s-- > 0;) {
            for (uint32_t c = 0; c < g->n_classes; c++) {
                uint32_t e = g->next[(size_t)s * g->n_classes + c], v;
                if (e == ML_GRAMMAR_DEAD)
                    continue;
                if (e & ML_GRAMMAR_CALL) {
                    const ml_grammar_call *k = &g->calls[e & ~ML_GRAMMAR_CALL];
                    if (need[k->enter] == CHECK_NONE || need[k->ret] == CHECK_NONE)
                        continue;
                    v = need[k->enter] + 1 > need[k->ret] ? need[k->enter] + 1 : need[k->ret];
                } else {
                    v = need[e];
                }
                if (v < need[s]) {
                    need[s] = v;
                    changed = true;
                }
            }
        }
    }
    for (uint32_t s = 0; s < g->n_states; s++)
        if (need[s] != g->need[s] || need[s] > ML_GRAMMAR_MAX_DEPTH) {
            ml_fail(err, errlen, ML_ERR_FORMAT, "state %u: need %u, recomputed %u (guarantee 3)",
                    s, g->need[s], need[s]);
            return false;
        }
    return true;
}

/* The byte classes with an entry in state s. */
static void check_first(const ml_grammar *g, uint32_t s, uint8_t set[32])
{
    for (uint32_t c = 0; c < g->n_classes; c++)
        if (g->next[(size_t)s * g->n_classes + c] != ML_GRAMMAR_DEAD)
            set[c >> 3] |= (uint8_t)(1u << (c & 7));
}

ml_status ml_grammar_check(const ml_grammar *g, bool full, char *err, size_t errlen)
{
    if (!g || g->n_states == 0 || g->start >= g->n_states || g->n_classes == 0 ||
        g->n_classes > 256)
        return ml_fail(err, errlen, ML_ERR_FORMAT, "grammar: no states, or a bad start");
    for (int b = 0; b < 256; b++)
        if (g->byte_class[b] >= g->n_classes)
            return ml_fail(err, errlen, ML_ERR_FORMAT, "byte 0x%02x: class out of range", b);
    for (uint32_t k = 0; k < g->n_calls; k++)
        if (g->calls[k].enter >= g->n_states || g->calls[k].ret >= g->n_states)
            return ml_fail(err, errlen, ML_ERR_FORMAT, "call %u: state out of range", k);
    for (size_t i = 0; i < (size_t)g->n_states * g->n_classes; i++) {
        uint32_t e = g->next[i];
        if (e != ML_GRAMMAR_DEAD &&
            (e & ML_GRAMMAR_CALL ? (e & ~ML_GRAMMAR_CALL) >= g->n_calls : e >= g->n_states))
            return ml_fail(err, errlen, ML_ERR_FORMAT, "entry %zu out of range", i);
    }

    /* Machines: the document's start, then each distinct callee start. */
    uint32_t n = g->n_states;
    uint32_t *starts = malloc((g->n_calls + 1) * sizeof *starts);
    uint32_t *mach = malloc(n * sizeof *mach);
    uint32_t *tmp = malloc(n * sizeof *tmp);
    uint8_t (*follow)[32] = calloc(g->n_calls + 1, sizeof *follow);
    ml_status st = ML_ERR_NOMEM;
    if (!starts || !mach || !tmp || !follow) {
        ml_fail(err, errlen, st, "grammar check: out of memory");
        goto out;
    }
    uint32_t n_starts = 0;
    starts[n_starts++] = g->start;
    for (uint32_t k = 0; k < g->n_calls; k++) {
        uint32_t m = 0;
        while (m < n_starts && starts[m] != g->calls[k].enter)
            m++;
        if (m == n_starts)
            starts[n_starts++] = g->calls[k].enter;
    }
    st = ML_ERR_FORMAT;
    if (!check_machines(g, starts, n_starts, mach, tmp, err, errlen) ||
        !check_need(g, full, tmp, err, errlen))
        goto out;

    /* 1: a call's byte is one its callee begins with (looking it up at the
     * callee's start finds an edge, or a call that does, within n_calls). */
    int rep[256];
    for (uint32_t c = 0; c < g->n_classes; c++)
        rep[c] = -1;
    for (int b = 255; b >= 0; b--)
        rep[g->byte_class[b]] = b;
    for (uint32_t s = 0; s < n; s++)
        for (uint32_t c = 0; c < g->n_classes; c++) {
            int b = rep[c];
            uint32_t e = b < 0 ? ML_GRAMMAR_DEAD : entry(g, s, b);
            for (uint32_t hops = 0; e != ML_GRAMMAR_DEAD && (e & ML_GRAMMAR_CALL); hops++) {
                if (hops > g->n_calls) {
                    ml_fail(err, errlen, ML_ERR_FORMAT,
                            "state %u byte 0x%02x: calls that consume nothing (guarantee 1)", s,
                            b);
                    goto out;
                }
                e = entry(g, g->calls[e & ~ML_GRAMMAR_CALL].enter, b);
                if (e == ML_GRAMMAR_DEAD) {
                    ml_fail(err, errlen, ML_ERR_FORMAT,
                            "state %u byte 0x%02x: the callee does not begin with it "
                            "(guarantee 1)",
                            s, b);
                    goto out;
                }
            }
        }

    /* 2: follow sets of the called machines, to a fixpoint: what the return
     * states begin with, and, for an accepting return state, what follows
     * its own machine. */
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t k = 0; k < g->n_calls; k++) {
            uint8_t add[32] = {0};
            uint32_t callee = mach[g->calls[k].enter], ret = g->calls[k].ret;
            check_first(g, ret, add);
            if (g->flags[ret] & ML_GRAMMAR_ACCEPT)
                for (int w = 0; w < 32; w++)
                    add[w] |= follow[mach[ret]][w];
            for (int w = 0; w < 32; w++)
                if ((follow[callee][w] | add[w]) != follow[callee][w]) {
                    follow[callee][w] |= add[w];
                    changed = true;
                }
        }
    }
    for (uint32_t s = 0; s < n; s++) {
        if (!(g->flags[s] & ML_GRAMMAR_ACCEPT))
            continue;
        for (uint32_t c = 0; c < g->n_classes; c++) {
            int b = rep[c];
            if (b < 0 || entry(g, s, b) == ML_GRAMMAR_DEAD)
                continue;
            if (bit(follow[mach[s]], (int)c)) {
                ml_fail(err, errlen, ML_ERR_FORMAT,
                        "state %u byte 0x%02x: continues a value and may follow it "
                        "(guarantee 2)",
                        s, b);
                goto out;
            }
        }
        /* 5: the document ends where it is complete. */
        for (size_t w = 0; w < sizeof check_ws_bytes; w++) {
            if (mach[s] == 0 && entry(g, s, check_ws_bytes[w]) != ML_GRAMMAR_DEAD) {
                ml_fail(err, errlen, ML_ERR_FORMAT,
                        "state %u: whitespace after a complete document (guarantee 5)", s);
                goto out;
            }
        }
    }

    /* 4: outside strings, whitespace leads into a gap: a state where every
     * whitespace byte loops. */
    for (uint32_t s = 0; s < n; s++) {
        if (g->flags[s] & ML_GRAMMAR_IN_STRING)
            continue;
        for (size_t w0 = 0; w0 < sizeof check_ws_bytes; w0++) {
            int b = check_ws_bytes[w0];
            uint32_t t = entry(g, s, b);
            if (t == ML_GRAMMAR_DEAD)
                continue;
            bool gap = !(t & ML_GRAMMAR_CALL) && !(g->flags[t] & ML_GRAMMAR_IN_STRING);
            for (size_t w = 0; gap && w < sizeof check_ws_bytes; w++)
                gap = entry(g, t, check_ws_bytes[w]) == t;
            if (!gap) {
                ml_fail(err, errlen, ML_ERR_FORMAT,
                        "state %u byte 0x%02x: whitespace outside a string that does not "
                        "enter a gap (guarantee 4)",
                        s, b);
                goto out;
            }
        }
    }
    st = ML_OK;
out:
    free(starts);
    free(mach);
    free(tmp);
    free(follow);
    return st;
}
