/* API keys and request-rate buckets. See gw_auth.h for the file format. */
#include "gateway/gw_auth.h"

#include <assert.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine.h"
#include "protocol/base64.h"
#include "protocol/protocol.h"
#include "util.h"

/* The most bytes of an offending field an error message quotes. */
#define ERR_QUOTE_MAX 64

typedef struct key_entry {
    uint8_t digest[ML_SHA256_DIGEST_SIZE];
    char tenant[SVC_TENANT_NAME_MAX + 1];
} key_entry;

struct gw_keys {
    key_entry *entries; /* owned */
    size_t n, cap;
};

/* ---- parsing ----------------------------------------------------------------------- */

static bool is_blank(char c)
{
    return c == ' ' || c == '\t';
}

/* The next field of [*p, end): its start and length, *p moved past it. */
static size_t next_field(const char **p, const char *end, const char **field)
{
    while (*p < end && is_blank(**p))
        (*p)++;
    *field = *p;
    while (*p < end && !is_blank(**p))
        (*p)++;
    return (size_t)(*p - *field);
}

static int parse_digest(const char *hex, size_t len, uint8_t digest[ML_SHA256_DIGEST_SIZE])
{
    if (len != 2 * ML_SHA256_DIGEST_SIZE)
        return -1;
    for (size_t i = 0; i < ML_SHA256_DIGEST_SIZE; i++) {
        int hi = ml_hex_digit((unsigned char)hex[2 * i]);
        int lo = ml_hex_digit((unsigned char)hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        digest[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

/* All digest bytes are compared whatever the first difference: 0 when equal. */
static unsigned digest_diff(const uint8_t *a, const uint8_t *b)
{
    unsigned diff = 0;
    for (size_t i = 0; i < ML_SHA256_DIGEST_SIZE; i++)
        diff |= (unsigned)(a[i] ^ b[i]);
    return diff;
}

/* One line (no newline, a trailing CR already cut). Returns 0 (a comment or
 * blank line adds nothing), or -1 with the reason in err. */
static int parse_line(gw_keys *k, const char *p, const char *end, gw_is_tenant_fn is_tenant,
                      void *ctx, char *err, size_t errlen)
{
    for (const char *c = p; c < end; c++)
        if ((unsigned char)*c < 0x20 && *c != '\t') {
            svc_errf(err, errlen, "control character 0x%02x at column %zu", (unsigned char)*c,
                     (size_t)(c - p) + 1);
            return -1;
        }
    const char *hex, *tenant;
    size_t hex_len = next_field(&p, end, &hex);
    if (hex_len == 0 || hex[0] == '#')
        return 0;
    key_entry e = {0};
    if (parse_digest(hex, hex_len, e.digest) != 0) {
        svc_errf(err, errlen, "\"%.*s\" is not a key's sha256 (64 hex digits)",
                 (int)(hex_len < ERR_QUOTE_MAX ? hex_len : ERR_QUOTE_MAX), hex);
        return -1;
    }
    size_t tenant_len = next_field(&p, end, &tenant);
    if (tenant_len == 0) {
        svc_errf(err, errlen, "no tenant after the digest");
        return -1;
    }
    if (!svc_valid_tenant_name(tenant, tenant_len)) {
        svc_errf(err, errlen, "\"%.*s\" is not a tenant name ([a-z0-9_-]{1,%d})",
                 (int)(tenant_len < ERR_QUOTE_MAX ? tenant_len : ERR_QUOTE_MAX), tenant,
                 SVC_TENANT_NAME_MAX);
        return -1;
    }
    memcpy(e.tenant, tenant, tenant_len);
    if (is_tenant && !is_tenant(ctx, e.tenant)) {
        svc_errf(err, errlen, "unknown tenant \"%s\" (not in tenants)", e.tenant);
        return -1;
    }
    /* Loading is not a lookup: an early exit here tells an attacker nothing. */
    for (size_t i = 0; i < k->n; i++)
        if (!memcmp(k->entries[i].digest, e.digest, sizeof e.digest)) {
            svc_errf(err, errlen, "the same key as an earlier line (tenant \"%s\")",
                     k->entries[i].tenant);
            return -1;
        }
    if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 16;
        key_entry *grown = realloc(k->entries, cap * sizeof *grown);
        if (!grown) {
            svc_errf(err, errlen, "out of memory");
            return -1;
        }
        k->entries = grown;
        k->cap = cap;
    }
    k->entries[k->n++] = e;
    return 0;
}

int gw_keys_parse(const char *text, size_t len, gw_is_tenant_fn is_tenant, void *ctx,
                  gw_keys **out, char *err, size_t errlen)
{
    gw_keys *k = calloc(1, sizeof *k);
    if (!k) {
        svc_errf(err, errlen, "out of memory");
        return -1;
    }
    const char *p = text, *end = text + len;
    for (size_t line = 1; p < end; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *stop = nl ? nl : end;
        if (stop > p && stop[-1] == '\r')
            stop--;
        char why[256];
        if (parse_line(k, p, stop, is_tenant, ctx, why, sizeof why) != 0) {
            svc_errf(err, errlen, "line %zu: %s", line, why);
            gw_keys_free(k);
            return -1;
        }
        p = nl ? nl + 1 : end;
    }
    *out = k;
    return 0;
}

int gw_keys_load(const char *path, gw_is_tenant_fn is_tenant, void *ctx, gw_keys **out,
                 char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        svc_errf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        svc_errf(err, errlen, "%s: not a regular file", path);
        fclose(f);
        return -1;
    }
    if ((uint64_t)st.st_size > GW_KEYS_FILE_MAX) {
        svc_errf(err, errlen, "%s: %lld bytes, over the %u a keys file may have", path,
                 (long long)st.st_size, GW_KEYS_FILE_MAX);
        fclose(f);
        return -1;
    }
    size_t n = (size_t)st.st_size;
    char *text = malloc(n ? n : 1);
    if (!text || fread(text, 1, n, f) != n) {
        svc_errf(err, errlen, "%s: %s", path, text ? "short read" : "out of memory");
        free(text);
        fclose(f);
        return -1;
    }
    fclose(f);
    char why[512];
    int rc = gw_keys_parse(text, n, is_tenant, ctx, out, why, sizeof why);
    if (rc != 0)
        svc_errf(err, errlen, "%s: %s", path, why);
    free(text);
    return rc;
}

/* ---- lookup ------------------------------------------------------------------------ */

const char *gw_keys_tenant(const gw_keys *k, const char *key, size_t len)
{
    uint8_t digest[ML_SHA256_DIGEST_SIZE];
    ml_sha256(key, len, digest);
    /* Every entry is compared and the hit is selected with masks, not
     * branches: the time taken depends on the number of keys only. */
    size_t hit = 0; /* index + 1 of the matching entry, 0 for none */
    for (size_t i = 0; i < k->n; i++) {
        unsigned diff = digest_diff(digest, k->entries[i].digest);
        size_t equal = (size_t)0 - (size_t)(((diff - 1u) >> 8) & 1u); /* all ones iff diff == 0 */
        hit = (hit & ~equal) | ((i + 1) & equal);
    }
    return hit ? k->entries[hit - 1].tenant : NULL;
}

size_t gw_keys_count(const gw_keys *k)
{
    return k->n;
}

void gw_keys_free(gw_keys *k)
{
    if (!k)
        return;
    free(k->entries);
    free(k);
}

/* ---- new keys ---------------------------------------------------------------------- */

int gw_new_key(char *key, size_t keylen, char *line, size_t linelen, const char *tenant)
{
    size_t tenant_len = strlen(tenant);
    if (!svc_valid_tenant_name(tenant, tenant_len) || keylen < GW_KEY_LEN + 1 ||
        linelen < ML_SHA256_HEX_SIZE + 1 + tenant_len) {
        errno = EINVAL;
        return -1;
    }
    uint8_t random[GW_KEY_RANDOM_BYTES];
    if (svc_random_bytes(random, sizeof random))
        return -1;
    /* base64url (RFC 4648 §5): the standard spelling with two symbols
     * swapped and the padding cut. */
    char b64[((GW_KEY_RANDOM_BYTES + 2) / 3) * 4 + 1];
    svc_base64_encode(random, sizeof random, b64);
    size_t n = strlen(GW_KEY_PREFIX);
    memcpy(key, GW_KEY_PREFIX, n);
    for (const char *c = b64; *c && *c != '='; c++)
        key[n++] = *c == '+' ? '-' : *c == '/' ? '_' : *c;
    key[n] = '\0';
    uint8_t digest[ML_SHA256_DIGEST_SIZE];
    ml_sha256(key, n, digest);
    char hex[ML_SHA256_HEX_SIZE];
    ml_sha256_hex(digest, hex);
    snprintf(line, linelen, "%s %s", hex, tenant);
    return 0;
}

/* ---- token buckets ----------------------------------------------------------------- */

void gw_bucket_init(gw_bucket *b, double rate, double burst, double now_s)
{
    assert(rate > 0 && burst >= 1);
    *b = (gw_bucket){.tokens = burst, .rate = rate, .burst = burst, .last_s = now_s};
}

bool gw_bucket_take(gw_bucket *b, double now_s, double *retry_after_s)
{
    if (now_s > b->last_s) {
        b->tokens += (now_s - b->last_s) * b->rate;
        if (b->tokens > b->burst)
            b->tokens = b->burst;
        b->last_s = now_s;
    }
    if (b->tokens >= 1.0) {
        b->tokens -= 1.0;
        return true;
    }
    *retry_after_s = (1.0 - b->tokens) / b->rate;
    return false;
}
