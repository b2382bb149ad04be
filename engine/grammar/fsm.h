/* Byte automata for the grammar compiler: deterministic finite automata over
 * bytes, built by composition, on which JSON Schema is compiled (schema.c)
 * and the lexemes are made (lexemes.c, regex.c).
 *
 * Symbols. An automaton reads symbols: the bytes 0..255 and call symbols
 * ML_FSM_CALL(k), k < ML_FSM_MAX_CALLS, each standing for one whole value of
 * the grammar's machine k (a recursive $ref; grammar_internal.h says how a
 * call becomes byte transitions). Concatenation, union and repetition accept
 * call symbols; intersection and difference refuse automata holding one
 * (ML_ERR_UNSUPPORTED): the language of a call is not regular.
 *
 * Every automaton an operation returns is deterministic, trimmed (every state
 * is reachable from the start and can reach an accepting state; the empty
 * language is one non-accepting start state without edges) and minimal
 * (states with the same future and the same tags are merged). State 0 is the
 * start.
 *
 * Tags. Each state carries a byte of tags (ML_FSM_TAG_*); an operation that
 * merges states (subset construction, products) ORs the tags of the states
 * it merges, and minimisation never merges states whose tags differ.
 * The compiler tags every state inside a JSON string with
 * ML_FSM_TAG_IN_STRING: by JSON's lexical structure, whether a byte prefix
 * is inside a string depends on the prefix alone, so a merged state is never
 * half inside.
 *
 * Ownership. Every operation takes ownership of the automata it is given
 * (they are freed, whatever the outcome) and returns a new one owned by the
 * caller, or NULL on error. An operation given a NULL argument returns NULL:
 * a composition can be written as one expression and checked once. The first
 * error is latched in the context (ml_fsm_ctx_status, ml_fsm_ctx_error) and
 * every later operation on the context returns NULL.
 *
 * Bounds. The context bounds the states of every automaton built (including
 * the intermediate ones of a subset construction or product) and the time
 * spent: past either, the operation fails with ML_ERR_TOO_LARGE and a
 * message naming the bound. Nothing is unbounded, so a hostile schema costs
 * at most the bounds.
 *
 * @locality: a context and its automata belong to one thread. */
#ifndef ML_GRAMMAR_FSM_H
#define ML_GRAMMAR_FSM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define ML_FSM_N_BYTES 256u
/* Call symbols: ML_FSM_CALL(k) for machine k. */
#define ML_FSM_MAX_CALLS 4096u
#define ML_FSM_CALL(k) (ML_FSM_N_BYTES + (uint32_t)(k))
#define ML_FSM_N_SYMBOLS (ML_FSM_N_BYTES + ML_FSM_MAX_CALLS)
/* ml_fsm_repeat's max for "no upper bound". */
#define ML_FSM_UNBOUNDED UINT32_MAX

enum {
    ML_FSM_TAG_IN_STRING = 1u, /* inside a JSON string: whitespace here is content */
};

typedef struct ml_fsm ml_fsm;
typedef struct ml_fsm_ctx ml_fsm_ctx;

/* An edge: symbols [lo, hi] lead to state `to`. */
typedef struct ml_fsm_edge {
    uint32_t lo, hi, to;
} ml_fsm_edge;

/* ---- context --------------------------------------------------------------- */

/* A context bounding every automaton to max_states states and all the work
 * done in it to deadline_ms (ml_clock_ms's clock; 0: no deadline).
 * Returns NULL when out of memory. */
ml_fsm_ctx *ml_fsm_ctx_create(uint32_t max_states, double deadline_ms);

/* No-op on NULL. Automata made in the context must be freed first. */
void ml_fsm_ctx_destroy(ml_fsm_ctx *c);

/* ML_OK, or the first error of an operation on the context. */
ml_status ml_fsm_ctx_status(const ml_fsm_ctx *c);

/* The first error's message ("" when none). */
const char *ml_fsm_ctx_error(const ml_fsm_ctx *c);

/* Latch an error from outside (a lexeme or schema check that failed), so
 * every later operation returns NULL. The first error stays. Returns st. */
