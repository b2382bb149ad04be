/* Loading tokenizer.json into the compact tables of struct ml_tokenizer.
 *
 * The file (9 MB for Llama 3) is parsed once with cJSON; everything the
 * encoder touches afterwards is flat arrays and two open-addressing hash
 * maps: vocabulary bytes -> id, and (left id, right id) -> (rank, merged id). */
#include <assert.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/unicode.h"

/* The pre-tokenizer pattern pretokenize.c implements, as tokenizer.json
 * spells it for Llama 3. */
static const char LLAMA3_SPLIT_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char IMAGE_TOKEN[] = "<|image|>";

#define MAX_FILE_BYTES (1ull << 30)
#define MAX_IDS (1u << 24)        /* far above any real vocabulary; bounds hostile ids */
#define MIN_HASH_SLOTS 16
#define MAX_LOAD_PERCENT 70       /* open-addressing fill limit */
/* GPT-2's byte-level alphabet: 256 printable code points below U+0144. */
#define BYTE_LEVEL_CP_END 0x144
#define BYTE_LEVEL_SHIFTED_BASE 0x100
#define BYTE_LEVEL_MAX_UTF8 2 /* UTF-8 bytes of one alphabet character */

/* ---- byte-level alphabet ---------------------------------------------------- */

/* GPT-2's bytes_to_unicode, inverted: printable Latin-1 bytes (0x21-0x7E,
 * 0xA1-0xAC, 0xAE-0xFF) stand for themselves; the other 68 bytes are
 * U+0100, U+0101, ... in byte order. Entries not in the alphabet are -1. */
static void byte_level_inverse(int16_t cp_to_byte[BYTE_LEVEL_CP_END])
{
    for (int cp = 0; cp < BYTE_LEVEL_CP_END; cp++)
        cp_to_byte[cp] = -1;
    int shifted = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        cp_to_byte[printable ? b : BYTE_LEVEL_SHIFTED_BASE + shifted++] = (int16_t)b;
    }
}

/* Raw bytes a byte-level token string stands for, into out (room for slen
 * bytes: each character is at least one UTF-8 byte). Returns false, with out
 * unspecified, when a character is outside the alphabet. */
static bool byte_level_decode(const int16_t *cp_to_byte, const char *s, size_t slen, uint8_t *out,
                              size_t *n)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0, o = 0;
    while (i < slen) {
        uint32_t cp;
        size_t len;
        if (ml_utf8_scan(p + i, slen - i, &cp, &len) != ML_UTF8_OK || cp >= BYTE_LEVEL_CP_END ||
            cp_to_byte[cp] < 0)
            return false;
        out[o++] = (uint8_t)cp_to_byte[cp];
        i += len;
    }
    *n = o;
    return true;
}

/* ---- JSON helpers --------------------------------------------------------- */

typedef struct loader {
    const char *name; /* for messages */
    char *err;
    size_t errlen;
    int16_t cp_to_byte[BYTE_LEVEL_CP_END];
    ml_tokenizer *tok;
    size_t arena_used;
    size_t arena_cap;
    uint8_t *scratch; /* owned: room for two decoded merge pieces */
} loader;

static const char *str_field(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* *out = the boolean obj[key], or dflt when absent or null. */
static ml_status bool_field(loader *ld, const cJSON *obj, const char *where, const char *key,
                            bool dflt, bool *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return ML_OK;
    }
    if (!cJSON_IsBool(v))
        return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT, "%s: %s.%s is not a boolean", ld->name,
                       where, key);
    *out = cJSON_IsTrue(v);
    return ML_OK;
}

/* A JSON number that is an integer in [0, MAX_IDS). */
static ml_status id_value(loader *ld, const cJSON *v, const char *where, const char *what,
                          int32_t *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
        v->valuedouble >= MAX_IDS)
        return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT,
                       "%s: %s: id of '%.64s' is not an integer in [0, %u)", ld->name, where, what,
                       MAX_IDS);
    *out = (int32_t)v->valuedouble;
    return ML_OK;
}

static ml_status unsupported(loader *ld, const char *what)
{
    return ml_fail(ld->err, ld->errlen, ML_ERR_UNSUPPORTED,
                   "%s: %s (only the Llama 3 byte-level BPE layout is implemented)", ld->name,
                   what);
}

