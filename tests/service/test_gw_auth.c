/* The gateway's API keys and request buckets (service/gateway/gw_auth.c):
 * the keys file's grammar and its errors by line, lookups by the key's
 * sha256, fresh keys that the file then accepts, and the token bucket's
 * refill, burst and Retry-After. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "gateway/gw_auth.h"
#include "harness.h"

/* "alpha" and "beta" are tenants; anything else is not. */
static bool is_tenant(void *ctx, const char *name)
{
    (void)ctx;
    return !strcmp(name, "alpha") || !strcmp(name, "beta");
}

static void digest_hex(const char *key, char hex[ML_SHA256_HEX_SIZE])
{
    uint8_t d[ML_SHA256_DIGEST_SIZE];
    ml_sha256(key, strlen(key), d);
    ml_sha256_hex(d, hex);
}

static gw_keys *parse(const char *text, char *err, size_t errlen)
{
    gw_keys *k = NULL;
    if (gw_keys_parse(text, strlen(text), is_tenant, NULL, &k, err, errlen) != 0)
        return NULL;
    return k;
}

static const char *tenant_of(const gw_keys *k, const char *key)
{
    return gw_keys_tenant(k, key, strlen(key));
}

static void test_lookup(void)
{
    char a[ML_SHA256_HEX_SIZE], b[ML_SHA256_HEX_SIZE], c[ML_SHA256_HEX_SIZE];
    digest_hex("key-a", a);
    digest_hex("key-b", b);
    digest_hex("key-c", c);
    for (char *p = c; *p; p++) /* upper-case hex is the same digest */
        if (*p >= 'a' && *p <= 'f')
            *p = (char)(*p - 'a' + 'A');
    char text[1024];
    snprintf(text, sizeof text,
             "# keys for the test\n"
             "\n"
             "   \t\n"
             "%s alpha\n"
             "  %s\tbeta  laptop of B, issued 2026-12-01 # not a comment\r\n"
             "\t# an indented comment\n"
             "%s alpha",
             a, b, c);
    char err[256] = "";
    gw_keys *k = parse(text, err, sizeof err);
    check(k != NULL, "valid file refused: %s", err);
    if (!k)
        return;
    check(gw_keys_count(k) == 3, "count %zu", gw_keys_count(k));
    const char *t = tenant_of(k, "key-a");
    check(t && !strcmp(t, "alpha"), "key-a -> %s", t ? t : "(null)");
    t = tenant_of(k, "key-b");
    check(t && !strcmp(t, "beta"), "key-b -> %s", t ? t : "(null)");
    t = tenant_of(k, "key-c");
    check(t && !strcmp(t, "alpha"), "key-c (upper-case hex) -> %s", t ? t : "(null)");
    check(tenant_of(k, "key-d") == NULL, "unknown key found");
    check(tenant_of(k, "key-") == NULL, "a prefix of a key found");
    check(tenant_of(k, "key-aa") == NULL, "a key with a byte more found");
    check(gw_keys_tenant(k, "key-a", 4) == NULL, "length ignored");
    check(tenant_of(k, "") == NULL, "empty key found");
    check(gw_keys_tenant(k, "key-b\0x", 7) == NULL, "key cut at a NUL");
    gw_keys_free(k);

    k = parse("", err, sizeof err);
    check(k && gw_keys_count(k) == 0, "empty file: %s", err);
    if (k)
        check(tenant_of(k, "key-a") == NULL, "empty set finds a key");
    gw_keys_free(k);
    gw_keys_free(NULL);

    /* No callback: any valid tenant name. */
    snprintf(text, sizeof text, "%s gamma\n", a);
    check(gw_keys_parse(text, strlen(text), NULL, NULL, &k, err, sizeof err) == 0, "%s", err);
    t = tenant_of(k, "key-a");
    check(t && !strcmp(t, "gamma"), "no callback: key-a -> %s", t ? t : "(null)");
    gw_keys_free(k);
}

/* text must be refused with an error that contains every one of want. */
static void expect_error(const char *text, size_t len, const char *want1, const char *want2)
{
    char err[256] = "";
    gw_keys *k = (gw_keys *)&err; /* must stay untouched */
    int rc = gw_keys_parse(text, len, is_tenant, NULL, &k, err, sizeof err);
    check(rc == -1, "accepted: %.*s", (int)len, text);
    check(k == (gw_keys *)&err, "out written on error");
    check(strstr(err, want1) != NULL, "error \"%s\" lacks \"%s\"", err, want1);
    if (want2)
        check(strstr(err, want2) != NULL, "error \"%s\" lacks \"%s\"", err, want2);
}

