/* The schema oracle's `format` checks (schema_oracle.h), each as Python's
 * jsonschema FormatChecker judges it with the libraries it calls
 * (rfc3339-validator, fqdn, ipaddress, isoduration, rfc3987, uuid), written
 * from those definitions without reference to engine/grammar/lexemes.c. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "schema_oracle.h"
#include "schema_oracle_internal.h"

/* RFC 1035: a name of at most 253 octets, labels of at most 63. */
#define HOSTNAME_MAX 253
#define HOSTNAME_LABEL_MAX 63
#define UUID_HEX_DIGITS 32
#define IPV6_HEXTETS 8

/* ==== formats ================================================================ */

static bool is_digit(int c) { return c >= '0' && c <= '9'; }
static bool is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* n ASCII digits at s, their value in *v. */
static bool digits(const char *s, int n, int *v)
{
    *v = 0;
    for (int i = 0; i < n; i++) {
        if (!is_digit(s[i]))
            return false;
        *v = *v * 10 + (s[i] - '0');
    }
    return true;
}

static int days_in_month(int year, int month)
{
    static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    return month == 2 && leap ? 29 : days[month - 1];
}

/* YYYY-MM-DD with a year of at least 1 and a day of the month; the end of
 * the date in *end. */
static bool date_prefix(const char *s, const char **end)
{
    int y, m, d;
    if (!digits(s, 4, &y) || s[4] != '-' || !digits(s + 5, 2, &m) || s[7] != '-' ||
        !digits(s + 8, 2, &d))
        return false;
    *end = s + 10;
    return y >= 1 && m >= 1 && m <= 12 && d >= 1 && d <= days_in_month(y, m);
}

/* jsonschema's is_date: \d{4}-\d{2}-\d{2} (ASCII) and date.fromisoformat. */
static bool format_date(const char *s)
{
    const char *end;
    return strlen(s) == 10 && date_prefix(s, &end);
}

/* rfc3339-validator's time part, on the upper-cased text:
 * ([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$ */
static bool rfc3339_time(const char *s)
{
    int h, m, sec;
    if (!digits(s, 2, &h) || h > 23 || s[2] != ':' || !digits(s + 3, 2, &m) || m > 59 ||
        s[5] != ':' || !digits(s + 6, 2, &sec) || sec > 59)
        return false;
    s += 8;
    if (*s == '.') {
        if (!is_digit(s[1]))
            return false;
        for (s++; is_digit(*s); s++) {
        }
    }
    if (*s == 'Z' || *s == 'z')
        return s[1] == '\0';
    if (*s != '+' && *s != '-')
        return false;
    return digits(s + 1, 2, &h) && h <= 23 && s[3] == ':' && digits(s + 4, 2, &m) && m <= 59 &&
           s[6] == '\0';
}

static bool format_date_time(const char *s)
{
    const char *t;
    return date_prefix(s, &t) && (*t == 'T' || *t == 't') && rfc3339_time(t + 1);
}

/* Python's Decimal() of a designator's value, over isoduration's number
 * characters [+-0-9.,eE] (',' read as '.'); zero in *is_zero. */
static bool duration_number(const char *s, size_t n, bool *is_zero)
{
    size_t i = 0, int_digits = 0, frac_digits = 0;
    *is_zero = true;
    if (i < n && (s[i] == '+' || s[i] == '-'))
        i++;
    for (; i < n && is_digit(s[i]); i++, int_digits++)
        *is_zero &= s[i] == '0';
    if (i < n && (s[i] == '.' || s[i] == ',')) {
        for (i++; i < n && is_digit(s[i]); i++, frac_digits++)
            *is_zero &= s[i] == '0';
    }
    if (int_digits + frac_digits == 0)
        return false;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i == n || !is_digit(s[i]))
            return false;
        while (i < n && is_digit(s[i]))
            i++;
    }
    return i == n;
}