/* ---- pipeline components ---------------------------------------------------- */

/* normalizer, pre_tokenizer and decoder must be the ones this module
 * reproduces; the post_processor is never applied (no BOS on encode). */
static ml_status check_components(loader *ld, const cJSON *root)
{
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm))
        return unsupported(ld, "a normalizer is set");

    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
    const char *type = str_field(pre, "type");
    if (!type || strcmp(type, "Sequence") || !cJSON_IsArray(steps) ||
        cJSON_GetArraySize(steps) != 2)
        return unsupported(ld, "pre_tokenizer is not a Sequence of Split and ByteLevel");
    const cJSON *split = cJSON_GetArrayItem(steps, 0);
    const cJSON *bytelevel = cJSON_GetArrayItem(steps, 1);
    const char *split_type = str_field(split, "type");
    const char *pattern = str_field(cJSON_GetObjectItemCaseSensitive(split, "pattern"), "Regex");
    const char *behavior = str_field(split, "behavior");
    bool invert = false, prefix_space = false, use_regex = false;
    ml_status st;
    if ((st = bool_field(ld, split, "pre_tokenizer.Split", "invert", false, &invert)) != ML_OK)
        return st;
    if (!split_type || strcmp(split_type, "Split") || !pattern ||
        strcmp(pattern, LLAMA3_SPLIT_PATTERN) || !behavior || strcmp(behavior, "Isolated") ||
        invert)
        return unsupported(ld, "pre_tokenizer Split is not the Llama 3 pattern, Isolated");
    const char *bl_type = str_field(bytelevel, "type");
    if ((st = bool_field(ld, bytelevel, "pre_tokenizer.ByteLevel", "add_prefix_space", true,
                         &prefix_space)) != ML_OK ||
        (st = bool_field(ld, bytelevel, "pre_tokenizer.ByteLevel", "use_regex", true,
                         &use_regex)) != ML_OK)
        return st;
    if (!bl_type || strcmp(bl_type, "ByteLevel") || prefix_space || use_regex)
        return unsupported(ld, "second pre-tokenizer is not ByteLevel without prefix space and "
                               "regex");

    const char *dec_type = str_field(cJSON_GetObjectItemCaseSensitive(root, "decoder"), "type");
    if (!dec_type || strcmp(dec_type, "ByteLevel"))
        return unsupported(ld, "decoder is not ByteLevel");
    return ML_OK;
}

static ml_status check_model_options(loader *ld, const cJSON *model, bool *ignore_merges)
{
    const char *type = str_field(model, "type");
    if (type && strcmp(type, "BPE"))
        return unsupported(ld, "model.type is not BPE");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout))
        return unsupported(ld, "model.dropout is set");
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < sizeof affixes / sizeof affixes[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, affixes[i]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && v->valuestring[0] == '\0'))
            return unsupported(ld, "model has a subword prefix or suffix");
    }
    bool byte_fallback = false;
    ml_status st = bool_field(ld, model, "model", "byte_fallback", false, &byte_fallback);
    if (st != ML_OK)
        return st;
    if (byte_fallback)
        return unsupported(ld, "model.byte_fallback is set");
    return bool_field(ld, model, "model", "ignore_merges", false, ignore_merges);
}

/* ---- tables ----------------------------------------------------------------- */

static size_t hash_slots_for(size_t count)
{
    size_t n = MIN_HASH_SLOTS;
    while (n * MAX_LOAD_PERCENT < count * 100)
        n <<= 1;
    return n;
}

/* Reserve len arena bytes. The arena was sized by measure(), so running out
 * is a bug, not an input error. */
static uint8_t *arena_take(loader *ld, size_t len)
{
    assert(len <= ld->arena_cap - ld->arena_used);
    uint8_t *p = ld->tok->arena + ld->arena_used;
    ld->arena_used += len;
    return p;
}

static void assign_id(ml_tokenizer *tok, int32_t id, const uint8_t *bytes, size_t len,
                      uint8_t flags)
{
    tok->tok_off[id] = (uint32_t)(bytes - tok->arena);
    tok->tok_len[id] = (uint32_t)len;
    tok->tok_flags[id] = flags;
    if (len > tok->max_token_len)
        tok->max_token_len = len;
}

