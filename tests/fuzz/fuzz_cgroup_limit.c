/* Fuzz target: the cgroup memory limit's parser (engine/host_memory.h).
 * Properties: it accepts exactly 1-20 digits and an optional newline
 * whose value fits 64 bits, and the value it gives is the one printing it
 * back spells (leading zeros aside). Aborts when one breaks. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host_memory.h"

static void require(bool ok)
{
    if (!ok)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    uint64_t bytes = 0;
    const int ok = ml_host_memory_parse_limit(text, size, &bytes);
    size_t digits = size > 0 && text[size - 1] == '\n' ? size - 1 : size;
    bool all_digits = digits > 0;
    for (size_t i = 0; i < digits; i++)
        all_digits &= text[i] >= '0' && text[i] <= '9';
    if (!all_digits) {
        require(!ok);
        return 0;
    }
    size_t lead = 0; /* leading zeros, keeping the last digit */
    while (lead + 1 < digits && text[lead] == '0')
        lead++;
    const size_t sig = digits - lead;
    char max[32];
    snprintf(max, sizeof max, "%" PRIu64, UINT64_MAX);
    const size_t max_len = strlen(max);
    const bool fits = sig < max_len || (sig == max_len && memcmp(text + lead, max, sig) <= 0);
    require(ok == fits);
    if (ok) {
        char back[32];
        snprintf(back, sizeof back, "%" PRIu64, bytes);
        require(strlen(back) == sig && memcmp(back, text + lead, sig) == 0);
    }
    return 0;
}
