/* mllama: one binary, several subcommands. Wiring only. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

typedef struct svc_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} svc_command;

static const svc_command commands[] = {
    {"preprocess", cmd_preprocess,
     "run the Mllama image preprocessing on a JPEG, PNG, WebP, GIF or TIFF, write .npy"},
    {"mock-kafka", cmd_mock_kafka, "run a mock Kafka cluster; print its bootstrap servers"},
    {"tokenize", cmd_tokenize, "encode/decode JSON lines with a tokenizer.json"},
    {"grammar", cmd_grammar, "check JSON Schemas and documents against the token masks (JSON lines)"},
    {"worker", cmd_worker, "run the Kafka worker (the product)"},
    {"gateway", cmd_gateway, "run the OpenAI-compatible HTTP gateway in front of the workers"},
    {"submit", cmd_submit, "send one chat request to Kafka and stream the reply"},
    {"healthcheck", cmd_healthcheck, "GET a worker endpoint; exit 0 on HTTP 200"},
    {"mkmodel", cmd_mkmodel, "write a random-weight checkpoint of the real architecture"},
    {"run", cmd_run, "generate from a model directory (one prompt or a JSONL batch)"},
    {NULL, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: mllama <command> [options]\n\ncommands:\n");
    for (const svc_command *c = commands; c->name; c++)
        fprintf(f, "  %-12s %s\n", c->name, c->summary);
    fprintf(f, "\n`mllama <command> --help` describes each command.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? SVC_EXIT_USAGE : SVC_EXIT_OK;
    }
    for (const svc_command *c = commands; c->name; c++)
        if (!strcmp(argv[1], c->name))
            return c->run(argc - 1, argv + 1);
    fprintf(stderr, "mllama: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return SVC_EXIT_USAGE;
}