static ml_status load_vocab(loader *ld, const cJSON *vocab)
{
    ml_tokenizer *tok = ld->tok;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id = 0;
        ml_status st = id_value(ld, e, "model.vocab", e->string, &id);
        if (st != ML_OK)
            return st;
        if (tok->tok_flags[id] & ML_TOKF_ASSIGNED)
            return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT,
                           "%s: model.vocab: id %d is given to two tokens (second: '%.64s')",
                           ld->name, (int)id, e->string);
        size_t slen = strlen(e->string), n;
        uint8_t *bytes = arena_take(ld, slen);
        if (!byte_level_decode(ld->cp_to_byte, e->string, slen, bytes, &n)) {
            /* Outside the byte-level alphabet: BPE can never produce it; it
             * decodes to its own UTF-8 text, as in HF's ByteLevel decoder. */
            memcpy(bytes, e->string, slen);
            assign_id(tok, id, bytes, slen, ML_TOKF_ASSIGNED);
            continue;
        }
        ld->arena_used -= slen - n;
        assign_id(tok, id, bytes, n, ML_TOKF_ASSIGNED);
        int32_t other = ml_vocab_find(tok, bytes, n);
        if (other >= 0)
            return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT,
                           "%s: model.vocab: '%.64s' appears twice (ids %d and %d)", ld->name,
                           e->string, (int)other, (int)id);
        uint64_t h = ml_tok_hash(bytes, n);
        size_t i = (size_t)h & tok->vocab_mask;
        while (tok->vocab_slots[i].id >= 0)
            i = (i + 1) & tok->vocab_mask;
        tok->vocab_slots[i] = (ml_vocab_slot){.id = id, .hash = (uint32_t)(h >> 32),
                                              .off = tok->tok_off[id], .len = (uint32_t)n};
    }
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        tok->byte_id[b] = ml_vocab_find(tok, &byte, 1);
        if (tok->byte_id[b] < 0)
            return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT,
                           "%s: model.vocab lacks the byte-level token of byte 0x%02X", ld->name,
                           b);
    }
    return ML_OK;
}

/* The two halves of merge number `rank`: "left right" or ["left", "right"]. */
static ml_status merge_halves(loader *ld, const cJSON *m, size_t rank, const char **left,
                              size_t *left_len, const char **right, size_t *right_len)
{
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring;
        const char *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT,
                           "%s: model.merges[%zu]: '%.64s' is not two tokens separated by one "
                           "space",
                           ld->name, rank, s);
        *left = s;
        *left_len = (size_t)(sp - s);
        *right = sp + 1;
        *right_len = strlen(sp + 1);
        return ML_OK;
    }
    const cJSON *a = cJSON_GetArrayItem(m, 0), *b = cJSON_GetArrayItem(m, 1);
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) != 2 || !cJSON_IsString(a) ||
        !cJSON_IsString(b))
        return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT,
                       "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", ld->name,
                       rank);
    *left = a->valuestring;
    *left_len = strlen(a->valuestring);
    *right = b->valuestring;
    *right_len = strlen(b->valuestring);
    return ML_OK;
}

static ml_status load_merges(loader *ld, const cJSON *merges)
{
    ml_tokenizer *tok = ld->tok;
    size_t rank = 0;
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        const char *left = NULL, *right = NULL;
        size_t left_len = 0, right_len = 0, ln, rn;
        ml_status st = merge_halves(ld, m, rank, &left, &left_len, &right, &right_len);
        if (st != ML_OK)
            return st;
        /* Both halves decode into scratch back to back, so the merged token
         * is scratch[0 .. ln + rn). Longer strings than any vocabulary
         * token's cannot be in the vocabulary (and would not fit). */
        int32_t lid = -1, rid = -1, mid = -1;
        size_t max_str = tok->max_token_len * BYTE_LEVEL_MAX_UTF8;
        if (left_len <= max_str && right_len <= max_str &&
            byte_level_decode(ld->cp_to_byte, left, left_len, ld->scratch, &ln) &&
            byte_level_decode(ld->cp_to_byte, right, right_len, ld->scratch + ln, &rn)) {
            lid = ml_vocab_find(tok, ld->scratch, ln);
            rid = ml_vocab_find(tok, ld->scratch + ln, rn);
            mid = ml_vocab_find(tok, ld->scratch, ln + rn);
        }
        if (lid < 0 || rid < 0 || mid < 0)
            return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT,
                           "%s: model.merges[%zu]: '%.*s' + '%.*s' or their concatenation is "
                           "not in the vocabulary",
                           ld->name, rank, (int)(left_len > 64 ? 64 : left_len), left,
                           (int)(right_len > 64 ? 64 : right_len), right);
        /* A repeated pair keeps its last rank, as the HashMap HF collects into. */
        uint64_t key = (uint64_t)(uint32_t)lid << 32 | (uint32_t)rid;
        size_t i = (size_t)ml_merge_hash(key) & tok->merge_mask;
        while (tok->merge_slots[i].key != ML_MERGE_EMPTY && tok->merge_slots[i].key != key)
            i = (i + 1) & tok->merge_mask;
        tok->merge_slots[i] = (ml_merge_slot){.key = key, .rank = (uint32_t)rank, .merged = mid};
    }
    return ML_OK;
}

