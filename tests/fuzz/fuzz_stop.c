/* Fuzz target: the streaming stop-string matcher against a brute-force
 * search of the whole text. Input layout:
 *   byte 0: bits 0-2 the number of stop strings, bit 3 "small alphabet"
 *           (every byte mapped onto 'a'..'c', so overlaps are frequent);
 *   per stop string: a length byte (1 + b % 12), then its bytes;
 *   then pieces until the end: a length byte (b % 24), then its bytes.
 * Properties, checked with abort():
 *   - released text + the matched stop string is a prefix of the input, and
 *     the match is the earliest-ending occurrence (longest on a tie);
 *   - without a match, released text after flush is the whole input;
 *   - the released text never contains a stop string;
 *   - while running, at most the longest stop string - 1 bytes are held. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/stop.h"

#define FUZZ_MAX_STOPS 7
#define FUZZ_MAX_STOP_LEN 12
#define FUZZ_MAX_PIECE 24
#define FUZZ_SMALL_ALPHABET 0x08u

static void require(bool ok)
{
    if (!ok)
        abort();
}

static uint8_t map_byte(uint8_t b, bool small)
{
    return small ? (uint8_t)('a' + b % 3) : b;
}

/* Earliest-ending occurrence in text[0, n) of any stop string, the longest
 * (then the first listed) among those ending at the same byte. Returns its
 * index and sets *start, or -1. */
static int reference_match(const uint8_t *text, size_t n, uint8_t stops[][FUZZ_MAX_STOP_LEN],
                           const size_t *lens, size_t n_stops, size_t *start)
{
    for (size_t end = 1; end <= n; end++) {
        int hit = -1;
        for (size_t i = 0; i < n_stops; i++)
            if (lens[i] <= end && !memcmp(text + end - lens[i], stops[i], lens[i]) &&
                (hit < 0 || lens[i] > lens[hit]))
                hit = (int)i;
        if (hit >= 0) {
            *start = end - lens[hit];
            return hit;
        }
    }
    return -1;
}

static bool contains(const uint8_t *hay, size_t n, const uint8_t *needle, size_t m)
{
    for (size_t i = 0; i + m <= n; i++)
        if (!memcmp(hay + i, needle, m))
            return true;
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t at = 0;
    uint8_t flags = data[at++];
    bool small = flags & FUZZ_SMALL_ALPHABET;
    size_t n_stops = flags % (FUZZ_MAX_STOPS + 1);
    uint8_t stops[FUZZ_MAX_STOPS][FUZZ_MAX_STOP_LEN];
    size_t lens[FUZZ_MAX_STOPS] = {0};
    const char *ptrs[FUZZ_MAX_STOPS] = {0};
    size_t max_len = 0;
    for (size_t i = 0; i < n_stops; i++) {
        if (at >= size)
            return 0;
        lens[i] = 1 + data[at++] % FUZZ_MAX_STOP_LEN;
        if (size - at < lens[i])
            return 0;
        for (size_t k = 0; k < lens[i]; k++)
            stops[i][k] = map_byte(data[at++], small);
        ptrs[i] = (const char *)stops[i];
        if (lens[i] > max_len)
            max_len = lens[i];
    }

    ml_stop *s = NULL;
    if (ml_stop_create(ptrs, lens, n_stops, &s, NULL, 0) != ML_OK) {
        /* The only invalid stop strings this layout can build. */
        bool has_continuation_lead = false;
        for (size_t i = 0; i < n_stops; i++)
            has_continuation_lead |= (stops[i][0] & 0xC0) == 0x80;
        require(has_continuation_lead);
        return 0;
    }

    uint8_t *text = malloc(size), *released = malloc(size);
    require(text && released);
    size_t n_text = 0, n_released = 0;
    bool stopped = false;
    int which = -1;
    ml_stop_out o;
    while (at < size) {
        size_t n = data[at++] % FUZZ_MAX_PIECE;
        if (n > size - at)
            n = size - at;
        uint8_t piece[FUZZ_MAX_PIECE];
        for (size_t k = 0; k < n; k++)
            piece[k] = map_byte(data[at++], small);
        memcpy(text + n_text, piece, n);
        n_text += n;
        require(ml_stop_feed(s, (const char *)piece, n, &o, NULL, 0) == ML_OK);
        require(!stopped || (o.stopped && o.len == 0));
        if (o.len)
            memcpy(released + n_released, o.text, o.len);
        n_released += o.len;
        stopped = o.stopped;
        which = o.which;
        require(stopped || n_text - n_released + 1 <= (max_len ? max_len : 1));
    }
    ml_stop_flush(s, &o);
    require(o.stopped == stopped && (!stopped || o.len == 0));
    if (o.len)
        memcpy(released + n_released, o.text, o.len);
    n_released += o.len;

    size_t start = 0;
    int want = reference_match(text, n_text, stops, lens, n_stops, &start);
    require(which == want && stopped == (want >= 0));
    require(n_released == (want >= 0 ? start : n_text));
    require(!memcmp(released, text, n_released));
    for (size_t i = 0; i < n_stops; i++)
        require(!contains(released, n_released, stops[i], lens[i]));

    ml_stop_destroy(s);
    free(text);
    free(released);
    return 0;
}
