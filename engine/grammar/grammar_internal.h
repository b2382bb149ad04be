/* The compiled grammar, as schema.c emits it and grammar.c runs it; not an
 * API.
 *
 * A grammar is a set of machines, each a deterministic automaton over bytes
 * (fsm.h) for the JSON text of one value: machine 0 is the document, one
 * more per recursive $ref target. All their states share one table. In
 * state s, byte b leads to next[s * n_classes + byte_class[b]], which is
 *   - ML_GRAMMAR_DEAD: no edge;
 *   - a state t (< n_states): go to t;
 *   - ML_GRAMMAR_CALL | k: a value of the machine whose start is
 *     calls[k].enter begins with b: push calls[k].ret (where the caller goes
 *     once that value is complete), go to calls[k].enter and look b up there
 *     (which may call again).
 * When b has no edge from s, s is accepting (ML_GRAMMAR_ACCEPT) and the stack
 * is not empty, the value is complete: pop the return state and look b up
 * there. Otherwise b is refused.
 *
 * What schema.c guarantees, so that this walk is deterministic and exact:
 *   1. A byte that starts a call is not also a byte edge or another call's
 *      first byte in the same state (the call's machine decided by its first
 *      byte; schema.c refuses a schema where it would not be).
 *   2. From an accepting state of a called machine, the bytes with an edge
 *      never begin what its return state accepts (a JSON value ends where
 *      the structure around it says: a number's digits never follow a value),
 *      so "no edge, then return" loses nothing.
 *   3. Every state is reachable and can complete; need[s] is the fewest
 *      nested calls still to enter on the way from s to completing the
 *      machine of s (0 without calls). The walk takes an edge into t at
 *      stack depth D only when D + need[t] <= ML_GRAMMAR_MAX_DEPTH, and a
 *      call only when the callee and the return state both fit (D + 1 +
 *      need[enter] and D + need[ret]), so no state it reaches is a dead end.
 *      need[s] <= ML_GRAMMAR_MAX_DEPTH for every state (at depth 0 the walk
 *      takes a byte edge without looking).
 *   4. Whitespace outside strings is a self-loop (the gap between tokens);
 *      flags[s] & ML_GRAMMAR_IN_STRING says s is inside a string, where
 *      whitespace is content. The walk counts the whitespace bytes taken
 *      outside strings since the last other byte and refuses a run over
 *      ML_JSON_MAX_WHITESPACE.
 *   5. Machine 0's accepting states are where the document is complete; it
 *      has no trailing whitespace (the sequence ends there).
 */
#ifndef ML_GRAMMAR_GRAMMAR_INTERNAL_H
#define ML_GRAMMAR_GRAMMAR_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"

#define ML_GRAMMAR_DEAD UINT32_MAX
#define ML_GRAMMAR_CALL 0x80000000u

enum {
    ML_GRAMMAR_ACCEPT = 1u,    /* the machine's value may end here */
    ML_GRAMMAR_IN_STRING = 2u, /* inside a JSON string */
};

typedef struct ml_grammar_call {
    uint32_t enter; /* the callee's start state */
    uint32_t ret;   /* the caller's state after the callee's value */
} ml_grammar_call;

typedef struct ml_grammar_mask_cache ml_grammar_mask_cache;

struct ml_grammar {
    atomic_uint refs;
    uint8_t digest[32];

    uint32_t n_states;
    uint32_t start;         /* machine 0's start */
    uint32_t n_classes;     /* byte classes: bytes with the same column everywhere */
    uint8_t byte_class[256];
    uint32_t *next;         /* owned: (n_states, n_classes) */
    uint8_t *flags;         /* owned: n_states, ML_GRAMMAR_* */
    uint16_t *need;         /* owned: n_states, guarantee 3 */
    ml_grammar_call *calls; /* owned: n_calls */
    uint32_t n_calls;
    uint8_t max_ws;         /* longest whitespace run (ml_schema_limits.max_whitespace) */

    /* grammar.c's: masks of states whose mask depends on the state alone,
     * computed once and shared by every sequence (guarded by its lock). */
    ml_grammar_mask_cache *masks;
};

/* What schema.c hands grammar.c: a grammar with refs 1, digest, tables and
 * no mask cache filled; frees everything ml_grammar_unref frees. */
ml_grammar *ml_grammar_alloc(uint32_t n_states, uint32_t n_classes, uint32_t n_calls);

/* Check the tables against the five guarantees above (and that every entry
 * is in range), independently of how schema_emit.c made them. full: need[]
 * is recomputed to a fixpoint (up to O(n_states^2 * n_classes): tests and
 * fuzzing); else only checked to be each state's minimum over its entries
 * (O(n_states * n_classes): schema.c runs that on every grammar it emits,
 * and refuses a schema that fails it). ML_OK, or ML_ERR_FORMAT with the
 * first broken guarantee, its state and byte in err. */
ml_status ml_grammar_check(const ml_grammar *g, bool full, char *err, size_t errlen);

/* A string budget without limit (ml_grammar_state_string_budget). */
#define ML_GRAMMAR_BUDGET_UNBOUNDED 65535L

/* Fibonacci hashing: the high bits mix every bit of the key. */
static inline uint32_t ml_grammar_hash(uint64_t key)
{
    return (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 32);
}

/* The budget of a state, as ml_grammar_string_budget finds it, remembered
 * per grammar (ml_grammar_mask_cache.budget): unknown, not such a string,
 * unbounded, or GRAMMAR_BUDGET_0 + the characters left; with, above
 * GRAMMAR_BUDGET_NEED_SHIFT, the largest need of the string's states (the
 * shortcut holds at depths where every one of them fits). */
enum { GRAMMAR_BUDGET_UNKNOWN, GRAMMAR_BUDGET_NONE, GRAMMAR_BUDGET_0 };
#define GRAMMAR_BUDGET_UNBOUNDED ((uint32_t)ML_GRAMMAR_BUDGET_UNBOUNDED)
#define GRAMMAR_BUDGET_NEED_SHIFT 16
#define GRAMMAR_BUDGET_CODE(m) ((m) & 0xffffu)

/* The characters state s may still take, if s behaves as the point between
 * two characters of a string in lexemes.h's one form per character with
 * that many left (GRAMMAR_BUDGET_UNBOUNDED: no limit), else
 * GRAMMAR_BUDGET_NONE, with the string's largest need above
 * GRAMMAR_BUDGET_NEED_SHIFT; the budgets of the states between characters
 * met on the way are written to memo (n_states entries) where unknown
 * (their strings are parts of this one). In grammar_string.c. */
uint32_t ml_grammar_string_budget(const ml_grammar *g, uint32_t s, uint32_t *memo);

/* For tests: when the mask of s takes grammar.c's string shortcut, the
 * characters the string may still take (ML_GRAMMAR_BUDGET_UNBOUNDED: no
 * limit); -1 when it does not. */
long ml_grammar_state_string_budget(const ml_grammar_state *s);

#endif