static int added_cmp(const void *pa, const void *pb)
{
    const ml_added_token *a = pa, *b = pb;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->text, b->text, n);
    if (c)
        return c;
    return (a->len > b->len) - (a->len < b->len);
}

/* Record one added token: its id decodes to the byte-level reading of its
 * content when every character is in the alphabet (HF's ByteLevel decoder
 * does the same), else to the content itself. An added token may reuse a
 * vocabulary id only if it decodes to the same bytes: the vocabulary map
 * keys on those bytes. */
static ml_status add_token(loader *ld, int32_t id, const char *content, bool special)
{
    ml_tokenizer *tok = ld->tok;
    size_t clen = strlen(content), n;
    uint8_t *text = arena_take(ld, clen);
    memcpy(text, content, clen);
    uint8_t *bytes = arena_take(ld, clen);
    if (!byte_level_decode(ld->cp_to_byte, content, clen, bytes, &n)) {
        memcpy(bytes, content, clen);
        n = clen;
    }
    if ((tok->tok_flags[id] & ML_TOKF_ASSIGNED) &&
        (tok->tok_len[id] != n || memcmp(tok->arena + tok->tok_off[id], bytes, n)))
        return unsupported(ld, "an added token reuses a vocabulary id with other text");
    uint8_t flags = ML_TOKF_ASSIGNED | ML_TOKF_ADDED | (special ? ML_TOKF_SPECIAL : 0);
    assign_id(tok, id, bytes, n, flags);
    tok->added_all[tok->n_added_all++] = (ml_added_token){.text = text, .len = (uint32_t)clen,
                                                          .id = id};
    if (!special)
        tok->added_plain[tok->n_added_plain++] = tok->added_all[tok->n_added_all - 1];
    tok->added_first[text[0]] |= ML_ADDED_FIRST_ANY | (special ? 0 : ML_ADDED_FIRST_PLAIN);
    return ML_OK;
}

static ml_status load_added(loader *ld, const cJSON *added)
{
    ml_tokenizer *tok = ld->tok;
    size_t idx = 0;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next, idx++) {
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%zu]", idx);
        const char *content = str_field(a, "content");
        if (!content || !content[0])
            return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT, "%s: %s has no content",
                           ld->name, where);
        int32_t id = 0;
        ml_status st = id_value(ld, cJSON_GetObjectItemCaseSensitive(a, "id"), where, content, &id);
        if (st != ML_OK)
            return st;
        bool special = false, lstrip = false, rstrip = false;
        bool single_word = false, normalized = false;
        if ((st = bool_field(ld, a, where, "special", false, &special)) != ML_OK ||
            (st = bool_field(ld, a, where, "lstrip", false, &lstrip)) != ML_OK ||
            (st = bool_field(ld, a, where, "rstrip", false, &rstrip)) != ML_OK ||
            (st = bool_field(ld, a, where, "single_word", false, &single_word)) != ML_OK ||
            (st = bool_field(ld, a, where, "normalized", !special, &normalized)) != ML_OK)
            return st;
        if (lstrip || rstrip || single_word || normalized)
            return unsupported(ld, "an added token sets lstrip, rstrip, single_word or "
                                   "normalized");
        if (tok->tok_flags[id] & ML_TOKF_ADDED)
            return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT,
                           "%s: %s: id %d is given to two added tokens", ld->name, where, (int)id);
        if ((st = add_token(ld, id, content, special)) != ML_OK)
            return st;
    }
    return ML_OK;
}