/* isoduration.parse_duration followed by jsonschema's "ends with one of
 * DMYWHMS". The designators come in order (Y M D W, then after T: H M S),
 * each after a decimal number; W only when every date value so far is 0;
 * T must be followed by something. The alternative ISO form
 * PYYYY-MM-DDThh:mm:ss (isoduration hands it to arrow) is refused. */
static bool format_duration(const char *s)
{
    static const char date_des[] = "YMDW", time_des[] = "HMS";
    size_t len = strlen(s);
    if (len < 2)
        return false;
    if (*s == '+' || *s == '-')
        s++;
    if (*s != 'P')
        return false;
    s++;
    const char *des = date_des;
    size_t di = 0;
    bool in_time = false, date_nonzero = false;
    const char *num = s;
    for (const char *c = s; *c; c++) {
        if (!in_time && *c == 'T') {
            if (c != num && num == s)
                return false; /* the datetime form */
            if (c[1] == '\0')
                return false;
            in_time = true;
            des = time_des;
            di = 0;
            num = c + 1;
            continue;
        }
        if (is_alpha(*c) && *c != 'e' && *c != 'E') {
            while (des[di] && des[di] != *c)
                di++;
            if (!des[di])
                return false;
            di++;
            bool zero;
            if (!duration_number(num, (size_t)(c - num), &zero))
                return false;
            if (!in_time && *c == 'W' && date_nonzero)
                return false;
            if (!in_time)
                date_nonzero |= !zero;
            num = c + 1;
            continue;
        }
        if (!strchr("+-0123456789.,eE", *c))
            return false;
    }
    return *s && strchr("DMYWHS", s[strlen(s) - 1]) != NULL;
}

/* The fqdn package's FQDN(s, min_labels=1).is_valid: labels of [-A-Za-z0-9]
 * (1 to 63, no '-' first or last) joined by '.', an optional final '.', at
 * most 253 characters without it. */
static bool format_hostname(const char *s)
{
    size_t len = strlen(s);
    if (len == 0)
        return false;
    if (s[len - 1] == '.')
        len--;
    if (len == 0 || len > HOSTNAME_MAX)
        return false;
    size_t label = 0;
    for (size_t i = 0; i <= len; i++) {
        char c = i < len ? s[i] : '.';
        if (c == '.') {
            if (label == 0 || label > HOSTNAME_LABEL_MAX || s[i - 1] == '-')
                return false;
            label = 0;
        } else if (is_alpha(c) || is_digit(c) || c == '-') {
            if (label == 0 && c == '-')
                return false;
            label++;
        } else {
            return false;
        }
    }
    return true;
}

/* Python's ipaddress.IPv4Address over s[0..n): four decimal octets of one to
 * three ASCII digits, at most 255, no leading zero. */
static bool ipv4_n(const char *s, size_t n)
{
    int octets = 0;
    size_t i = 0;
    for (;;) {
        size_t start = i;
        int v = 0;
        for (; i < n && is_digit(s[i]); i++)
            if (i - start < 3) /* a longer run is refused below; no overflow */
                v = v * 10 + (s[i] - '0');
        size_t d = i - start;
        if (d == 0 || d > 3 || v > 255 || (d > 1 && s[start] == '0'))
            return false;
        octets++;
        if (i == n)
            break;
        if (s[i] != '.')
            return false;
        i++;
    }
    return octets == 4;
}

static bool format_ipv4(const char *s) { return ipv4_n(s, strlen(s)); }

/* Python's ipaddress.IPv6Address over s[0..n) (its _ip_int_from_string),
 * with jsonschema's refusal of a scope ('%'). */
