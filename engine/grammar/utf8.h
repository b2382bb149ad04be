/* UTF-8 for the grammar compiler (fsm_ops.c, regex.c, lexemes.c): the
 * shortest forms of Unicode scalar values, nothing else.
 * @locality any thread. */
#ifndef ML_GRAMMAR_UTF8_H
#define ML_GRAMMAR_UTF8_H

#include <stddef.h>
#include <stdint.h>

#define ML_UTF8_MAX_BYTES 4
#define ML_UTF8_MAX_CP 0x10FFFFu
#define ML_UTF8_SURROGATE_LO 0xD800u
#define ML_UTF8_SURROGATE_HI 0xDFFFu

/* The UTF-8 form of cp (a scalar value) into out; its length. */
static inline size_t ml_utf8_encode(uint32_t cp, uint8_t out[ML_UTF8_MAX_BYTES])
{
    static const uint8_t lead[] = {0, 0, 0xC0, 0xE0, 0xF0};
    size_t n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (n == 1) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    for (size_t i = n - 1; i > 0; i--, cp >>= 6)
        out[i] = (uint8_t)(0x80 | (cp & 0x3F));
    out[0] = (uint8_t)(lead[n] | cp);
    return n;
}

/* The scalar value at p[*i] (i < n), *i moved past it; -1 (*i moved
 * somewhere past the first byte) when the bytes there are not the shortest
 * form of one: overlong, a surrogate, past U+10FFFF, truncated. */
static inline int32_t ml_utf8_decode(const uint8_t *p, size_t n, size_t *i)
{
    static const uint32_t min_of_len[] = {0, 0, 0x80, 0x800, 0x10000};
    uint8_t b = p[(*i)++];
    int len = b < 0x80                 ? 1
              : b >= 0xC2 && b <= 0xDF ? 2
              : b >= 0xE0 && b <= 0xEF ? 3
              : b >= 0xF0 && b <= 0xF4 ? 4
                                       : 0;
    if (len == 0)
        return -1;
    uint32_t v = len == 1 ? b : b & (0x3Fu >> (len - 1));
    for (int k = 1; k < len; k++) {
        if (*i >= n || (p[*i] & 0xC0) != 0x80)
            return -1;
        v = v << 6 | (p[(*i)++] & 0x3F);
    }
    if (v < min_of_len[len] || v > ML_UTF8_MAX_CP ||
        (v >= ML_UTF8_SURROGATE_LO && v <= ML_UTF8_SURROGATE_HI))
        return -1;
    return (int32_t)v;
}

#endif
