/* The protocol's shared vocabulary: error codes, default limits, names,
 * and the validators that request parsing and the Redis index share. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "protocol/protocol.h"

/* ---- Errors, limits, names ---------------------------------------------- */

const char *svc_error_code(svc_error e)
{
    switch (e) {
    case SVC_ERROR_NONE: return "none";
    case SVC_ERROR_INVALID_JSON: return "invalid_json";
    case SVC_ERROR_INVALID_REQUEST: return "invalid_request";
    case SVC_ERROR_INVALID_IMAGE: return "invalid_image";
    case SVC_ERROR_IMAGE_TOO_LARGE: return "image_too_large";
    case SVC_ERROR_UNKNOWN_ADAPTER: return "unknown_adapter";
    case SVC_ERROR_ADAPTER_TOO_LARGE: return "adapter_too_large";
    case SVC_ERROR_ADAPTER_UNAVAILABLE: return "adapter_unavailable";
    case SVC_ERROR_CONTEXT_LENGTH_EXCEEDED: return "context_length_exceeded";
    case SVC_ERROR_DEADLINE_EXCEEDED: return "deadline_exceeded";
    case SVC_ERROR_CANCELLED: return "cancelled";
    case SVC_ERROR_REPLY_TOO_LARGE: return "reply_too_large";
    case SVC_ERROR_INTERNAL: return "internal";
    case SVC_ERROR_TOO_MANY_ATTEMPTS: return "too_many_attempts";
    case SVC_ERROR_REPLY_TOPIC_NOT_ALLOWED: return "reply_topic_not_allowed";
    case SVC_ERROR_REPLY_UNDELIVERABLE: return "reply_undeliverable";
    }
    return "internal";
}

#define MIB ((size_t)1 << 20)

void svc_limits_default(svc_limits *lim)
{
    *lim = (svc_limits){
        .max_request_bytes = 32 * MIB,
        .max_json_values = 65536,
        .max_id_bytes = SVC_ID_MAX_BYTES,
        .max_messages = 1024,
        .max_parts = 4096,
        .max_text_bytes = 1 * MIB,
        .max_images = 8,
        .max_image_bytes = 20 * MIB,
        .max_stop = 4,
        .max_stop_bytes = 256,
        .max_tokens_default = 256,
        .max_tokens_limit = SVC_MAX_TOKENS_DEFAULT,
        .max_schema_bytes = SVC_SCHEMA_BYTES_DEFAULT,
        .max_n = SVC_MAX_N_DEFAULT,
    };
}

size_t svc_reply_bound(uint32_t n, uint32_t max_tokens, bool logprobs, uint32_t top_logprobs)
{
    size_t entries = 1 + (logprobs ? 1 + (size_t)top_logprobs : 0);
    return (size_t)n * max_tokens * entries * SVC_REPLY_ENTRY_BYTES + SVC_REPLY_FIXED_BYTES;
}

const char *svc_role_name(svc_role role)
{
    switch (role) {
    case SVC_ROLE_SYSTEM: return "system";
    case SVC_ROLE_USER: return "user";
    case SVC_ROLE_ASSISTANT: return "assistant";
    case SVC_ROLE_TOOL: return "tool";
    }
    return "user";
}

/* ---- Validators --------------------------------------------------------- */

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
}

static bool all_name_chars(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (!is_name_char(s[i]))
            return false;
    return true;
}

bool svc_valid_openai_name(const char *s, size_t len)
{
    if (len == 0 || len > SVC_OPENAI_NAME_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!is_name_char(s[i]) || s[i] == '.')
            return false;
    return true;
}

bool svc_valid_topic(const char *s, size_t len)
{
    if (len == 0 || len > SVC_TOPIC_NAME_MAX || !all_name_chars(s, len))
        return false;
    return !(len == 1 && s[0] == '.') && !(len == 2 && s[0] == '.' && s[1] == '.');
}

size_t svc_utf8_seq_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf; /* range of the second byte */
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0)
            lo = 0xa0; /* overlong */
        else if (c == 0xed)
            hi = 0x9f; /* surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0)
            lo = 0x90; /* overlong */
        else if (c == 0xf4)
            hi = 0x8f; /* above U+10FFFF */
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return len;
}

bool svc_utf8_valid(const char *s, size_t len, size_t *bad)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = svc_utf8_seq_len(u + i, len - i);
        if (k == 0) {
            if (bad)
                *bad = i;
            return false;
        }
        i += k;
    }
    return true;
}

/* ---- The reply-topic policy --------------------------------------------- */

#define POLICY_PREFIX_MARK '*'
#define INTERNAL_TOPIC_PREFIX "__"

static bool is_internal_topic(const char *s, size_t len)
{
    size_t n = sizeof INTERNAL_TOPIC_PREFIX - 1;
    return len >= n && !memcmp(s, INTERNAL_TOPIC_PREFIX, n);
}

static bool is_reserved(const svc_topic_policy *p, const char *s, size_t len)
{
    for (size_t i = 0; i < p->n_reserved; i++)
        if (strlen(p->reserved[i]) == len && !memcmp(p->reserved[i], s, len))
            return true;
    return false;
}

/* The next entry of a policy list at *at: sets *entry and *len (without the
 * comma) and moves *at past it. False at the end of the list. */
static bool next_entry(const char **at, const char **entry, size_t *len)
{
    if (!*at)
        return false;
    const char *comma = strchr(*at, ',');
    *entry = *at;
    *len = comma ? (size_t)(comma - *at) : strlen(*at);
    *at = comma ? comma + 1 : NULL;
    return true;
}

