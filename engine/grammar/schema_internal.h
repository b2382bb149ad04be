/* What the JSON Schema compiler's files share; not an API.
 *   schema.c        the entry points, the digest, keywords, $ref;
 *   schema_combine.c the combinators and the merging of keywords;
 *   schema_value.c  the automata of one type: objects, arrays, scalars,
 *                   enum/const values, and the shared "any value" machine;
 *   schema_emit.c   the machines turned into grammar_internal.h's tables.
 * Everything runs on the compiling thread, inside one fsm context whose
 * latched error is the compilation's error. */
#ifndef ML_GRAMMAR_SCHEMA_INTERNAL_H
#define ML_GRAMMAR_SCHEMA_INTERNAL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar/fsm.h"
#include "grammar/grammar.h"

/* Deepest nesting of subschemas (and allOf merges) the compiler follows;
 * deeper is refused, so a hostile schema cannot exhaust the C stack. */
#define SCHEMA_MAX_NESTING 128
/* Longest JSON Pointer kept for messages (longer ones are cut). */
#define SCHEMA_MAX_POINTER 512
/* Nested containers a schema is compiled within when it must be regular
 * (oneOf, not, enum beside values holding calls): "any value" becomes the
 * values nested at most this deep, and the result is cut to documents that
 * shallow, so the complement is exact on them (deeper ones are refused: a
 * narrowing). */
#define SCHEMA_REGULAR_DEPTH 4
/* patternProperties of one object: the keys fall into 2^n regions (which
 * patterns they match), each an automaton. */
#define SCHEMA_MAX_PATTERN_PROPERTIES 4

/* The JSON types, as bits of a type set. Integers are numbers: a set with
 * SCHEMA_T_NUMBER covers them. */
enum {
    SCHEMA_T_NULL = 1u,
    SCHEMA_T_BOOLEAN = 2u,
    SCHEMA_T_INTEGER = 4u,
    SCHEMA_T_NUMBER = 8u,
    SCHEMA_T_STRING = 16u,
    SCHEMA_T_ARRAY = 32u,
    SCHEMA_T_OBJECT = 64u,
    SCHEMA_T_ALL = 127u,
    SCHEMA_T_NONE = 128u, /* "type": [] (or an empty merge): no value */
};

/* A $ref target: compiled once (memo), or, when a reference to it is met
 * while it is being compiled, a machine of its own called by call symbol. */
typedef struct schema_target {
    const cJSON *node; /* borrowed: inside the schema document */
    char *pointer;     /* owned: its JSON Pointer, for messages */
    int machine;       /* -1, or its machine */
    bool in_progress;
    bool memo_any;
    ml_fsm *memo; /* owned: the compiled value (a call when machine >= 0) */
} schema_target;

/* One machine of the grammar (grammar_internal.h): machine 0 the document. */
typedef struct schema_machine {
    ml_fsm *fsm;         /* owned; NULL while its body is being compiled */
    const char *pointer; /* borrowed (a target's pointer, or a literal) */
} schema_machine;

typedef struct schema_compiler {
    ml_fsm_ctx *fc;     /* borrowed: the context; its error is the compile's */
    uint32_t max_states; /* the limits' bound, also on the grammar's total */
    double deadline_ms;  /* the context's (0: none), for a scratch context */
    const cJSON *root;  /* borrowed: the schema document */
    schema_target *targets;
    size_t n_targets, cap_targets;
    schema_machine *machines;
    uint32_t n_machines, cap_machines;
    int any_machine; /* -1 until "any value" is first needed */
    /* 0, or SCHEMA_REGULAR_DEPTH while a schema is compiled regular: "any
     * value" is then any_regular, and a recursive $ref is refused. */
    uint32_t regular_depth;
    ml_fsm *any_regular; /* owned: values nested at most regular_depth deep */
    int nesting;     /* subschemas being compiled, for SCHEMA_MAX_NESTING */
    /* owned, NULL until needed: the values allOf merging replaced, kept
     * until the compilation ends because merged values refer to them */
    cJSON *replaced;
    /* The JSON Pointer of the subschema being compiled (messages). */
    char pointer[SCHEMA_MAX_POINTER];
    size_t pointer_len;
} schema_compiler;

/* ---- schema.c -------------------------------------------------------------- */

/* What a keyword does. */
typedef enum schema_kw_class {
    KW_ANNOTATION, /* no effect on validity: ignored */
    KW_COMPOSE,    /* $ref, allOf, anyOf, oneOf, not, enum, const */
    KW_TYPE,       /* type */
    KW_TYPED,      /* applies to values of one type (schema_value.c) */
    KW_REFUSED,    /* cannot be enforced exactly */
} schema_kw_class;