ml_status ml_fsm_ctx_fail(ml_fsm_ctx *c, ml_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* No-op on NULL. */
void ml_fsm_free(ml_fsm *a);

/* ---- atoms ----------------------------------------------------------------- */

/* The empty language (nothing matches). */
ml_fsm *ml_fsm_nothing(ml_fsm_ctx *c);
/* The empty string only. */
ml_fsm *ml_fsm_epsilon(ml_fsm_ctx *c);
/* One byte among set (bit b & 7 of set[b >> 3]). */
ml_fsm *ml_fsm_byte_set(ml_fsm_ctx *c, const uint8_t set[32]);
/* One byte in [lo, hi]. */
ml_fsm *ml_fsm_byte_range(ml_fsm_ctx *c, uint8_t lo, uint8_t hi);
/* Exactly these n bytes. */
ml_fsm *ml_fsm_literal(ml_fsm_ctx *c, const void *bytes, size_t n);
/* One call symbol: a whole value of machine k (k < ML_FSM_MAX_CALLS). */
ml_fsm *ml_fsm_call(ml_fsm_ctx *c, uint32_t k);
/* One code point in one of the n inclusive ranges (any order, may overlap,
 * clipped to U+0000..U+10FFFF without the surrogates U+D800..U+DFFF) in its
 * UTF-8 form (shortest form only: the automaton of RE2's UTF-8 ranges). */
ml_fsm *ml_fsm_utf8(ml_fsm_ctx *c, const uint32_t (*ranges)[2], size_t n);

/* ---- composition (each takes ownership of its arguments) -------------------- */

/* a then b. */
ml_fsm *ml_fsm_concat(ml_fsm_ctx *c, ml_fsm *a, ml_fsm *b);
/* a or b. */
ml_fsm *ml_fsm_union(ml_fsm_ctx *c, ml_fsm *a, ml_fsm *b);
/* The union of a[0..n) in one subset construction (n = 0: the empty
 * language): for enum and anyOf, where a chain of ml_fsm_union redoes the
 * growing result once per member. Takes ownership of every a[i]; NULL
 * when any is NULL. */
ml_fsm *ml_fsm_union_n(ml_fsm_ctx *c, ml_fsm *const *a, size_t n);
/* a[0] then a[1] ... then a[n - 1] (n = 0: the empty string), in one
 * construction. Ownership as ml_fsm_union_n. */
ml_fsm *ml_fsm_concat_n(ml_fsm_ctx *c, ml_fsm *const *a, size_t n);
/* Between min and max (ML_FSM_UNBOUNDED: no bound) repetitions of a;
 * min <= max. A bounded repeat costs about max copies of a: the context's
 * state bound applies. */
ml_fsm *ml_fsm_repeat(ml_fsm_ctx *c, ml_fsm *a, uint32_t min, uint32_t max);
/* Strings in both (byte automata only, else ML_ERR_UNSUPPORTED). */
ml_fsm *ml_fsm_intersect(ml_fsm_ctx *c, ml_fsm *a, ml_fsm *b);
/* Strings in a and not in b (byte automata only). */
ml_fsm *ml_fsm_minus(ml_fsm_ctx *c, ml_fsm *a, ml_fsm *b);
/* a with tags ORed into every state. */
ml_fsm *ml_fsm_tag(ml_fsm_ctx *c, ml_fsm *a, uint8_t tags);

/* A deep copy (a stays the caller's). */
ml_fsm *ml_fsm_copy(ml_fsm_ctx *c, const ml_fsm *a);

/* ---- inspection (a borrowed) ------------------------------------------------ */

uint32_t ml_fsm_n_states(const ml_fsm *a);
bool ml_fsm_accepting(const ml_fsm *a, uint32_t state);
uint8_t ml_fsm_tags(const ml_fsm *a, uint32_t state);
/* The edges of state, sorted by lo, disjoint: *out points into a (valid
 * while a lives); returns their number. */
size_t ml_fsm_edges(const ml_fsm *a, uint32_t state, const ml_fsm_edge **out);
/* True when no string is accepted. */
bool ml_fsm_is_empty(const ml_fsm *a);
/* True when a holds a call symbol. */
bool ml_fsm_has_calls(const ml_fsm *a);
/* 1 when the byte string is accepted (no calls on the way), for tests. */
bool ml_fsm_matches(const ml_fsm *a, const void *bytes, size_t n);

#endif