static bool ipv6_n(const char *s, size_t n)
{
    enum { MAX_PARTS = IPV6_HEXTETS + 1 };
    size_t start[MAX_PARTS + 1], len[MAX_PARTS + 1];
    int parts = 0;
    size_t b = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] == '%')
            return false;
        if (i == n || s[i] == ':') {
            if (parts == MAX_PARTS + 1)
                return false;
            start[parts] = b;
            len[parts++] = i - b;
            b = i + 1;
        }
    }
    if (n == 0 || parts < 3)
        return false;
    int hextets = parts;
    if (memchr(s + start[parts - 1], '.', len[parts - 1])) {
        if (!ipv4_n(s + start[parts - 1], len[parts - 1]))
            return false;
        hextets++; /* the IPv4 part counts as two */
    }
    if (hextets > MAX_PARTS)
        return false;
    int skip = -1;
    for (int i = 1; i < parts - 1; i++) {
        if (len[i] == 0) {
            if (skip >= 0)
                return false;
            skip = i;
        }
    }
    if (skip >= 0) {
        int hi = skip, lo = hextets - skip - 1;
        if (len[0] == 0 && --hi)
            return false;
        if (len[parts - 1] == 0 && --lo)
            return false;
        if (IPV6_HEXTETS - (hi + lo) < 1)
            return false;
    } else if (hextets != IPV6_HEXTETS || len[0] == 0 || len[parts - 1] == 0) {
        return false;
    }
    bool has_v4 = hextets > parts;
    for (int i = 0; i < parts - (has_v4 ? 1 : 0); i++) {
        if (len[i] == 0 && (i == 0 || i == parts - 1 || i == skip))
            continue;
        if (len[i] > 4)
            return false;
        for (size_t j = 0; j < len[i]; j++)
            if (oracle_hex_value((unsigned char)s[start[i] + j]) < 0)
                return false;
    }
    return true;
}

static bool format_ipv6(const char *s) { return ipv6_n(s, strlen(s)); }

/* ---- RFC 3986 URI (rfc3987.parse(s, rule="URI")) ------------------------------ */