static void test_errors(void)
{
    char a[ML_SHA256_HEX_SIZE], b[ML_SHA256_HEX_SIZE];
    digest_hex("key-a", a);
    digest_hex("key-b", b);
    char text[1024];

    snprintf(text, sizeof text, "# ok\n%s alpha\n%.63s alpha\n", a, b);
    expect_error(text, strlen(text), "line 3:", "64 hex digits");
    snprintf(text, sizeof text, "%s0 alpha\n", a);
    expect_error(text, strlen(text), "line 1:", "64 hex digits");
    snprintf(text, sizeof text, "%.63sg alpha\n", a);
    expect_error(text, strlen(text), "line 1:", "64 hex digits");
    snprintf(text, sizeof text, "mk-plaintextkey alpha\n");
    expect_error(text, strlen(text), "line 1:", "\"mk-plaintextkey\"");
    snprintf(text, sizeof text, "\n\n%s\n", a);
    expect_error(text, strlen(text), "line 3:", "no tenant");
    snprintf(text, sizeof text, "%s   \t \n", a);
    expect_error(text, strlen(text), "line 1:", "no tenant");
    snprintf(text, sizeof text, "%s Alpha\n", a);
    expect_error(text, strlen(text), "line 1:", "not a tenant name");
    snprintf(text, sizeof text, "%s gamma\n", a);
    expect_error(text, strlen(text), "line 1:", "unknown tenant \"gamma\"");
    snprintf(text, sizeof text, "%s alpha\n%s beta\n# x\n%s beta\n", a, b, a);
    expect_error(text, strlen(text), "line 4:", "same key");
    snprintf(text, sizeof text, "%s alpha\n%s be\x01ta\n", a, b);
    expect_error(text, strlen(text), "line 2:", "control character 0x01");
    snprintf(text, sizeof text, "%s alpha label\x7f\n", a); /* DEL is not a control here */
    char err[256];
    gw_keys *k = parse(text, err, sizeof err);
    check(k != NULL, "DEL in a label: %s", err);
    gw_keys_free(k);
    /* A NUL inside the text is a control character, not the end. */
    int n = snprintf(text, sizeof text, "%s alpha\n#", a);
    text[n - 1] = '\0';
    expect_error(text, (size_t)n, "line 2:", "control character 0x00");
    /* An overlong field is quoted, cut. */
    memset(text, 'z', 500);
    text[500] = '\0';
    expect_error(text, strlen(text), "line 1:", "is not a key's sha256");
}

static void test_load(void)
{
    char path[] = "/tmp/test_gw_auth.XXXXXX";
    int fd = mkstemp(path);
    check(fd >= 0, "mkstemp: %s", strerror(errno));
    if (fd < 0)
        return;
    char a[ML_SHA256_HEX_SIZE], line[256];
    digest_hex("key-a", a);
    int n = snprintf(line, sizeof line, "%s beta first\n%s alpha\n", a, a);
    check(write(fd, line, (size_t)n) == n, "write");
    close(fd);
    char err[512] = "";
    gw_keys *k = NULL;
    check(gw_keys_load(path, is_tenant, NULL, &k, err, sizeof err) == -1, "duplicate loaded");
    check(strstr(err, path) && strstr(err, "line 2:"), "load error: %s", err);

    fd = open(path, O_WRONLY | O_TRUNC);
    n = snprintf(line, sizeof line, "%s beta first\n", a);
    check(fd >= 0 && write(fd, line, (size_t)n) == n, "rewrite");
    close(fd);
    check(gw_keys_load(path, is_tenant, NULL, &k, err, sizeof err) == 0, "load: %s", err);
    const char *t = k ? tenant_of(k, "key-a") : NULL;
    check(t && !strcmp(t, "beta"), "loaded key-a -> %s", t ? t : "(null)");
    gw_keys_free(k);
    unlink(path);

    check(gw_keys_load(path, is_tenant, NULL, &k, err, sizeof err) == -1, "missing file");
    check(strstr(err, path) && strstr(err, "No such file"), "missing: %s", err);
    check(gw_keys_load("/tmp", is_tenant, NULL, &k, err, sizeof err) == -1, "a directory");
    check(strstr(err, "not a regular file") != NULL, "directory: %s", err);
}

