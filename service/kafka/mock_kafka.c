/* The in-process mock cluster (mock_kafka.h). @locality the caller's thread
 * for everything here; the cluster itself runs on librdkafka's mock thread. */
#include "kafka/mock_kafka.h"

#include <stdlib.h>
#include <string.h>

#include "kafka/kafka_conf.h"
#include "log.h"

/* Kafka's own limit on topic name length. */
#define TOPIC_NAME_MAX 249
/* How much of a bad entry an error message quotes. */
#define QUOTE_MAX 64
/* Replication factor of created topics: min(this, brokers), as Kafka's default. */
#define MAX_REPLICATION 3

struct svc_mock_kafka {
    rd_kafka_t *rk;                /* owned; bookkeeping handle the cluster hangs on */
    rd_kafka_mock_cluster_t *mc;   /* owned */
    char *bootstraps;              /* owned */
};

static bool topic_char_ok(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '_' || ch == '-';
}

/* Parse one "name:partitions" entry, spec[0..len). On success copies the
 * name into name[TOPIC_NAME_MAX + 1] and sets *parts. */
static svc_kafka_status parse_entry(const char *spec, size_t len, size_t idx, char *name,
                                    int *parts, char *err, size_t errlen)
{
    const char *colon = memchr(spec, ':', len);
    size_t name_len = colon ? (size_t)(colon - spec) : len;
    int quote = len < QUOTE_MAX ? (int)len : QUOTE_MAX;
    if (!colon || name_len == 0 || name_len > TOPIC_NAME_MAX)
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG,
                              "topics entry %zu '%.*s': expected name:partitions with a name "
                              "of 1..%d characters",
                              idx, quote, spec, TOPIC_NAME_MAX);
    for (size_t i = 0; i < name_len; i++)
        if (!topic_char_ok(spec[i]))
            return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG,
                                  "topics entry %zu '%.*s': a topic name uses only "
                                  "[A-Za-z0-9._-]",
                                  idx, quote, spec);
    long n = 0;
    const char *digits = colon + 1, *end = spec + len;
    for (const char *d = digits; d < end; d++) {
        if (*d < '0' || *d > '9' || n > SVC_MOCK_KAFKA_MAX_PARTITIONS) {
            n = -1;
            break;
        }
        n = n * 10 + (*d - '0');
    }
    if (digits == end || n < 1 || n > SVC_MOCK_KAFKA_MAX_PARTITIONS)
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG,
                              "topics entry %zu '%.*s': partitions must be 1..%d", idx, quote,
                              spec, SVC_MOCK_KAFKA_MAX_PARTITIONS);
    memcpy(name, spec, name_len);
    name[name_len] = '\0';
    *parts = (int)n;
    return SVC_KAFKA_OK;
}

typedef struct topic_spec {
    char name[TOPIC_NAME_MAX + 1];
    int parts;
} topic_spec;

/* Parse the whole specification before anything starts. Returns OK with
 * *out (owned; NULL when the spec is empty) and *n, or ERR_CONFIG/NOMEM. */
static svc_kafka_status parse_topics(const char *spec, topic_spec **out, size_t *n, char *err,
                                     size_t errlen)
{
    *out = NULL;
    *n = 0;
    if (!spec || !*spec)
        return SVC_KAFKA_OK;
    size_t cap = 1;
    for (const char *s = spec; *s; s++)
        cap += *s == ',';
    if (cap > SVC_MOCK_KAFKA_MAX_TOPICS)
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG, "topics: %zu entries, at most %d",
                              cap, SVC_MOCK_KAFKA_MAX_TOPICS);
    topic_spec *t = calloc(cap, sizeof *t);
    if (!t)
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_NOMEM, "out of memory");
    svc_kafka_status st = SVC_KAFKA_OK;
    const char *s = spec;
    for (size_t idx = 0; st == SVC_KAFKA_OK && idx < cap; idx++) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        if (len == 0 && !comma)
            st = svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG,
                                "topics entry %zu: empty after the last ','", idx);
        else
            st = parse_entry(s, len, idx, t[idx].name, &t[idx].parts, err, errlen);
        for (size_t j = 0; st == SVC_KAFKA_OK && j < idx; j++)
            if (!strcmp(t[j].name, t[idx].name))
                st = svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG,
                                    "topics entry %zu: topic %s is listed twice", idx,
                                    t[idx].name);
        s += len + 1;
    }
    if (st != SVC_KAFKA_OK) {
        free(t);
        return st;
    }
    *out = t;
    *n = cap;
    return SVC_KAFKA_OK;
}

