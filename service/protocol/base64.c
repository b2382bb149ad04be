/* Strict base64 and data: URLs. See base64.h for the accepted spelling. */
#include "protocol/base64.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "protocol/protocol.h"

#define B64_PAD '='

static const char b64_alphabet[64] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Symbol value + 1 of each byte; 0 marks a byte outside the alphabet
 * (including '=' and whitespace). */
static const uint8_t b64_code[256] = {
    ['A'] = 1, ['B'] = 2, ['C'] = 3, ['D'] = 4, ['E'] = 5, ['F'] = 6, ['G'] = 7, ['H'] = 8,
    ['I'] = 9, ['J'] = 10, ['K'] = 11, ['L'] = 12, ['M'] = 13, ['N'] = 14, ['O'] = 15,
    ['P'] = 16, ['Q'] = 17, ['R'] = 18, ['S'] = 19, ['T'] = 20, ['U'] = 21, ['V'] = 22,
    ['W'] = 23, ['X'] = 24, ['Y'] = 25, ['Z'] = 26, ['a'] = 27, ['b'] = 28, ['c'] = 29,
    ['d'] = 30, ['e'] = 31, ['f'] = 32, ['g'] = 33, ['h'] = 34, ['i'] = 35, ['j'] = 36,
    ['k'] = 37, ['l'] = 38, ['m'] = 39, ['n'] = 40, ['o'] = 41, ['p'] = 42, ['q'] = 43,
    ['r'] = 44, ['s'] = 45, ['t'] = 46, ['u'] = 47, ['v'] = 48, ['w'] = 49, ['x'] = 50,
    ['y'] = 51, ['z'] = 52, ['0'] = 53, ['1'] = 54, ['2'] = 55, ['3'] = 56, ['4'] = 57,
    ['5'] = 58, ['6'] = 59, ['7'] = 60, ['8'] = 61, ['9'] = 62, ['+'] = 63, ['/'] = 64,
};

static svc_base64_status bad_char(const char *src, size_t at, char *err, size_t errlen)
{
    unsigned char c = (unsigned char)src[at];
    if (c == B64_PAD)
        svc_errf(err, errlen, "misplaced '=' at offset %zu", at);
    else
        svc_errf(err, errlen, "invalid base64 character 0x%02x at offset %zu", c, at);
    return SVC_BASE64_INVALID;
}

svc_base64_status svc_base64_decoded_len(const char *src, size_t n, size_t max_bytes,
                                         size_t *out_len, char *err, size_t errlen)
{
    *out_len = 0;
    if (n % 4 != 0) {
        svc_errf(err, errlen, "base64 length %zu is not a multiple of 4", n);
        return SVC_BASE64_INVALID;
    }
    size_t pad = 0;
    if (n > 0 && src[n - 1] == B64_PAD)
        pad = (src[n - 2] == B64_PAD) ? 2 : 1;
    if (n > 0 && pad == 2 && src[n - 3] == B64_PAD)
        return bad_char(src, n - 3, err, errlen);
    *out_len = n / 4 * 3 - pad;
    if (*out_len > max_bytes) {
        svc_errf(err, errlen, "decoded size %zu bytes exceeds the limit of %zu", *out_len,
                 max_bytes);
        return SVC_BASE64_TOO_LARGE;
    }
    return SVC_BASE64_OK;
}

svc_base64_status svc_base64_decode(const char *src, size_t n, uint8_t *dst, size_t dst_cap,
                                    size_t *out_len, char *err, size_t errlen)
{
    size_t len;
    svc_base64_status st = svc_base64_decoded_len(src, n, dst_cap, &len, err, errlen);
    if (st != SVC_BASE64_OK) {
        *out_len = 0;
        return st;
    }
    *out_len = 0;
    if (n == 0)
        return SVC_BASE64_OK;

    const unsigned char *s = (const unsigned char *)src;
    size_t full = n - 4; /* every quad but the last is four plain symbols */
    uint8_t *d = dst;
    for (size_t i = 0; i < full; i += 4) {
        uint32_t a = b64_code[s[i]], b = b64_code[s[i + 1]];
        uint32_t c = b64_code[s[i + 2]], e = b64_code[s[i + 3]];
        if ((a == 0) | (b == 0) | (c == 0) | (e == 0))
            return bad_char(src, i + (a == 0 ? 0 : b == 0 ? 1 : c == 0 ? 2 : 3), err, errlen);
        uint32_t v = (a - 1) << 18 | (b - 1) << 12 | (c - 1) << 6 | (e - 1);
        d[0] = (uint8_t)(v >> 16);
        d[1] = (uint8_t)(v >> 8);
        d[2] = (uint8_t)v;
        d += 3;
    }

    /* The last quad: "xxxx", "xxx=" or "xx==" (the padding was checked by
     * svc_base64_decoded_len; a '=' before it is a bad character here). */
    const unsigned char *q = s + full;
    size_t n_pad = n / 4 * 3 - len;
    size_t n_sym = 4 - n_pad;
    uint32_t v = 0;
    for (size_t k = 0; k < n_sym; k++) {
        uint32_t code = b64_code[q[k]];
        if (code == 0)
            return bad_char(src, full + k, err, errlen);
        v |= (code - 1) << (18 - 6 * k);
    }
    size_t n_out = 3 - n_pad;
    /* The bits below the last output byte must be zero (canonical form). */
    uint32_t unused = v & ((1u << (8 * n_pad)) - 1);
    if (unused != 0) {
        svc_errf(err, errlen, "non-zero padding bits in the last symbol at offset %zu",
                 full + n_sym - 1);
        return SVC_BASE64_INVALID;
    }
    for (size_t k = 0; k < n_out; k++)
        d[k] = (uint8_t)(v >> (16 - 8 * k));
    *out_len = len;
    return SVC_BASE64_OK;
}