typedef struct schema_kw {
    const char *name;
    schema_kw_class cls;
    const char *why; /* KW_REFUSED: the reason, for the message */
} schema_kw;

/* The keyword name, or an annotation entry for a name JSON Schema does not
 * define (never NULL). */
const schema_kw *schema_keyword(const char *name);

/* Refuse (latched) what cannot be enforced in node; say whether it has
 * type-specific keywords (*typed), a type (*has_type) and parts to combine
 * (*compose: $ref, allOf, anyOf, oneOf, not, enum, const). */
bool schema_check(schema_compiler *sc, const cJSON *node, bool *typed, bool *has_type,
                  bool *compose);

/* The type set a "type" value names; node's (SCHEMA_T_ALL without one);
 * 0 with the error latched when malformed. */
unsigned schema_type_set(schema_compiler *sc, const cJSON *t);
unsigned schema_types(schema_compiler *sc, const cJSON *node);

/* The node a "#..." reference names, NULL (latched) when it names none or
 * is not a JSON Pointer fragment. */
const cJSON *schema_resolve(schema_compiler *sc, const char *ref);

/* The values of the "$ref" member ref (compiled once per target; a call
 * when the target is recursive). */
ml_fsm *schema_ref_of(schema_compiler *sc, const cJSON *ref, bool *any);


/* The automaton of the values valid under schema node (a JSON Pointer
 * segment already pushed for it), NULL with the error latched. *any is set
 * when the schema admits every JSON value (the result is then a call of
 * the shared machine, which the combinators treat as the identity of
 * intersection). */
ml_fsm *schema_compile(schema_compiler *sc, const cJSON *node, bool *any);

/* schema_compile of node's member key (or of array index i when key is
 * NULL), its pointer segment pushed for the time of the call. */
ml_fsm *schema_compile_at(schema_compiler *sc, const cJSON *node, const char *key, int index,
                          bool *any);

/* The string values valid under node, as quoted JSON strings (*any set,
 * and the result unused, when every string is); for propertyNames. */
ml_fsm *schema_compile_strings(schema_compiler *sc, const cJSON *node, bool *any);

/* Append "/key" (or "/index" when key is NULL) to the current pointer;
 * returns what schema_pointer_pop restores. */
size_t schema_pointer_push(schema_compiler *sc, const char *key, int index);
void schema_pointer_pop(schema_compiler *sc, size_t old);

/* The current pointer for messages ("the root" for the empty one). */
const char *schema_where(const schema_compiler *sc);

/* Latch ML_ERR_UNSUPPORTED (or st) naming keyword at the current pointer;
 * returns NULL so error paths are one line. */
ml_fsm *schema_refuse(schema_compiler *sc, ml_status st, const char *keyword, const char *why);
/* Prefix the latched refusal of a lexeme (a pattern, a format) with the
 * current pointer ("at /properties/s: pattern: ..."). */
void schema_locate(schema_compiler *sc);

/* A new machine slot for pointer (the body set later); -1 when full
 * (latched). */
int schema_machine_new(schema_compiler *sc, const char *pointer);

/* ---- schema_combine.c ------------------------------------------------------ */

/* The parts of node (checked: typed, has_type as schema_check said)
 * intersected; with allow_merge, parts that cannot be intersected (calls)
 * are merged at the keyword level instead, else refused. */
ml_fsm *schema_parts(schema_compiler *sc, const cJSON *node, bool typed, bool has_type,
                     bool allow_merge, bool *any);

/* The intersection of n parts (owned), those flagged in anys (every value)
 * dropped, *any set when all are. When two or more remain and one holds a
 * call they cannot be intersected: *calls is set, every part freed, NULL
 * returned (not latched: the caller decides). */
ml_fsm *schema_conjoin(schema_compiler *sc, ml_fsm **parts, const bool *anys, size_t n,
                       bool *any, bool *calls);

/* The values valid under every one of nodes[0..n) (allOf of them, built
 * without copying them). */
ml_fsm *schema_compile_all(schema_compiler *sc, const cJSON *const *nodes, size_t n, bool *any);

/* The values of node nested at most SCHEMA_REGULAR_DEPTH containers deep,
 * as an automaton without calls (a recursive $ref in it is refused). */
ml_fsm *schema_compile_regular(schema_compiler *sc, const cJSON *node);

/* ---- schema_merge.c -------------------------------------------------------- */

