/* `mllama gateway`: the OpenAI-compatible HTTP gateway
 * (service/gateway/gateway.h), and `--new-key TENANT`, which prints a fresh
 * API key and the keys-file line that admits it. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "gateway/gateway.h"
#include "gateway/gw_auth.h"
#include "log.h"

#define KEY_LINE_MAX 256

static void usage(FILE *f)
{
    fprintf(f, "usage: mllama gateway [--config FILE] [--set section.key=value]...\n"
               "                      [--port-file FILE]\n"
               "       mllama gateway --new-key TENANT\n\n"
               "Serves the OpenAI chat API (POST /v1/chat/completions, GET /v1/models,\n"
               "resumable streams) and the chat page on gateway.listen, over the workers'\n"
               "Kafka topics; /healthz, /readyz and /metrics on http.listen. The same\n"
               "configuration as the worker's (config/README.md, the gateway section).\n"
               "--port-file FILE: write \"<port> <ops_port>\" there once listening.\n"
               "--new-key TENANT: print a new API key on stdout and its line for\n"
               "gateway.api_keys_file on stderr (the file keeps only its sha256).\n"
               "SIGTERM stops; SIGHUP reloads gateway.api_keys_file.\n");
}

static int new_key(const char *tenant)
{
    char key[GW_KEY_LEN + 1], line[KEY_LINE_MAX];
    if (gw_new_key(key, sizeof key, line, sizeof line, tenant)) {
        fprintf(stderr, "mllama gateway: --new-key %s: %s\n", tenant, strerror(errno));
        return SVC_EXIT_FAILURE;
    }
    printf("%s\n", key);
    fprintf(stderr, "%s\n", line);
    return SVC_EXIT_OK;
}

int cmd_gateway(int argc, char **argv)
{
    svc_cli_config_args args = {0};
    const char *port_file = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return SVC_EXIT_OK;
        }
        if (svc_cli_config_option(&args, argc, argv, &i))
            continue;
        if (i + 1 >= argc) {
            usage(stderr);
            return SVC_EXIT_USAGE;
        }
        if (!strcmp(argv[i], "--new-key"))
            return new_key(argv[i + 1]);
        if (!strcmp(argv[i], "--port-file"))
            port_file = argv[++i];
        else {
            usage(stderr);
            return SVC_EXIT_USAGE;
        }
    }
    svc_config cfg;
    if (svc_cli_load_config(&args, &cfg))
        return SVC_GATEWAY_EXIT_CONFIG;
    char err[1024];
    int code = 0;
    svc_gateway *g = svc_gateway_create(&cfg, port_file, &code, err, sizeof err);
    svc_config_deinit(&cfg);
    if (!g) {
        svc_log(SVC_LOG_ERROR, "gateway_start", "%s", err);
        return code;
    }
    code = svc_gateway_run(g);
    svc_gateway_destroy(g);
    return code;
}
