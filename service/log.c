/* JSON-lines logging (log.h). @locality any thread. */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

/* A formatted message longer than this is cut; a log line is not a payload. */
#define LOG_MSG_MAX 2048
/* Worst case: every message byte escaped as \u00XX, plus the fixed fields. */
#define LOG_LINE_MAX (LOG_MSG_MAX * 6 + 256)

static atomic_int log_threshold = SVC_LOG_INFO;
static FILE *log_out; /* NULL = stdout; set before threads start */

/* Stable lower-case name of a level. Never NULL. */
static const char *level_name(svc_log_level level)
{
    switch (level) {
    case SVC_LOG_DEBUG: return "debug";
    case SVC_LOG_INFO: return "info";
    case SVC_LOG_WARN: return "warn";
    case SVC_LOG_ERROR: return "error";
    }
    return "info";
}

int svc_log_level_parse(const char *name, svc_log_level *level)
{
    static const svc_log_level all[] = {SVC_LOG_DEBUG, SVC_LOG_INFO, SVC_LOG_WARN, SVC_LOG_ERROR};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (name && !strcmp(name, level_name(all[i]))) {
            *level = all[i];
            return 0;
        }
    return -1;
}

void svc_log_set_level(svc_log_level level)
{
    atomic_store(&log_threshold, (int)level);
}

void svc_log_set_output(FILE *f)
{
    log_out = f;
}

/* Append `src` to dst[*pos..cap) as the inside of a JSON string. Control
 * characters, quotes and backslashes are escaped; other bytes pass through
 * (the message is UTF-8 from our own format strings). */
static void json_escape(char *dst, size_t cap, size_t *pos, const char *src)
{
    static const char hex[] = "0123456789abcdef";
    size_t p = *pos;
    for (const unsigned char *s = (const unsigned char *)src; *s && p + 7 < cap; s++) {
        switch (*s) {
        case '"': dst[p++] = '\\'; dst[p++] = '"'; break;
        case '\\': dst[p++] = '\\'; dst[p++] = '\\'; break;
        case '\n': dst[p++] = '\\'; dst[p++] = 'n'; break;
        case '\r': dst[p++] = '\\'; dst[p++] = 'r'; break;
        case '\t': dst[p++] = '\\'; dst[p++] = 't'; break;
        default:
            if (*s < 0x20) {
                memcpy(dst + p, "\\u00", 4);
                dst[p + 4] = hex[*s >> 4];
                dst[p + 5] = hex[*s & 15];
                p += 6;
            } else {
                dst[p++] = (char)*s;
            }
        }
    }
    *pos = p;
}

void svc_log(svc_log_level level, const char *event, const char *fmt, ...)
{
    if ((int)level < atomic_load(&log_threshold))
        return;

    char msg[LOG_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);

    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct tm utc;
    gmtime_r(&now.tv_sec, &utc);

    char line[LOG_LINE_MAX];
    int n = snprintf(line, sizeof line,
                     "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\","
                     "\"event\":\"%s\",\"msg\":\"",
                     utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min,
                     utc.tm_sec, now.tv_nsec / 1000000, level_name(level), event);
    if (n < 0 || (size_t)n >= sizeof line)
        return;
    size_t pos = (size_t)n;
    json_escape(line, sizeof line - 3, &pos, msg);
    memcpy(line + pos, "\"}\n", 3);
    pos += 3;

    FILE *out = log_out ? log_out : stdout;
    flockfile(out);
    fwrite(line, 1, pos, out);
    fflush(out);
    funlockfile(out);
}
