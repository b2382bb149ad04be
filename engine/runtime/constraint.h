/* Structured outputs in the runtime: a sequence's constraint (JSON mode,
 * grammar/json_mode.h, or a JSON Schema, grammar/grammar.h) behind one
 * interface, and the mask thread that computes the constraints' masks while
 * the step's forward pass runs.
 *
 * A constraint's mask is the set of tokens the next step may draw, in the
 * sample op's bitmask (sample.h): what the grammar allows, plus the
 * request's stop ids exactly when the document is complete (a stop id is
 * a special token, never part of a document; every other special id,
 * <|image|> included, is never allowed). A sequence whose document admits
 * nothing more ends at once with `stop` (ml_constraint_ended): JSON mode as
 * soon as its object is complete, a schema when its mask allows no
 * grammar token (known once that mask is computed). The sample op applies
 * the mask to the penalised logits; logprobs stay those of the
 * unconstrained model (sample.h).
 *
 * The step's hand-off (scheduler.c): for every constrained sequence that
 * samples in a step, ml_masker_queue before the forward pass; the model
 * calls ml_constraint_wait (ml_step_seq.mask_wait) before its sample op;
 * after the pass ml_masker_drain, then the chosen token goes to
 * ml_constraint_accept. A constraint's state and mask are the mask
 * thread's from queue until its mask is ready, the step thread's
 * otherwise; nothing is in flight between steps.
 *
 * @locality: the step loop thread, except ml_constraint_wait (any thread:
 * the tensor-parallel ranks call it too). */
#ifndef ML_RUNTIME_CONSTRAINT_H
#define ML_RUNTIME_CONSTRAINT_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/json_mode.h"
#include "runtime/sampler.h"
#include "status.h"

typedef struct ml_constraint ml_constraint;
typedef struct ml_masker ml_masker;

/* ---- a sequence's constraint ----------------------------------------------- */

/* 1 when p asks for a constraint (json_object or grammar). */
int ml_constraint_wanted(const ml_sampling_params *p);

/* The constraint p asks for, at the start of its document: v (the token
 * trie, borrowed, outliving the constraint) made for n_vocab logits, p's
 * grammar referenced until ml_constraint_destroy, p's stop ids copied.
 * On success *out is owned by the caller. Errors: ML_ERR_INVALID_ARG (p
 * asks for none, or for both), ML_ERR_NOMEM; *out untouched on error. */
ml_status ml_constraint_create(const ml_sampling_params *p, const ml_json_vocab *v,
                               ml_constraint **out, char *err, size_t errlen);

/* No-op on NULL. The constraint must not be queued (ml_masker_drain). */
void ml_constraint_destroy(ml_constraint *c);

/* The mask last computed ((n_vocab + 63) / 64 words, owned by c): valid
 * from ml_constraint_wait's return to the next ml_masker_queue. */
const uint64_t *ml_constraint_mask(const ml_constraint *c);

/* Block until c's queued mask is ready. c is a void * so that it is the
 * model's mask_wait as is. */
void ml_constraint_wait(void *c);

/* Advance by the step's token (a stop id ends the sequence instead: never
 * passed here). Errors: ML_ERR_INVALID_ARG when the grammar refuses it (the
 * sample op drew outside the mask: a broken invariant); c unchanged. */
ml_status ml_constraint_accept(ml_constraint *c, int32_t token, char *err, size_t errlen);

/* 1 when the document admits nothing more, so the sequence ends now with
 * `stop`: JSON mode's object is complete, or the last mask allowed no
 * grammar token. */
int ml_constraint_ended(const ml_constraint *c);

/* ---- the mask thread ------------------------------------------------------- */

/* The thread, with room for `cap` queued constraints (a step's sequences).
 * On success *out is owned by the caller. Errors: ML_ERR_NOMEM (memory, or
 * no thread to be had); *out untouched on error. */
ml_status ml_masker_create(int cap, ml_masker **out, char *err, size_t errlen);

/* Joins the thread. No-op on NULL. Nothing may be queued (drain first). */
void ml_masker_destroy(ml_masker *m);

/* Compute c's next mask on the thread, after those queued before it. At
 * most cap constraints are queued between drains. */
void ml_masker_queue(ml_masker *m, ml_constraint *c);

/* Block until every queued mask is ready. */
void ml_masker_drain(ml_masker *m);

#endif
