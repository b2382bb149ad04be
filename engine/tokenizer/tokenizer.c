/* Lookups on a loaded tokenizer. */
#include "tokenizer/tokenizer_internal.h"

size_t ml_tokenizer_n_ids(const ml_tokenizer *tok) { return tok->n_ids; }

int32_t ml_tokenizer_token_id(const ml_tokenizer *tok, const char *text)
{
    size_t len = strlen(text);
    for (size_t i = 0; i < tok->n_added_all; i++)
        if (tok->added_all[i].len == len && !memcmp(tok->added_all[i].text, text, len))
            return tok->added_all[i].id;
    return len ? ml_vocab_find(tok, (const uint8_t *)text, len) : -1;
}

const char *ml_tokenizer_token_bytes(const ml_tokenizer *tok, int32_t id, size_t *len)
{
    if (id < 0 || (size_t)id >= tok->n_ids || !(tok->tok_flags[id] & ML_TOKF_ASSIGNED))
        return NULL;
    *len = tok->tok_len[id];
    return (const char *)tok->arena + tok->tok_off[id];
}

int ml_tokenizer_is_special(const ml_tokenizer *tok, int32_t id)
{
    return id >= 0 && (size_t)id < tok->n_ids && (tok->tok_flags[id] & ML_TOKF_SPECIAL);
}
