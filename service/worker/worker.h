/* mllama-worker: Kafka in, the Mllama runtime, streamed replies out, Redis
 * as the cluster's index (service/README.md §1, §3, §6, §8; service/protocol/README.md).
 *
 * Delivery contract (at-least-once): a request's offset is stored only after
 * its final record (or its dead-letter copy) is acknowledged by the broker,
 * per partition up to the first unfinished request. A worker that dies
 * mid-request leaves it to be consumed again: the next execution is a new
 * `attempt` whose records start again at seq 0, and a frontend resets its
 * text when the attempt changes. Attempts are counted in Redis per request
 * id (1, 2, ...: a client's retry under the same id is a new attempt too,
 * and replaces an older execution running on this worker);
 * an execution Redis cannot count (no Redis, or its breaker open) may still
 * be a re-execution, so it takes a number of 2^31 or more, unique to it.
 * Records of one attempt are never duplicated (idempotent producer). A
 * record the producer gives up on (message.timeout.ms) ends the process
 * with SVC_WORKER_EXIT_KAFKA: once its loss is reported no offset is stored
 * and nothing more is sent (what is still queued is purged), so its request
 * runs again as a new attempt. Records produced after the lost one may have
 * gone out before the report came: a frontend treats a gap in an attempt's
 * seqs as an attempt that will be superseded.
 *
 * @locality: create, run and destroy on the main thread; request_stop from
 * anywhere (a signal handler included). */
#ifndef SVC_WORKER_H
#define SVC_WORKER_H

#include <stddef.h>

#include "config.h"

typedef struct svc_worker svc_worker;

/* Exit codes of `mllama worker` (config/README.md "Exit codes"; README.md
 * "Contributing", Errors: process-level errors exit with a distinct code so
 * the orchestrator restarts the worker). */
typedef enum svc_worker_exit {
    SVC_WORKER_EXIT_OK = 0,
    SVC_WORKER_EXIT_CONFIG = 3,  /* configuration invalid */
    SVC_WORKER_EXIT_MODEL = 4,   /* model could not be loaded */
    SVC_WORKER_EXIT_KAFKA = 5,   /* Kafka fatal error */
    SVC_WORKER_EXIT_DEVICE = 6,  /* the backend failed while running */
} svc_worker_exit;

/* Load the model, connect everything, start the threads. cfg is copied (its
 * kafka properties are moved: cfg->kafka.n_props becomes 0). Returns NULL
 * with the reason and an exit code in *code. */
svc_worker *svc_worker_create(svc_config *cfg, int *code, char *err, size_t errlen);

/* The Kafka loop, until a stop request has drained or a process-level error.
 * Returns the exit code. */
int svc_worker_run(svc_worker *w);

/* Ask for a graceful drain (async-signal-safe). */
void svc_worker_request_stop(svc_worker *w);


/* Join the threads and free everything. NULL is a no-op. */
void svc_worker_destroy(svc_worker *w);

#endif
