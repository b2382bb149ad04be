/* Who may call the gateway, and how often: the API keys file, the lookup of
 * a presented key, fresh keys for `mllama gateway --new-key`, and the token
 * buckets behind the per-tenant request rate.
 *
 * The keys file (`gateway.api_keys_file`) holds one key a line:
 *
 *     # comments and blank lines are skipped
 *     <sha256 of the key, 64 hex digits> <tenant> [label]
 *
 * Fields are separated by spaces or tabs; the label is the rest of the line,
 * free text for the people who read the file (whose key, issued when), and
 * the gateway keeps nothing of it. The file holds digests only, so reading it
 * gives no one a key. A presented key is hashed and its digest compared with
 * every line's in constant time: how long a lookup takes says nothing about
 * which key, or how much of one, matched.
 *
 * @locality any thread; a gw_keys is immutable once built (a reload builds a
 * new one), a gw_bucket belongs to the one thread that takes from it. */
#ifndef GW_AUTH_H
#define GW_AUTH_H

#include <stdbool.h>
#include <stddef.h>

/* ---- the keys file ------------------------------------------------------------- */

typedef struct gw_keys gw_keys;

/* Whether `name` is a configured tenant (the keys file may name no other). */
typedef bool (*gw_is_tenant_fn)(void *ctx, const char *name);

/* Parse a keys file's text (`len` bytes, no NUL needed). Every line must be
 * a comment, blank, or `<64 hex digits> <tenant> [label]` with a tenant
 * is_tenant accepts (any valid tenant name when is_tenant is NULL); a digest
 * may appear once. Returns 0 and *out (owned by the caller, free with
 * gw_keys_free; an empty file gives an empty set), or -1 with "line N: why"
 * in err and *out unchanged. */
int gw_keys_parse(const char *text, size_t len, gw_is_tenant_fn is_tenant, void *ctx,
                  gw_keys **out, char *err, size_t errlen);

/* gw_keys_parse on the contents of the file at `path`; err starts with the
 * path. Files over GW_KEYS_FILE_MAX bytes are refused unread. */
#define GW_KEYS_FILE_MAX (16u << 20)
int gw_keys_load(const char *path, gw_is_tenant_fn is_tenant, void *ctx, gw_keys **out,
                 char *err, size_t errlen);

/* The tenant of a presented key (the `len` bytes after "Bearer "), or NULL
 * when no line holds its sha256. The string is borrowed from k: valid until
 * gw_keys_free(k), so a holder that outlives a reload keeps a copy. */
const char *gw_keys_tenant(const gw_keys *k, const char *key, size_t len);

/* How many keys the set holds. */
size_t gw_keys_count(const gw_keys *k);

/* NULL is a no-op. */
void gw_keys_free(gw_keys *k);

/* ---- new keys -------------------------------------------------------------------- */

/* "mk-" and the unpadded base64url spelling of 32 random bytes. */
#define GW_KEY_PREFIX "mk-"
#define GW_KEY_RANDOM_BYTES 32
#define GW_KEY_LEN (sizeof GW_KEY_PREFIX - 1 + (GW_KEY_RANDOM_BYTES * 4 + 2) / 3) /* 46 */

/* A fresh key from getrandom(2) into key (keylen >= GW_KEY_LEN + 1) and its
 * keys-file line "<sha256 hex> <tenant>" (no newline) into line. Returns 0,
 * or -1 with errno: EINVAL for an invalid tenant name or a buffer too small,
 * else getrandom's. Both buffers are NUL-terminated on success only. */
int gw_new_key(char *key, size_t keylen, char *line, size_t linelen, const char *tenant);

/* ---- token buckets --------------------------------------------------------------- */

/* `rate` tokens a second up to `burst`; a request takes one. Times are
 * seconds on one monotonic clock (svc_now_s). */
typedef struct gw_bucket {
    double tokens, rate, burst, last_s;
} gw_bucket;

/* A full bucket. rate > 0 and burst >= 1 (the configuration checks them). */
void gw_bucket_init(gw_bucket *b, double rate, double burst, double now_s);

/* Take one token: true, or false with *retry_after_s (> 0), the wait until
 * one is there (a Retry-After header rounds it up to whole seconds). A
 * refused take costs nothing, so a client that keeps retrying too early is
 * not locked out for longer. */
bool gw_bucket_take(gw_bucket *b, double now_s, double *retry_after_s);

#endif