static void test_new_key(void)
{
    char key[GW_KEY_LEN + 1], key2[GW_KEY_LEN + 1], line[128];
    check(gw_new_key(key, sizeof key, line, sizeof line, "alpha") == 0, "new key: %s",
          strerror(errno));
    check(strlen(key) == 46 && GW_KEY_LEN == 46, "key length %zu", strlen(key));
    check(!strncmp(key, "mk-", 3), "prefix: %s", key);
    size_t bad = 0;
    for (const char *c = key + 3; *c; c++)
        bad += !((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') ||
                 (*c >= '0' && *c <= '9') || *c == '-' || *c == '_');
    check(bad == 0, "not base64url: %s", key);
    /* 32 bytes are 256 bits: the last of 43 symbols carries 4 bits, its low 2 zero. */
    check(strchr("AEIMQUYcgkosw048", key[GW_KEY_LEN - 1]) != NULL, "last symbol %c",
          key[GW_KEY_LEN - 1]);
    char hex[ML_SHA256_HEX_SIZE];
    digest_hex(key, hex);
    char want[128];
    snprintf(want, sizeof want, "%s alpha", hex);
    check(!strcmp(line, want), "line \"%s\", want \"%s\"", line, want);

    /* The line as written is a keys file that finds the key. */
    char err[256];
    gw_keys *k = parse(line, err, sizeof err);
    const char *t = k ? tenant_of(k, key) : NULL;
    check(t && !strcmp(t, "alpha"), "new key's line: %s", k ? "not found" : err);
    gw_keys_free(k);

    check(gw_new_key(key2, sizeof key2, line, sizeof line, "alpha") == 0, "second key");
    check(strcmp(key, key2) != 0, "two keys alike: %s", key);

    errno = 0;
    check(gw_new_key(key, sizeof key, line, sizeof line, "Not-A-Tenant") == -1 &&
              errno == EINVAL,
          "bad tenant accepted");
    check(gw_new_key(key, GW_KEY_LEN, line, sizeof line, "alpha") == -1 && errno == EINVAL,
          "short key buffer accepted");
    check(gw_new_key(key, sizeof key, line, ML_SHA256_HEX_SIZE + 5, "alpha") == -1 &&
              errno == EINVAL,
          "short line buffer accepted");
    check(gw_new_key(key, sizeof key, line, ML_SHA256_HEX_SIZE + 6, "alpha") == 0,
          "exact line buffer refused");
}

static void test_bucket(void)
{
    gw_bucket b;
    double wait = -1;
    gw_bucket_init(&b, 2.0, 3.0, 100.0); /* 2/s, burst 3 */
    for (int i = 0; i < 3; i++)
        check(gw_bucket_take(&b, 100.0, &wait), "burst take %d", i);
    check(!gw_bucket_take(&b, 100.0, &wait), "fourth take at once");
    check_close(wait, 0.5, 1e-9, 0, "retry after, empty");
    check(!gw_bucket_take(&b, 100.25, &wait), "take after 0.25 s");
    check_close(wait, 0.25, 1e-9, 0, "retry after, half a token");
    check(gw_bucket_take(&b, 100.5, &wait), "take after 0.5 s");
    check(!gw_bucket_take(&b, 100.5, &wait), "and then empty again");
    /* Idle long: refilled to the burst, no further. */
    for (int i = 0; i < 3; i++)
        check(gw_bucket_take(&b, 1000.0, &wait), "after idle, take %d", i);
    check(!gw_bucket_take(&b, 1000.0, &wait), "after idle, burst exhausted");
    /* A clock that goes back refills nothing and breaks nothing. */
    check(!gw_bucket_take(&b, 999.0, &wait), "clock back");
    check(wait > 0 && wait <= 0.5, "clock back: wait %g", wait);
    check(gw_bucket_take(&b, 1000.5, &wait), "clock forward again");

    /* Sustained: over 10 s at 2/s with burst 3, 3 + 20 takes succeed. */
    gw_bucket_init(&b, 2.0, 3.0, 0.0);
    int ok = 0;
    for (int ms = 0; ms <= 10000; ms += 10)
        ok += gw_bucket_take(&b, ms / 1000.0, &wait);
    check(ok == 23, "sustained takes %d, want 23", ok);

    /* A slow rate: Retry-After in whole seconds rounds up. */
    gw_bucket_init(&b, 0.1, 1.0, 0.0);
    check(gw_bucket_take(&b, 0.0, &wait), "slow bucket first");
    check(!gw_bucket_take(&b, 1.0, &wait), "slow bucket second");
    check_close(wait, 9.0, 1e-9, 0, "slow bucket wait");
}

int main(void)
{
    test_lookup();
    test_errors();
    test_load();
    test_new_key();
    test_bucket();
    return check_done();
}
