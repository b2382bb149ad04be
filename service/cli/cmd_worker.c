/* `mllama worker`: the consumer microservice (service/worker/worker.h). */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "log.h"
#include "worker/worker.h"

static svc_worker *running;

static void on_signal(int sig)
{
    (void)sig;
    if (running)
        svc_worker_request_stop(running);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mllama worker [--config FILE] [--set section.key=value]...\n\n"
               "Consumes chat requests from Kafka, runs the model and streams replies.\n"
               "Without --config the embedded defaults (config/local.json) apply:\n"
               "an in-process mock Kafka cluster and a generated tiny model.\n"
               "Environment overrides: MLLAMA_<SECTION>_<KEY>, e.g. MLLAMA_KAFKA_BROKERS.\n"
               "SIGTERM drains: readiness off, in-flight requests finish (or are\n"
               "cancelled after drain.grace_ms), offsets are committed, exit 0.\n");
}

int cmd_worker(int argc, char **argv)
{
    svc_cli_config_args args = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return SVC_EXIT_OK;
        }
        if (!svc_cli_config_option(&args, argc, argv, &i)) {
            usage(stderr);
            return SVC_EXIT_USAGE;
        }
    }
    svc_config cfg;
    if (svc_cli_load_config(&args, &cfg))
        return SVC_WORKER_EXIT_CONFIG;
    char err[1024];
    int code = 0;
    svc_worker *w = svc_worker_create(&cfg, &code, err, sizeof err);
    svc_config_deinit(&cfg);
    if (!w) {
        svc_log(SVC_LOG_ERROR, "worker_start", "%s", err);
        return code;
    }
    running = w;
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    code = svc_worker_run(w);
    running = NULL;
    svc_worker_destroy(w);
    return code;
}
