/* `mllama mock-kafka`: run librdkafka's mock cluster until SIGINT/SIGTERM so
 * several workers and kcat can share one. The bootstrap servers go to
 * stdout as one line (and to --port-file); logs go to stderr. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "log.h"
#include "kafka/mock_kafka.h"
#include "protocol/protocol.h"

#define MAX_TOPIC_ERRORS 16

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mllama mock-kafka [--brokers N] [--topics SPEC] [--port-file FILE]\n"
            "                         [--topic-error TOPIC=ERROR]...\n"
            "\n"
            "Runs librdkafka's in-process mock Kafka cluster on 127.0.0.1 until SIGINT or\n"
            "SIGTERM, and prints its bootstrap servers on stdout as one line.\n"
            "\n"
            "  --brokers N       number of brokers, 1..%d (default 3)\n"
            "  --topics SPEC     topics to create, name:partitions[,...]\n"
            "                    (default %s)\n"
            "  --port-file FILE  also write the bootstrap servers to FILE (written whole,\n"
            "                    by rename; removed on exit)\n"
            "  --topic-error TOPIC=ERROR\n"
            "                    create TOPIC if needed and answer every client's metadata\n"
            "                    request for it with the broker error ERROR, a librdkafka\n"
            "                    name such as UNKNOWN_TOPIC_OR_PART (a topic the cluster\n"
            "                    does not have: this mock creates every topic a producer\n"
            "                    names, whatever allow.auto.create.topics says); up to %d\n",
            SVC_MOCK_KAFKA_MAX_BROKERS, SVC_MOCK_KAFKA_DEFAULT_TOPICS, MAX_TOPIC_ERRORS);
}

/* The broker error called `name` (rd_kafka_err2name without its
 * "RD_KAFKA_RESP_ERR_" prefix, as in "TOPIC_AUTHORIZATION_FAILED"); false
 * for a name that is not one, or a local (negative) error. */
static bool broker_error(const char *name, rd_kafka_resp_err_t *out)
{
    const struct rd_kafka_err_desc *descs;
    size_t n;
    rd_kafka_get_err_descs(&descs, &n);
    for (size_t i = 0; i < n; i++)
        if (descs[i].name && descs[i].code > 0 && !strcmp(descs[i].name, name)) {
            *out = descs[i].code;
            return true;
        }
    return false;
}

/* Write `line` to path through a temporary file and rename, so a reader
 * polling for the file never sees it half-written. Returns 0 or -1 (errno). */
static int write_whole(const char *path, const char *line)
{
    size_t n = strlen(path) + sizeof ".tmp";
    char *tmp = malloc(n);
    if (!tmp)
        return -1;
    snprintf(tmp, n, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    int rc = -1;
    if (f) {
        int ok = fprintf(f, "%s\n", line) >= 0;
        ok = (fclose(f) == 0) && ok;
        rc = ok && rename(tmp, path) == 0 ? 0 : -1;
        if (rc)
            remove(tmp);
    }
    free(tmp);
    return rc;
}

int cmd_mock_kafka(int argc, char **argv)
{
    int brokers = 3;
    const char *topics = SVC_MOCK_KAFKA_DEFAULT_TOPICS;
    const char *port_file = NULL;
    const char *topic_errors[MAX_TOPIC_ERRORS];
    int n_topic_errors = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return SVC_EXIT_OK;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "mock-kafka: %s needs a value\n", a);
            usage(stderr);
            return SVC_EXIT_USAGE;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--brokers")) {
            char *end;
            errno = 0;
            long n = strtol(v, &end, 10);
            if (errno || *end || end == v || n < 1 || n > SVC_MOCK_KAFKA_MAX_BROKERS) {
                fprintf(stderr, "mock-kafka: --brokers: '%s' is not in 1..%d\n", v,
                        SVC_MOCK_KAFKA_MAX_BROKERS);
                return SVC_EXIT_USAGE;
            }
            brokers = (int)n;
        } else if (!strcmp(a, "--topics")) {
            topics = v;
        } else if (!strcmp(a, "--port-file")) {
            port_file = v;
        } else if (!strcmp(a, "--topic-error")) {
            const char *eq = strchr(v, '=');
            rd_kafka_resp_err_t e;
            if (!eq || !svc_valid_topic(v, (size_t)(eq - v)) || !broker_error(eq + 1, &e) ||
                n_topic_errors == MAX_TOPIC_ERRORS) {
                fprintf(stderr,
                        "mock-kafka: --topic-error: '%s' is not TOPIC=ERROR with a topic name "
                        "and a broker error name (at most %d)\n",
                        v, MAX_TOPIC_ERRORS);
                return SVC_EXIT_USAGE;
            }
            topic_errors[n_topic_errors++] = v;
        } else {
            fprintf(stderr, "mock-kafka: unknown option '%s'\n", a);
            usage(stderr);
            return SVC_EXIT_USAGE;
        }
    }

    /* stdout carries the bootstrap line only. */
    svc_log_set_output(stderr);

    /* Block the stop signals before the cluster starts its threads (they
     * inherit the mask), so only sigwait below ever receives them. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);

    char err[512];
    svc_mock_kafka *m;
    if (svc_mock_kafka_create(brokers, topics, &m, err, sizeof err) != SVC_KAFKA_OK) {
        fprintf(stderr, "mock-kafka: %s\n", err);
        return SVC_EXIT_FAILURE;
    }
    for (int i = 0; i < n_topic_errors; i++) {
        const char *eq = strchr(topic_errors[i], '=');
        char topic[SVC_TOPIC_NAME_MAX + 1];
        snprintf(topic, sizeof topic, "%.*s", (int)(eq - topic_errors[i]), topic_errors[i]);
        rd_kafka_resp_err_t e = RD_KAFKA_RESP_ERR_NO_ERROR;
        broker_error(eq + 1, &e);
        rd_kafka_mock_topic_set_error(svc_mock_kafka_cluster(m), topic, e);
        svc_log(SVC_LOG_INFO, "kafka.mock_topic_error", "%s answers %s", topic, eq + 1);
    }
    const char *bootstraps = svc_mock_kafka_bootstraps(m);
    if (port_file && write_whole(port_file, bootstraps) != 0) {
        fprintf(stderr, "mock-kafka: --port-file %s: %s\n", port_file, strerror(errno));
        svc_mock_kafka_destroy(m);
        return SVC_EXIT_FAILURE;
    }
    printf("%s\n", bootstraps);
    fflush(stdout);

    int sig = 0;
    sigwait(&stop, &sig);
    svc_log(SVC_LOG_INFO, "kafka.mock", "signal %d: stopping", sig);
    if (port_file)
        remove(port_file);
    svc_mock_kafka_destroy(m);
    return SVC_EXIT_OK;
}
