/* The representation of fsm.h's automata, shared by fsm.c (context, atoms,
 * trimming), fsm_min.c (minimisation), fsm_ops.c (composition) and
 * lexemes_number.c (the residue automata of multipleOf, built state by
 * state). Not for use outside ml_grammar.
 *
 * An automaton is stored compressed: the edges of state s are
 * edges[first[s] .. first[s + 1]), sorted by lo and disjoint. While one is
 * being built, its states are filled in order: fsm_open(s) then the edges of
 * s, then the next state; fsm_seal closes the last one. */
#ifndef ML_GRAMMAR_FSM_INTERNAL_H
#define ML_GRAMMAR_FSM_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar/fsm.h"

#define FSM_ERROR_LEN 256
#define FSM_NONE UINT32_MAX
/* The memory bound beside the state bound: the subsets of a subset
 * construction (NFA states, summed) and the labelled transitions of a
 * minimisation stay under this many words per state of the bound. A byte
 * automaton has at most 257 labels per state; typical ones have a few. */
#define FSM_WORDS_PER_STATE 256u

struct ml_fsm_ctx {
    uint32_t max_states;
    double deadline_ms; /* 0: none */
    uint32_t ticks;     /* work units since the clock was last read */
    ml_status status;
    char error[FSM_ERROR_LEN];
};

struct ml_fsm {
    uint32_t n_states, cap_states;
    uint8_t *accept; /* (n_states) 0/1 */
    uint8_t *tags;   /* (n_states) */
    uint32_t *first; /* (n_states + 1) */
    uint32_t n_open; /* states whose edges are filled or being filled */
    ml_fsm_edge *edges;
    size_t n_edges, cap_edges;
};

/* An empty automaton (no states) to fill; NULL (latched) when out of memory. */
ml_fsm *fsm_alloc(ml_fsm_ctx *c);

/* Append a state; its index, or FSM_NONE with the error latched (memory or
 * the context's state bound). */
uint32_t fsm_add_state(ml_fsm_ctx *c, ml_fsm *a, bool accept, uint8_t tags);

/* Start filling the edges of s (states are filled in increasing order). */
void fsm_open(ml_fsm *a, uint32_t s);

/* Append [lo, hi] -> to to the state being filled (above the previous edge's
 * hi), merged with the previous edge when it continues it. False (latched)
 * when out of memory. */
bool fsm_add_edge(ml_fsm_ctx *c, ml_fsm *a, uint32_t lo, uint32_t hi, uint32_t to);

/* Close the states not yet opened (no edges) and the last one. */
void fsm_seal(ml_fsm *a);

/* The trimmed, minimal, canonically numbered (breadth first from the start,
 * edges in symbol order) automaton of a's language. Takes ownership of a. */
ml_fsm *fsm_finish(ml_fsm_ctx *c, ml_fsm *a);

/* The classes of the live states of a (live[s] set) under language and
 * tag equivalence, numbered below n_states, into cls (n_states; entries of
 * dead states undefined). False (latched) on memory or deadline. */
bool fsm_classes(ml_fsm_ctx *c, const ml_fsm *a, const uint8_t *live, uint32_t *cls);

/* Count one unit of work; false (latched ML_ERR_TOO_LARGE) past the
 * context's deadline, or when the context already failed. */
bool fsm_tick(ml_fsm_ctx *c);

/* Latch ML_ERR_NOMEM and return NULL, for allocation failures. */
void *fsm_nomem(ml_fsm_ctx *c);

/* A set of uint32 sequences numbered in insertion order: the subsets of a
 * subset construction, the pairs of a product, the signatures of a
 * minimisation round. */
typedef struct fsm_seqset {
    uint32_t *pool; /* the sequences back to back */
    size_t pool_len, pool_cap;
    size_t *offs; /* (n + 1) start of sequence i in pool */
    uint32_t n, cap;
    uint32_t *slots; /* (n_slots) id + 1, 0 when free */
    uint32_t n_slots;
} fsm_seqset;

void fsm_seqset_deinit(fsm_seqset *s);
/* Empty the set, keeping its memory. */
void fsm_seqset_clear(fsm_seqset *s);
/* The id of seq[0, len) (added when new: *added set). FSM_NONE (latched)
 * when out of memory. */
uint32_t fsm_seqset_put(ml_fsm_ctx *c, fsm_seqset *s, const uint32_t *seq, uint32_t len,
                        bool *added);
/* Sequence id: *len elements at the returned pointer (valid until the next put). */
const uint32_t *fsm_seqset_get(const fsm_seqset *s, uint32_t id, uint32_t *len);

#endif