/* Merge src's keywords into m (m refers to src's subschemas, never copies
 * them). $ref and allOf are inlined; properties merged per name. false
 * with the error latched (a keyword given twice with different values,
 * nesting too deep, memory). */
bool schema_merge_into(schema_compiler *sc, cJSON *m, const cJSON *src, int depth);

/* A node standing for v without copying it: a reference to its members
 * or items (a copy for a scalar). NULL when out of memory. */
cJSON *schema_alias(const cJSON *v);

/* Latch "out of memory" on the compiler; false. */
bool schema_nomem(schema_compiler *sc);

/* ---- schema_value.c -------------------------------------------------------- */

/* Refuse (latched), before any automaton is built, an unknown format that
 * compiling root would end with: the first thing compiling may refuse, in
 * its order, when every schema before it is one that refuses nothing (a
 * scalar type with annotations; a string with a format; an array with
 * items; an object with properties, required and a boolean
 * additionalProperties). Compiling such a schema costs the automata of the
 * members before the refusal; anything else is left to compiling. */
void schema_refuse_early(schema_compiler *sc, const cJSON *root);

/* Whitespace between tokens: [ \t\n\r]*. */
ml_fsm *schema_gap(ml_fsm_ctx *fc);

/* A call of the shared "any JSON value" machine (built on first use); while
 * compiling regular (regular_depth), a copy of any_regular instead. */
ml_fsm *schema_any(schema_compiler *sc);

/* The values of the types in types under node's type-specific keywords
 * (an object's properties, an array's items, a string's length...). */
ml_fsm *schema_typed(schema_compiler *sc, const cJSON *node, unsigned types);

/* The JSON text of one value equal to v (enum and const): objects in their
 * member order with gaps, numbers in one canonical form, strings in
 * lexemes.h's one form. */
ml_fsm *schema_literal(schema_compiler *sc, const cJSON *v);

/* The one form of a string's content (lexemes.h) in a new NUL-terminated
 * buffer (owned by the caller), *n its length; NULL when out of memory. */
char *schema_string_form(const char *utf8, size_t *n);

/* The building blocks of value automata, shared with schema_object.c. */
/* cat(fc, a, b, ...): the concatenation of the automata given (owned), in
 * one construction. */
#define cat(fc, ...)                                          \
    ml_fsm_concat_n((fc), (ml_fsm *const[]){__VA_ARGS__},     \
                    sizeof((ml_fsm *const[]){__VA_ARGS__}) / sizeof(ml_fsm *))
/* alt(fc, a, b, ...): the union of the automata given (owned), in one
 * construction. */
#define alt(fc, ...)                                          \
    ml_fsm_union_n((fc), (ml_fsm *const[]){__VA_ARGS__},      \
                   sizeof((ml_fsm *const[]){__VA_ARGS__}) / sizeof(ml_fsm *))
/* The literal bytes of s. */
ml_fsm *schema_lit(ml_fsm_ctx *fc, const char *s);
/* "," then a gap. */
ml_fsm *schema_comma(ml_fsm_ctx *fc);
/* key gap ":" gap value gap: one member, its trailing gap included. */
ml_fsm *schema_member(ml_fsm_ctx *fc, ml_fsm *key, ml_fsm *value);
/* A copy of a, or NULL for NULL. */
ml_fsm *schema_copy(ml_fsm_ctx *fc, const ml_fsm *a);
/* `"` name `"`: a key equal to name. */
ml_fsm *schema_key_of(schema_compiler *sc, const char *name);
/* 1 when a (a quoted-string automaton) accepts the key name. */
bool schema_key_matches(schema_compiler *sc, const ml_fsm *a, const char *name);
/* Any JSON string. */
ml_fsm *schema_any_string(ml_fsm_ctx *fc);
/* Quoted keys of printable ASCII only (schema_value.c says why). */
ml_fsm *schema_ascii_key(ml_fsm_ctx *fc);
/* 1 when s is printable ASCII only. */
bool schema_ascii_printable(const char *s);

/* ---- schema_object.c ------------------------------------------------------- */

/* The values of an object schema: node's properties, required,
 * patternProperties, additionalProperties and propertyNames. */
ml_fsm *schema_object(schema_compiler *sc, const cJSON *node);

/* ---- schema_emit.c --------------------------------------------------------- */

/* The grammar tables of the compiler's machines (machine 0 the document),
 * checked against grammar_internal.h's guarantees. NULL with the error
 * latched (a guarantee a schema breaks is refused, naming the machine). */
ml_grammar *schema_emit(schema_compiler *sc);

#endif
