/* Internal to the Kafka layer (kafka_*.c, mock_kafka.c): configuration
 * building, the librdkafka log bridge and error helpers shared by the
 * consumer and the producer. Not part of the worker's API (that is kafka.h). */
#ifndef SVC_KAFKA_CONF_H
#define SVC_KAFKA_CONF_H

#include "kafka/kafka.h"
#include "util.h"

/* A property the worker's correctness depends on, with the reason given when
 * a pass-through property tries to change it. */
typedef struct svc_kafka_fixed {
    const char *key;
    const char *value;
    const char *why;
} svc_kafka_fixed;

/* Build a configuration: `defaults` (NULL values skipped), then the
 * pass-through `user` properties, then `fixed`; a user property naming a
 * fixed key is refused. Errors name the property as "kafka.<key>". Returns
 * OK and *out (owned by the caller), or ERR_CONFIG / ERR_NOMEM with *out
 * NULL. The librdkafka log goes to svc_log. @locality any. */
svc_kafka_status svc_kafka_conf_build(const svc_kafka_kv *defaults, size_t n_defaults,
                                      const svc_kafka_kv *user, size_t n_user,
                                      const svc_kafka_fixed *fixed, size_t n_fixed,
                                      rd_kafka_conf_t **out, char *err, size_t errlen);

/* Bytes of a header set's names and values (0 for NULL): what a dead
 * letter's SVC_DLT_META_MAX counts. @locality any. */
size_t svc_kafka_headers_bytes(const rd_kafka_headers_t *hdrs);

/* printf into err (if non-NULL) and return st: error paths are one line. */
/* Log a librdkafka global error of `role`'s handle ("consumer",
 * "producer"): a fatal one with its cause (rd_kafka_fatal_error), others as
 * warnings. The body of both handles' error_cb. */
void svc_kafka_log_error(rd_kafka_t *rk, const char *role, int err, const char *reason);

svc_kafka_status svc_kafka_fail(char *err, size_t errlen, svc_kafka_status st, const char *fmt,
                                ...) __attribute__((format(printf, 4, 5)));

#endif