void svc_mock_kafka_destroy(svc_mock_kafka *m)
{
    if (!m)
        return;
    if (m->mc)
        rd_kafka_mock_cluster_destroy(m->mc);
    if (m->rk)
        rd_kafka_destroy(m->rk);
    free(m->bootstraps);
    free(m);
}

svc_kafka_status svc_mock_kafka_create(int n_brokers, const char *topics, svc_mock_kafka **out,
                                       char *err, size_t errlen)
{
    *out = NULL;
    if (n_brokers < 1 || n_brokers > SVC_MOCK_KAFKA_MAX_BROKERS)
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG, "brokers: %d is not in 1..%d",
                              n_brokers, SVC_MOCK_KAFKA_MAX_BROKERS);
    topic_spec *topics_parsed;
    size_t n_topics;
    svc_kafka_status st = parse_topics(topics, &topics_parsed, &n_topics, err, errlen);
    if (st != SVC_KAFKA_OK)
        return st;
    rd_kafka_conf_t *conf;
    const svc_kafka_kv defaults[] = {
        {"client.id", "mllama-mock-kafka"},
        /* The handle only carries the cluster: its notice that it has no
         * bootstrap.servers would mislead; warnings and errors still show. */
        {"log_level", "4"},
    };
    st = svc_kafka_conf_build(defaults, sizeof defaults / sizeof defaults[0], NULL, 0, NULL, 0,
                              &conf, err, errlen);
    svc_mock_kafka *m = st == SVC_KAFKA_OK ? calloc(1, sizeof *m) : NULL;
    if (st == SVC_KAFKA_OK && !m) {
        rd_kafka_conf_destroy(conf);
        st = svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_NOMEM, "out of memory");
    }
    if (st != SVC_KAFKA_OK) {
        free(topics_parsed);
        return st;
    }
    char why[512];
    m->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, why, sizeof why);
    if (!m->rk) {
        rd_kafka_conf_destroy(conf);
        st = svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_KAFKA, "mock handle: %s", why);
    } else if (!(m->mc = rd_kafka_mock_cluster_new(m->rk, n_brokers))) {
        st = svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_KAFKA, "mock cluster: could not start");
    } else if (!(m->bootstraps = strdup(rd_kafka_mock_cluster_bootstraps(m->mc)))) {
        st = svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_NOMEM, "out of memory");
    }
    int rf = n_brokers < MAX_REPLICATION ? n_brokers : MAX_REPLICATION;
    for (size_t i = 0; st == SVC_KAFKA_OK && i < n_topics; i++) {
        rd_kafka_resp_err_t e = rd_kafka_mock_topic_create(m->mc, topics_parsed[i].name,
                                                           topics_parsed[i].parts, rf);
        if (e)
            st = svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_KAFKA, "topic %s: %s",
                                topics_parsed[i].name, rd_kafka_err2str(e));
        else
            svc_log(SVC_LOG_INFO, "kafka.mock_topic", "created %s with %d partitions",
                    topics_parsed[i].name, topics_parsed[i].parts);
    }
    free(topics_parsed);
    if (st != SVC_KAFKA_OK) {
        svc_mock_kafka_destroy(m);
        return st;
    }
    svc_log(SVC_LOG_INFO, "kafka.mock", "mock cluster of %d brokers at %s", n_brokers,
            m->bootstraps);
    *out = m;
    return SVC_KAFKA_OK;
}

const char *svc_mock_kafka_bootstraps(const svc_mock_kafka *m)
{
    return m->bootstraps;
}

rd_kafka_mock_cluster_t *svc_mock_kafka_cluster(svc_mock_kafka *m)
{
    return m->mc;
}