/* Sort the added tokens for matching and reject duplicate contents. */
static ml_status index_added(loader *ld)
{
    ml_tokenizer *tok = ld->tok;
    qsort(tok->added_all, tok->n_added_all, sizeof *tok->added_all, added_cmp);
    qsort(tok->added_plain, tok->n_added_plain, sizeof *tok->added_plain, added_cmp);
    for (size_t i = 1; i < tok->n_added_all; i++)
        if (!added_cmp(&tok->added_all[i - 1], &tok->added_all[i]))
            return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT,
                           "%s: added_tokens: '%.64s' appears twice", ld->name,
                           (const char *)tok->added_all[i].text);
    return ML_OK;
}

/* ---- entry points ------------------------------------------------------------ */

static bool has_added_content(const cJSON *added, const char *content)
{
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        const char *c = str_field(a, "content");
        if (c && !strcmp(c, content))
            return true;
    }
    return false;
}

/* Sizes the tables need, from a first pass over the JSON. */
typedef struct table_sizes {
    size_t n_ids, n_vocab, n_added, n_merges, arena;
} table_sizes;

static ml_status measure(loader *ld, const cJSON *vocab, const cJSON *added, const cJSON *merges,
                         bool add_image, table_sizes *sz)
{
    memset(sz, 0, sizeof *sz);
    int32_t max_id = -1;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id = 0;
        ml_status st = id_value(ld, e, "model.vocab", e->string, &id);
        if (st != ML_OK)
            return st;
        max_id = id > max_id ? id : max_id;
        sz->arena += strlen(e->string);
        sz->n_vocab++;
    }
    size_t idx = 0;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next, idx++) {
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%zu]", idx);
        if (!cJSON_IsObject(a))
            return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT, "%s: %s is not an object",
                           ld->name, where);
        const char *content = str_field(a, "content");
        int32_t id = 0;
        ml_status st = id_value(ld, cJSON_GetObjectItemCaseSensitive(a, "id"), where,
                                content ? content : "", &id);
        if (st != ML_OK)
            return st;
        max_id = id > max_id ? id : max_id;
        sz->arena += content ? 2 * strlen(content) : 0; /* match text + decode bytes */
        sz->n_added++;
    }
    if (max_id < 0)
        return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT, "%s: model.vocab is empty", ld->name);
    if (add_image) {
        if ((uint32_t)max_id + 1 >= MAX_IDS)
            return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT, "%s: no free id for %s", ld->name,
                           IMAGE_TOKEN);
        max_id++;
        sz->arena += 2 * strlen(IMAGE_TOKEN);
        sz->n_added++;
    }
    sz->n_ids = (size_t)max_id + 1;
    sz->n_merges = (size_t)cJSON_GetArraySize(merges);
    return ML_OK;
}

static ml_status allocate(loader *ld, const table_sizes *sz)
{
    ml_tokenizer *tok = ld->tok;
    tok->n_ids = sz->n_ids;
    tok->tok_off = calloc(sz->n_ids, sizeof *tok->tok_off);
    tok->tok_len = calloc(sz->n_ids, sizeof *tok->tok_len);
    tok->tok_flags = calloc(sz->n_ids, sizeof *tok->tok_flags);
    tok->arena = malloc(sz->arena ? sz->arena : 1);
    ld->arena_cap = sz->arena;
    tok->vocab_mask = hash_slots_for(sz->n_vocab) - 1;
    tok->vocab_slots = malloc((tok->vocab_mask + 1) * sizeof *tok->vocab_slots);
    tok->merge_mask = hash_slots_for(sz->n_merges) - 1;
    tok->merge_slots = malloc((tok->merge_mask + 1) * sizeof *tok->merge_slots);
    tok->added_all = calloc(sz->n_added ? sz->n_added : 1, sizeof *tok->added_all);
    tok->added_plain = calloc(sz->n_added ? sz->n_added : 1, sizeof *tok->added_plain);
    if (!tok->tok_off || !tok->tok_len || !tok->tok_flags || !tok->arena || !tok->vocab_slots ||
        !tok->merge_slots || !tok->added_all || !tok->added_plain)
        return ml_fail(ld->err, ld->errlen, ML_ERR_NOMEM, "%s: out of memory for tables",
                       ld->name);
    for (size_t i = 0; i <= tok->vocab_mask; i++)
        tok->vocab_slots[i].id = -1;
    for (size_t i = 0; i <= tok->merge_mask; i++)
        tok->merge_slots[i].key = ML_MERGE_EMPTY;
    return ML_OK;
}

