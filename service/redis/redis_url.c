/* Redis URL parsing (svc_redis_url_parse in redis.h). */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "protocol/protocol.h"
#include "redis/redis.h"
#include "engine.h" /* ml_hex_digit */

#define DEFAULT_PORT 6379


/* Percent-decode s[0..len) into dst (capacity cap, NUL-terminated). */
static bool pct_decode(const char *s, size_t len, char *dst, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '%') {
            int hi = len - i >= 3 ? ml_hex_digit((unsigned char)s[i + 1]) : -1;
            int lo = len - i >= 3 ? ml_hex_digit((unsigned char)s[i + 2]) : -1;
            if (hi < 0 || lo < 0)
                return false;
            c = (char)(hi << 4 | lo);
            i += 2;
        }
        if (o + 1 >= cap || c == '\0')
            return false;
        dst[o++] = c;
    }
    dst[o] = '\0';
    return true;
}

/* Parse decimal digits s[0..len) into [lo, hi]. */
static bool parse_uint(const char *s, size_t len, long lo, long hi, int *out)
{
    if (len == 0 || len > 10)
        return false;
    long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

static bool is_host_char(char c, bool ipv6)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.')
        return true;
    return ipv6 ? c == ':' : (c == '-' || c == '_');
}

svc_redis_status svc_redis_url_parse(const char *url, svc_redis_url *out, char *err,
                                     size_t errlen)
{
    static const char scheme[] = "redis://";
    memset(out, 0, sizeof *out);
    out->port = DEFAULT_PORT;
    if (!url || strncasecmp(url, scheme, sizeof scheme - 1) != 0) {
        svc_errf(err, errlen, "redis URL must start with redis:// (no TLS or unix sockets)");
        return SVC_REDIS_ERR_INVALID;
    }
    const char *auth = url + sizeof scheme - 1;
    const char *slash = strchr(auth, '/');
    const char *auth_end = slash ? slash : auth + strlen(auth);
    if (strpbrk(auth, "?#")) {
        svc_errf(err, errlen, "redis URL: query strings and fragments are not supported");
        return SVC_REDIS_ERR_INVALID;
    }

    /* [[user]:password@] */
    const char *host = auth;
    const char *at = NULL;
    for (const char *p = auth; p < auth_end; p++)
        if (*p == '@')
            at = p;
    if (at) {
        const char *colon = memchr(auth, ':', (size_t)(at - auth));
        if (!colon) {
            svc_errf(err, errlen, "redis URL: credentials must be [user]:password@");
            return SVC_REDIS_ERR_INVALID;
        }
        if (!pct_decode(auth, (size_t)(colon - auth), out->user, sizeof out->user) ||
            !pct_decode(colon + 1, (size_t)(at - colon - 1), out->password,
                        sizeof out->password) ||
            out->password[0] == '\0') {
            svc_errf(err, errlen, "redis URL: malformed or empty user or password");
            return SVC_REDIS_ERR_INVALID;
        }
        host = at + 1;
    }

    /* host[:port], host may be [IPv6] */
    const char *h_end;
    const char *after;
    bool ipv6 = host < auth_end && *host == '[';
    if (ipv6) {
        host++;
        h_end = memchr(host, ']', (size_t)(auth_end - host));
        if (!h_end) {
            svc_errf(err, errlen, "redis URL: unterminated [IPv6] host");
            return SVC_REDIS_ERR_INVALID;
        }
        after = h_end + 1;
    } else {
        h_end = memchr(host, ':', (size_t)(auth_end - host));
        if (!h_end)
            h_end = auth_end;
        after = h_end;
    }
    size_t hlen = (size_t)(h_end - host);
    bool host_ok = hlen > 0 && hlen <= SVC_REDIS_HOST_MAX;
    for (size_t i = 0; host_ok && i < hlen; i++)
        host_ok = is_host_char(host[i], ipv6);
    if (!host_ok) {
        svc_errf(err, errlen, "redis URL: missing or malformed host");
        return SVC_REDIS_ERR_INVALID;
    }
    memcpy(out->host, host, hlen);
    out->host[hlen] = '\0';

    if (after < auth_end) {
        enum { PORT_MAX = 65535 };
        if (*after != ':' ||
            !parse_uint(after + 1, (size_t)(auth_end - after - 1), 1, PORT_MAX, &out->port)) {
            svc_errf(err, errlen, "redis URL: port must be 1..65535");
            return SVC_REDIS_ERR_INVALID;
        }
    }
    if (slash && slash[1] != '\0' &&
        !parse_uint(slash + 1, strlen(slash + 1), 0, INT32_MAX, &out->db)) {
        svc_errf(err, errlen, "redis URL: the path must be a database number");
        return SVC_REDIS_ERR_INVALID;
    }
    return SVC_REDIS_OK;
}
