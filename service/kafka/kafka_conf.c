/* Configuration and error helpers shared by the Kafka layer (kafka_conf.h).
 * @locality any thread; log_cb runs on librdkafka's internal threads. */
#include "kafka/kafka_conf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

const char *svc_kafka_status_name(svc_kafka_status st)
{
    switch (st) {
    case SVC_KAFKA_OK: return "ok";
    case SVC_KAFKA_NO_MESSAGE: return "no_message";
    case SVC_KAFKA_ERR_CONFIG: return "config";
    case SVC_KAFKA_ERR_QUEUE_FULL: return "queue_full";
    case SVC_KAFKA_ERR_TOO_LARGE: return "too_large";
    case SVC_KAFKA_ERR_TOPIC: return "topic";
    case SVC_KAFKA_ERR_STALE: return "stale";
    case SVC_KAFKA_ERR_INVALID: return "invalid";
    case SVC_KAFKA_ERR_TIMED_OUT: return "timed_out";
    case SVC_KAFKA_ERR_FATAL: return "fatal";
    case SVC_KAFKA_ERR_NOMEM: return "out_of_memory";
    case SVC_KAFKA_ERR_KAFKA: return "kafka";
    }
    return "unknown";
}

svc_kafka_status svc_kafka_record_status(rd_kafka_resp_err_t err)
{
    switch (err) {
    case RD_KAFKA_RESP_ERR_NO_ERROR: return SVC_KAFKA_OK;
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE: return SVC_KAFKA_ERR_TOO_LARGE;
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD: return SVC_KAFKA_ERR_TOPIC;
    case RD_KAFKA_RESP_ERR__FATAL: return SVC_KAFKA_ERR_FATAL;
    default: return SVC_KAFKA_ERR_KAFKA;
    }
}

size_t svc_kafka_headers_bytes(const rd_kafka_headers_t *hdrs)
{
    size_t n = 0;
    const char *name;
    const void *value;
    size_t len;
    for (size_t i = 0; hdrs && !rd_kafka_header_get_all(hdrs, i, &name, &value, &len); i++)
        n += strlen(name) + len;
    return n;
}

svc_kafka_status svc_kafka_fail(char *err, size_t errlen, svc_kafka_status st, const char *fmt,
                                ...)
{
    va_list ap;
    va_start(ap, fmt);
    svc_verrf(err, errlen, fmt, ap);
    va_end(ap);
    return st;
}

long svc_kafka_kv_long(const svc_kafka_kv *kv, size_t n, const char *key, long dflt)
{
    long v = dflt;
    for (size_t i = 0; i < n; i++)
        if (kv[i].key && kv[i].value && !strcmp(kv[i].key, key))
            v = strtol(kv[i].value, NULL, 10);
    return v;
}

void svc_kafka_log_error(rd_kafka_t *rk, const char *role, int err, const char *reason)
{
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        char buf[512];
        rd_kafka_fatal_error(rk, buf, sizeof buf);
        svc_log(SVC_LOG_ERROR, "kafka.fatal", "%s: %s", role, buf);
        return;
    }
    svc_log(SVC_LOG_WARN, "kafka.error", "%s: %s: %s", role,
            rd_kafka_err2name((rd_kafka_resp_err_t)err), reason);
}

/* librdkafka's log lines, mapped from syslog levels. Runs on librdkafka's
 * internal threads. */
static void log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    enum { SYSLOG_ERR = 3, SYSLOG_WARNING = 4, SYSLOG_INFO = 6 };
    svc_log_level l = level <= SYSLOG_ERR       ? SVC_LOG_ERROR
                      : level == SYSLOG_WARNING ? SVC_LOG_WARN
                      : level <= SYSLOG_INFO    ? SVC_LOG_INFO
                                                : SVC_LOG_DEBUG;
    svc_log(l, "kafka.rdkafka", "%s %s: %s", rd_kafka_name(rk), fac, buf);
}

static const svc_kafka_fixed *find_fixed(const svc_kafka_fixed *fixed, size_t n, const char *key)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(fixed[i].key, key))
            return &fixed[i];
    return NULL;
}

static svc_kafka_status set(rd_kafka_conf_t *conf, const char *key, const char *value, char *err,
                            size_t errlen)
{
    char why[512];
    switch (rd_kafka_conf_set(conf, key, value, why, sizeof why)) {
    case RD_KAFKA_CONF_OK:
        return SVC_KAFKA_OK;
    case RD_KAFKA_CONF_UNKNOWN:
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG, "kafka.%s: unknown property",
                              key);
    case RD_KAFKA_CONF_INVALID:
        break;
    }
    return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG, "kafka.%s: %s", key, why);
}

svc_kafka_status svc_kafka_conf_build(const svc_kafka_kv *defaults, size_t n_defaults,
                                      const svc_kafka_kv *user, size_t n_user,
                                      const svc_kafka_fixed *fixed, size_t n_fixed,
                                      rd_kafka_conf_t **out, char *err, size_t errlen)
{
    *out = NULL;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (!conf)
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_NOMEM, "rd_kafka_conf_new failed");
    svc_kafka_status st = SVC_KAFKA_OK;
    for (size_t i = 0; st == SVC_KAFKA_OK && i < n_defaults; i++)
        if (defaults[i].value)
            st = set(conf, defaults[i].key, defaults[i].value, err, errlen);
    for (size_t i = 0; st == SVC_KAFKA_OK && i < n_user; i++) {
        const svc_kafka_kv *kv = &user[i];
        if (!kv->key || !*kv->key || !kv->value) {
            st = svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG,
                                "kafka[%zu]: a property needs a key and a string value", i);
            break;
        }
        const svc_kafka_fixed *f = find_fixed(fixed, n_fixed, kv->key);
        if (f)
            st = svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG,
                                "kafka.%s: fixed to %s by the worker (%s)", f->key, f->value,
                                f->why);
        else
            st = set(conf, kv->key, kv->value, err, errlen);
    }
    for (size_t i = 0; st == SVC_KAFKA_OK && i < n_fixed; i++)
        st = set(conf, fixed[i].key, fixed[i].value, err, errlen);
    if (st != SVC_KAFKA_OK) {
        rd_kafka_conf_destroy(conf);
        return st;
    }
    rd_kafka_conf_set_log_cb(conf, log_cb);
    *out = conf;
    return SVC_KAFKA_OK;
}
