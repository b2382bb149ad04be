/* librdkafka's built-in mock cluster, started in-process: real Kafka
 * protocol listeners on 127.0.0.1 with random ports (service/README.md §6).
 *
 * Used when the config says `kafka.brokers: "mock"` (the worker then passes
 * svc_mock_kafka_bootstraps() as its brokers), by `mllama mock-kafka` to run
 * one for several processes and kcat, and by the Kafka tests (fault
 * injection goes through svc_mock_kafka_cluster()).
 *
 * The cluster is created explicitly on a dedicated handle rather than with
 * test.mock.num.brokers, because that property gives every client its own
 * private cluster, while a consumer group and a producer must share one
 * (service/README.md §6). Facts of the 2.0.2 mock that callers
 * feel: a group's first join takes about 3 s (fixed initial rebalance
 * delay); a later rebalance waits about session.timeout.ms - 1 s; a topic
 * named in Metadata by a client that allows auto-creation (a producer) is
 * created with 4 partitions, a consumer's subscription creates nothing; each
 * partition keeps at most 5 MiB or 100000 batches. */
#ifndef SVC_MOCK_KAFKA_H
#define SVC_MOCK_KAFKA_H

#include "kafka/kafka.h" /* before rdkafka_mock.h, which needs rdkafka.h first */

#include <librdkafka/rdkafka_mock.h>

/* The topics `mllama mock-kafka` creates when --topics is not given. */
#define SVC_MOCK_KAFKA_DEFAULT_TOPICS "requests:8,replies:8,dlt:1,cancel:1"
/* Upper bounds for hostile command lines. */
#define SVC_MOCK_KAFKA_MAX_BROKERS 16
#define SVC_MOCK_KAFKA_MAX_PARTITIONS 1024
#define SVC_MOCK_KAFKA_MAX_TOPICS 256

typedef struct svc_mock_kafka svc_mock_kafka;

/* Start a cluster of n_brokers (1..SVC_MOCK_KAFKA_MAX_BROKERS) and create the
 * topics in `topics`: "name:partitions[,name:partitions...]", names of
 * [A-Za-z0-9._-] up to 249 characters, each listed once, partitions
 * 1..MAX_PARTITIONS, at most MAX_TOPICS entries; NULL or "" creates none. Replication factor min(3, n_brokers). Returns OK and *out
 * (owned), or ERR_CONFIG (err names the bad topic entry), ERR_NOMEM or
 * ERR_KAFKA; *out NULL. @locality any; the cluster runs on its own thread. */
svc_kafka_status svc_mock_kafka_create(int n_brokers, const char *topics, svc_mock_kafka **out,
                                       char *err, size_t errlen);

/* "127.0.0.1:port,..." for bootstrap.servers; borrowed, lives as long as m.
 * @locality any. */
const char *svc_mock_kafka_bootstraps(const svc_mock_kafka *m);

/* The librdkafka mock handle, for fault injection (rdkafka_mock.h);
 * borrowed. @locality any (the mock API is thread-safe). */
rd_kafka_mock_cluster_t *svc_mock_kafka_cluster(svc_mock_kafka *m);

/* Stop the brokers and free (librdkafka takes about 1 s to stop the mock's
 * thread). Clients still connected see their brokers go down; destroy them
 * first for a quiet exit. NULL is a no-op. @locality any. */
void svc_mock_kafka_destroy(svc_mock_kafka *m);

#endif