bool svc_reply_topic_allowed(const svc_topic_policy *p, const char *topic, size_t len)
{
    if (!svc_valid_topic(topic, len) || is_internal_topic(topic, len) ||
        is_reserved(p, topic, len))
        return false;
    const char *at = p->allowed, *e;
    size_t n;
    while (next_entry(&at, &e, &n)) {
        bool prefix = n > 0 && e[n - 1] == POLICY_PREFIX_MARK;
        size_t stem = prefix ? n - 1 : n;
        if (stem == 0)
            continue; /* refused by svc_topic_policy_check; never matches */
        if (prefix ? len >= stem && !memcmp(topic, e, stem) : len == n && !memcmp(topic, e, n))
            return true;
    }
    return false;
}

bool svc_topic_policy_check(const svc_topic_policy *p, char *err, size_t errlen)
{
    const char *at = p->allowed, *e;
    size_t n;
    for (size_t i = 0; next_entry(&at, &e, &n); i++) {
        bool prefix = n > 0 && e[n - 1] == POLICY_PREFIX_MARK;
        size_t stem = prefix ? n - 1 : n;
        int quote = n < SVC_TOPIC_NAME_MAX ? (int)n : SVC_TOPIC_NAME_MAX;
        /* A prefix need not be a whole name ("a." is one): its characters
         * and length are what can be checked. */
        bool valid = prefix ? stem > 0 && stem <= SVC_TOPIC_NAME_MAX && all_name_chars(e, stem)
                            : svc_valid_topic(e, n);
        if (!valid) {
            svc_errf(err, errlen,
                     "entry %zu '%.*s': expected a topic name ([A-Za-z0-9._-], 1..%d) or a "
                     "prefix of one followed by '*'",
                     i, quote, e, SVC_TOPIC_NAME_MAX);
            return false;
        }
        if (is_internal_topic(e, stem)) {
            svc_errf(err, errlen, "entry %zu '%.*s': topics starting with \"%s\" are Kafka's own",
                     i, quote, e, INTERNAL_TOPIC_PREFIX);
            return false;
        }
        if (!prefix && is_reserved(p, e, n)) {
            svc_errf(err, errlen,
                     "entry %zu '%.*s': the worker's request, cancel and dead-letter topics "
                     "never receive replies",
                     i, quote, e);
            return false;
        }
    }
    return true;
}

/* Whether entries e (n bytes) and f (m bytes) can match the same topic. */
static bool entries_overlap(const char *e, size_t n, const char *f, size_t m)
{
    bool pe = n > 0 && e[n - 1] == POLICY_PREFIX_MARK, pf = m > 0 && f[m - 1] == POLICY_PREFIX_MARK;
    size_t se = pe ? n - 1 : n, sf = pf ? m - 1 : m;
    if (!pe && !pf)
        return n == m && !memcmp(e, f, n);
    if (pe && pf) {
        size_t k = se < sf ? se : sf;
        return !memcmp(e, f, k);
    }
    /* One exact name, one prefix: the name starts with the prefix's stem. */
    const char *name = pe ? f : e, *stem = pe ? e : f;
    size_t name_len = pe ? m : n, stem_len = pe ? se : sf;
    return name_len >= stem_len && !memcmp(name, stem, stem_len);
}

bool svc_topic_policy_overlap(const svc_topic_policy *a, const svc_topic_policy *b, char *why,
                              size_t whylen)
{
    const char *at = a->allowed, *e;
    size_t n;
    while (next_entry(&at, &e, &n)) {
        const char *bt = b->allowed, *f;
        size_t m;
        while (next_entry(&bt, &f, &m))
            if (n > 0 && m > 0 && entries_overlap(e, n, f, m)) {
                svc_errf(why, whylen, "'%.*s' and '%.*s'", (int)n, e, (int)m, f);
                return true;
            }
    }
    return false;
}

bool svc_valid_tenant_name(const char *s, size_t len)
{
    if (len == 0 || len > SVC_TENANT_NAME_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' ||
              s[i] == '-'))
            return false;
    return true;
}

bool svc_valid_adapter_name(const char *s, size_t len)
{
    return len > 0 && len <= SVC_ADAPTER_NAME_MAX && s[0] != '.' && all_name_chars(s, len);
}

bool svc_valid_date_string(const char *s, size_t len)
{
    if (len == 0 || len > SVC_DATE_STRING_MAX || !svc_utf8_valid(s, len, NULL))
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        /* U+0080..U+009F (C1) is 0xC2 0x80..0x9F in valid UTF-8. */
        bool c1 = c == 0xC2 && i + 1 < len && (unsigned char)s[i + 1] <= 0x9F;
        if (c < 0x20 || c == 0x7F || c1)
            return false;
    }
    return true;
}

static bool is_lower_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

bool svc_valid_sha256(const char *s, size_t len)
{
    if (len != SVC_SHA256_HEX_LEN)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!is_lower_hex(s[i]))
            return false;
    return true;
}

bool svc_valid_traceparent(const char *s, size_t len)
{
    static const size_t field_len[4] = {2, 32, 16, 2};
    if (len != SVC_TRACEPARENT_LEN)
        return false;
    size_t at = 0;
    for (int f = 0; f < 4; f++) {
        bool nonzero = false;
        for (size_t i = 0; i < field_len[f]; i++, at++) {
            if (!is_lower_hex(s[at]))
                return false;
            nonzero |= s[at] != '0';
        }
        if ((f == 1 || f == 2) && !nonzero)
            return false;
        if (f < 3 && s[at++] != '-')
            return false;
    }
    return !(s[0] == 'f' && s[1] == 'f');
}
