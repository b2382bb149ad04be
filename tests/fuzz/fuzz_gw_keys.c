/* Fuzz target: bytes -> the gateway's API keys file (service/gateway/gw_auth.c).
 * Properties, aborting when one breaks:
 *   accepted  =>  one key per line that is neither blank nor a comment;
 *   refused   =>  the error names a line N of the input, and the lines
 *                 before N alone are accepted (the first bad line is named);
 *   a lookup of the input as a key finds nothing or a tenant the callback
 *   accepted. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/gw_auth.h"

static void require(bool ok)
{
    if (!ok)
        abort();
}

/* Tenants are the names that start with 't', so both answers are reached. */
static bool is_tenant(void *ctx, const char *name)
{
    (void)ctx;
    return name[0] == 't';
}

/* Lines of the text, and those with a first field not starting with '#'. */
static void count_lines(const uint8_t *p, size_t n, size_t *lines, size_t *keys)
{
    *lines = *keys = 0;
    size_t i = 0;
    while (i < n) {
        (*lines)++;
        while (i < n && (p[i] == ' ' || p[i] == '\t'))
            i++;
        bool cr_end = i < n && p[i] == '\r' && (i + 1 == n || p[i + 1] == '\n');
        if (i < n && p[i] != '\n' && p[i] != '#' && !cr_end)
            (*keys)++;
        while (i < n && p[i] != '\n')
            i++;
        i++;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    size_t lines, keys;
    count_lines(data, size, &lines, &keys);
    gw_keys *k = NULL;
    char err[512];
    if (gw_keys_parse(text, size, is_tenant, NULL, &k, err, sizeof err) == 0) {
        require(gw_keys_count(k) == keys);
        const char *t = gw_keys_tenant(k, text, size);
        require(!t || is_tenant(NULL, t));
        gw_keys_free(k);
        return 0;
    }
    size_t bad = 0;
    require(sscanf(err, "line %zu:", &bad) == 1 && bad >= 1 && bad <= lines);
    size_t before = 0; /* the bytes of lines 1 .. bad-1 */
    for (size_t line = 1; line < bad; line++) {
        const uint8_t *nl = memchr(data + before, '\n', size - before);
        require(nl != NULL);
        before = (size_t)(nl - data) + 1;
    }
    require(gw_keys_parse(text, before, is_tenant, NULL, &k, err, sizeof err) == 0);
    gw_keys_free(k);
    return 0;
}