static ml_status build(loader *ld, const cJSON *root)
{
    if (!cJSON_IsObject(root))
        return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT, "%s: top level is not an object",
                       ld->name);
    ml_status st = check_components(ld, root);
    if (st != ML_OK)
        return st;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT,
                       "%s: model.vocab (object) or model.merges (array) missing", ld->name);
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added))
        return ml_fail(ld->err, ld->errlen, ML_ERR_FORMAT, "%s: added_tokens is not an array",
                       ld->name);
    bool ignore_merges = false;
    if ((st = check_model_options(ld, model, &ignore_merges)) != ML_OK)
        return st;
    ld->tok->ignore_merges = ignore_merges;

    bool add_image = !has_added_content(added, IMAGE_TOKEN);
    table_sizes sz;
    if ((st = measure(ld, vocab, added, merges, add_image, &sz)) != ML_OK ||
        (st = allocate(ld, &sz)) != ML_OK || (st = load_vocab(ld, vocab)) != ML_OK)
        return st;
    ld->scratch = malloc(2 * ld->tok->max_token_len * BYTE_LEVEL_MAX_UTF8 + 1);
    if (!ld->scratch)
        return ml_fail(ld->err, ld->errlen, ML_ERR_NOMEM, "%s: out of memory", ld->name);
    if ((st = load_merges(ld, merges)) != ML_OK || (st = load_added(ld, added)) != ML_OK)
        return st;
    if (add_image && (st = add_token(ld, (int32_t)sz.n_ids - 1, IMAGE_TOKEN, true)) != ML_OK)
        return st;
    return index_added(ld);
}

ml_status ml_tokenizer_load_buffer(const char *json, size_t len, const char *name,
                                   ml_tokenizer **out, char *err, size_t errlen)
{
    if (!json || !out)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "tokenizer: NULL argument");
    loader ld = {.name = name ? name : "tokenizer.json", .err = err, .errlen = errlen};
    byte_level_inverse(ld.cp_to_byte);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t at = end && end >= json ? (size_t)(end - json) : 0;
        return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: JSON syntax error near byte %zu",
                       ld.name, at);
    }
    ld.tok = calloc(1, sizeof *ld.tok);
    ml_status st = ld.tok ? build(&ld, root)
                          : ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", ld.name);
    cJSON_Delete(root);
    free(ld.scratch);
    if (st != ML_OK) {
        ml_tokenizer_destroy(ld.tok);
        return st;
    }
    *out = ld.tok;
    return ML_OK;
}

ml_status ml_tokenizer_load(const char *path, ml_tokenizer **out, char *err, size_t errlen)
{
    if (!path || !out)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "tokenizer: NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f)
        return ml_fail(err, errlen, ML_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return ml_fail(err, errlen, ML_ERR_IO, "%s: not a regular file", path);
    }
    if ((unsigned long long)sb.st_size > MAX_FILE_BYTES) {
        fclose(f);
        return ml_fail(err, errlen, ML_ERR_TOO_LARGE, "%s: %lld bytes, limit %llu", path,
                       (long long)sb.st_size, MAX_FILE_BYTES);
    }
    size_t size = (size_t)sb.st_size;
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        fclose(f);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, size);
    }
    size_t got = fread(buf, 1, size, f);
    int read_error = ferror(f);
    fclose(f);
    if (got != size || read_error) {
        free(buf);
        return ml_fail(err, errlen, ML_ERR_IO, "%s: short read (%zu of %zu bytes)", path, got,
                       size);
    }
    ml_status st = ml_tokenizer_load_buffer(buf, size, path, out, err, errlen);
    free(buf);
    return st;
}

void ml_tokenizer_destroy(ml_tokenizer *tok)
{
    if (!tok)
        return;
    free(tok->tok_off);
    free(tok->tok_len);
    free(tok->tok_flags);
    free(tok->arena);
    free(tok->vocab_slots);
    free(tok->merge_slots);
    free(tok->added_all);
    free(tok->added_plain);
    free(tok);
}