static bool uri_unreserved(int c)
{
    return is_alpha(c) || is_digit(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

static bool uri_sub_delim(int c) { return c && strchr("!$&'()*+,;=", c); }

/* s[i] starts a pct-encoded triple, unreserved, sub-delim or one of extra;
 * its length in *w. */
static bool uri_char(const char *s, size_t i, size_t n, const char *extra, size_t *w)
{
    *w = 1;
    if (s[i] == '%') {
        *w = 3;
        return i + 2 < n && oracle_hex_value((unsigned char)s[i + 1]) >= 0 &&
               oracle_hex_value((unsigned char)s[i + 2]) >= 0;
    }
    return uri_unreserved(s[i]) || uri_sub_delim(s[i]) || (s[i] && strchr(extra, s[i]));
}

/* Every character of s[0..n) is a uri_char of extra. */
static bool uri_all(const char *s, size_t n, const char *extra)
{
    size_t w;
    for (size_t i = 0; i < n; i += w)
        if (!uri_char(s, i, n, extra, &w))
            return false;
    return true;
}

/* IP-literal's inside: IPv6address or IPvFuture ("v" 1*HEXDIG "." 1*(...)). */
static bool uri_ip_literal(const char *s, size_t n)
{
    if (n > 0 && (s[0] == 'v' || s[0] == 'V')) {
        size_t i = 1;
        while (i < n && oracle_hex_value((unsigned char)s[i]) >= 0)
            i++;
        if (i == 1 || i >= n || s[i] != '.' || i + 1 == n)
            return false;
        for (i++; i < n; i++)
            if (!uri_unreserved(s[i]) && !uri_sub_delim(s[i]) && s[i] != ':')
                return false;
        return true;
    }
    return ipv6_n(s, n);
}

/* authority = [ userinfo "@" ] host [ ":" port ] */
static bool uri_authority(const char *s, size_t n)
{
    const char *at = memchr(s, '@', n);
    if (at) {
        if (!uri_all(s, (size_t)(at - s), ":"))
            return false;
        n -= (size_t)(at - s) + 1;
        s = at + 1;
    }
    size_t host_end;
    if (n > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (!close || !uri_ip_literal(s + 1, (size_t)(close - s) - 1))
            return false;
        host_end = (size_t)(close - s) + 1;
    } else {
        const char *colon = memchr(s, ':', n);
        host_end = colon ? (size_t)(colon - s) : n;
        if (!uri_all(s, host_end, ""))
            return false;
    }
    if (host_end == n)
        return true;
    if (s[host_end] != ':')
        return false;
    for (size_t i = host_end + 1; i < n; i++)
        if (!is_digit(s[i]))
            return false;
    return true;
}

/* URI = scheme ":" hier-part [ "?" query ] [ "#" fragment ] */
static bool format_uri(const char *s)
{
    size_t n = strlen(s), i = 0;
    if (!is_alpha(s[0]))
        return false;
    while (i < n && (is_alpha(s[i]) || is_digit(s[i]) || s[i] == '+' || s[i] == '-' || s[i] == '.'))
        i++;
    if (i == n || s[i] != ':')
        return false;
    const char *hier = s + i + 1;
    size_t rest = n - i - 1;
    const char *hash = memchr(hier, '#', rest);
    size_t before_hash = hash ? (size_t)(hash - hier) : rest;
    if (hash && !uri_all(hash + 1, rest - before_hash - 1, ":@/?"))
        return false;
    const char *q = memchr(hier, '?', before_hash);
    size_t hier_len = q ? (size_t)(q - hier) : before_hash;
    if (q && !uri_all(q + 1, before_hash - hier_len - 1, ":@/?"))
        return false;
    if (hier_len >= 2 && hier[0] == '/' && hier[1] == '/') {
        const char *path = memchr(hier + 2, '/', hier_len - 2);
        size_t auth_len = path ? (size_t)(path - hier) - 2 : hier_len - 2;
        return uri_authority(hier + 2, auth_len) &&
               uri_all(hier + 2 + auth_len, hier_len - 2 - auth_len, ":@/");
    }
    /* path-absolute, path-rootless or path-empty: pchars and slashes, never
     * starting with "//" (handled above). */
    return uri_all(hier, hier_len, ":@/");
}

/* Python's UUID(s) (after removing "urn:", "uuid:", the braces at both ends
 * and every '-', 32 hex digits) and jsonschema's dashes at 8, 13, 18, 23. */
static bool format_uuid(const char *s)
{
    size_t n = strlen(s);
    if (n < 24 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-')
        return false;
    char *hex = malloc(n + 1);
    if (!hex)
        return false;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (!strncmp(s + i, "urn:", 4)) {
            i += 4;
        } else if (!strncmp(s + i, "uuid:", 5)) {
            i += 5;
        } else {
            hex[k++] = s[i++];
        }
    }
    size_t a = 0, b = k;
    while (a < b && (hex[a] == '{' || hex[a] == '}'))
        a++;
    while (b > a && (hex[b - 1] == '{' || hex[b - 1] == '}'))
        b--;
    size_t digits_seen = 0;
    bool ok = true;
    for (size_t i = a; i < b && ok; i++) {
        if (hex[i] == '-')
            continue;
        ok = oracle_hex_value((unsigned char)hex[i]) >= 0;
        digits_seen++;
    }
    free(hex);
    return ok && digits_seen == UUID_HEX_DIGITS;
}

bool schema_oracle_format(const char *format, const char *s)
{
    if (!strcmp(format, "date"))
        return format_date(s);
    if (!strcmp(format, "time"))
        return rfc3339_time(s);
    if (!strcmp(format, "date-time"))
        return format_date_time(s);
    if (!strcmp(format, "duration"))
        return format_duration(s);
    if (!strcmp(format, "email"))
        return strchr(s, '@') != NULL;
    if (!strcmp(format, "hostname"))
        return format_hostname(s);
    if (!strcmp(format, "ipv4"))
        return format_ipv4(s);
    if (!strcmp(format, "ipv6"))
        return format_ipv6(s);
    if (!strcmp(format, "uri"))
        return format_uri(s);
    if (!strcmp(format, "uuid"))
        return format_uuid(s);
    return true;
}