size_t svc_base64_encoded_len(size_t n)
{
    size_t quads = n / 3 + (n % 3 != 0);
    if (quads > SIZE_MAX / 4)
        return SIZE_MAX;
    return quads * 4;
}

void svc_base64_encode(const uint8_t *src, size_t n, char *dst)
{
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)src[i] << 16 | (uint32_t)src[i + 1] << 8 | src[i + 2];
        *dst++ = b64_alphabet[v >> 18 & 63];
        *dst++ = b64_alphabet[v >> 12 & 63];
        *dst++ = b64_alphabet[v >> 6 & 63];
        *dst++ = b64_alphabet[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)src[i] << 16;
        *dst++ = b64_alphabet[v >> 18 & 63];
        *dst++ = b64_alphabet[v >> 12 & 63];
        *dst++ = B64_PAD;
        *dst++ = B64_PAD;
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)src[i] << 16 | (uint32_t)src[i + 1] << 8;
        *dst++ = b64_alphabet[v >> 18 & 63];
        *dst++ = b64_alphabet[v >> 12 & 63];
        *dst++ = b64_alphabet[v >> 6 & 63];
        *dst++ = B64_PAD;
    }
    *dst = '\0';
}

/* ---- data: URLs --------------------------------------------------------- */

static bool has_prefix_ci(const char *s, size_t len, const char *prefix)
{
    size_t n = strlen(prefix);
    if (len < n)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != prefix[i])
            return false;
    }
    return true;
}

/* An RFC 2045 token character: printable ASCII except space and tspecials. */
static bool is_token_char(char c)
{
    if (c <= ' ' || c >= 0x7f)
        return false;
    return !strchr("()<>@,;:\\\"/[]?=", c);
}

static size_t token_len(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len && is_token_char(s[i]))
        i++;
    return i;
}

static const char data_url_scheme[] = "data:", data_url_marker[] = ";base64,";

size_t svc_data_url_len(const char *media_type, size_t n)
{
    size_t head = sizeof data_url_scheme - 1 + strlen(media_type) + sizeof data_url_marker - 1;
    size_t body = svc_base64_encoded_len(n);
    return body > SIZE_MAX - head ? SIZE_MAX : head + body;
}

void svc_data_url_write(const char *media_type, const uint8_t *src, size_t n, char *dst)
{
    size_t type_len = strlen(media_type);
    memcpy(dst, data_url_scheme, sizeof data_url_scheme - 1);
    dst += sizeof data_url_scheme - 1;
    memcpy(dst, media_type, type_len);
    dst += type_len;
    memcpy(dst, data_url_marker, sizeof data_url_marker - 1);
    svc_base64_encode(src, n, dst + sizeof data_url_marker - 1);
}

svc_base64_status svc_data_url_parse(const char *url, size_t len, svc_data_url *out, char *err,
                                     size_t errlen)
{
    static const char scheme[] = "data:";
    static const char marker[] = "base64";
    memset(out, 0, sizeof *out);
    if (!has_prefix_ci(url, len, scheme)) {
        svc_errf(err, errlen, "not a data: URL (only inline base64 images are accepted)");
        return SVC_BASE64_INVALID;
    }
    const char *comma = memchr(url, ',', len);
    if (!comma) {
        svc_errf(err, errlen, "data: URL has no ',' before the data");
        return SVC_BASE64_INVALID;
    }
    const char *p = url + strlen(scheme);
    size_t head = (size_t)(comma - p);

    /* <type>/<subtype> */
    size_t t = token_len(p, head);
    size_t s = (t < head && p[t] == '/') ? token_len(p + t + 1, head - t - 1) : 0;
    if (t == 0 || s == 0) {
        svc_errf(err, errlen, "data: URL has no media type (expected data:image/jpeg;base64,...)");
        return SVC_BASE64_INVALID;
    }
    out->mime = p;
    out->mime_len = t + 1 + s;

    /* (;attr=value)* ;base64 */
    size_t i = out->mime_len;
    bool base64 = false;
    while (i < head) {
        if (p[i] != ';' || base64) {
            svc_errf(err, errlen, "malformed data: URL header at offset %zu",
                     (size_t)(p - url) + i);
            return SVC_BASE64_INVALID;
        }
        i++;
        size_t rest = head - i;
        if (rest == strlen(marker) && has_prefix_ci(p + i, rest, marker)) {
            base64 = true;
            i = head;
            continue;
        }
        size_t a = token_len(p + i, rest);
        size_t v = (a < rest && p[i + a] == '=') ? token_len(p + i + a + 1, rest - a - 1) : 0;
        if (a == 0 || v == 0) {
            svc_errf(err, errlen, "malformed data: URL parameter at offset %zu",
                     (size_t)(p - url) + i);
            return SVC_BASE64_INVALID;
        }
        i += a + 1 + v;
    }
    if (!base64) {
        svc_errf(err, errlen, "data: URL is not base64 (expected ';base64,' before the data)");
        return SVC_BASE64_INVALID;
    }
    out->data = comma + 1;
    out->data_len = len - (size_t)(comma + 1 - url);
    return SVC_BASE64_OK;
}
