/* `mllama gateway`: the OpenAI-compatible HTTP front over the Kafka contract
 * (service/README.md, "The gateway"). It produces each chat request to its
 * tenant's request topic, reads the replies from reply topics of its own, and
 * turns them into OpenAI's chat.completion(.chunk) answers and server-sent
 * events that survive the loss of a worker mid-stream.
 *
 * One thread runs everything: a libevent loop holding the public listener
 * (gateway.listen), the probe listener (http.listen: /healthz, /readyz,
 * /metrics), librdkafka's reply queue (woken through a pipe) and the timers.
 * (With redis.url, a second thread lists the adapters stored in Redis for
 * /v1/models; the loop never waits on Redis.)
 * SIGTERM and SIGINT drain it (/readyz and new requests 503, the running
 * streams end within drain.grace_ms, then it stops; a second signal stops
 * it at once), SIGHUP reloads gateway.api_keys_file.
 * @locality: the main thread, which becomes the loop's. */
#ifndef SVC_GATEWAY_H
#define SVC_GATEWAY_H

#include "config.h"

/* Exit codes, as the worker's (config/README.md, "Exit codes"). */
enum {
    SVC_GATEWAY_EXIT_CONFIG = 3, /* configuration, listeners, keys file */
    SVC_GATEWAY_EXIT_KAFKA = 5,  /* the cluster refused the reply topics; producer fatal */
};

typedef struct svc_gateway svc_gateway;

/* Check the configuration, load the keys, create and assign the reply topics
 * and bind both listeners. port_file (NULL: none) receives "<port>
 * <ops_port>\n" once bound (written whole, by rename). cfg is copied.
 * Returns the gateway, or NULL with *code and a message in err. */
svc_gateway *svc_gateway_create(const svc_config *cfg, const char *port_file, int *code,
                                char *err, size_t errlen);

/* Serve until a drain ends (SIGTERM or SIGINT), a second signal or a fatal
 * Kafka error. Returns the exit code: 0 after a signal. */
int svc_gateway_run(svc_gateway *g);

/* Close every connection, flush the producer, free. NULL is a no-op. */
void svc_gateway_destroy(svc_gateway *g);

#endif
