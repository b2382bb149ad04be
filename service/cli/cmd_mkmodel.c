/* `mllama mkmodel`: write a random-weight checkpoint of the real
 * architecture (engine/checkpoint/mkmodel.h). */
#include <stdio.h>
#include <string.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "engine.h"

#define CMD "mllama mkmodel"

static void usage(FILE *f)
{
    fprintf(f, "usage: mllama mkmodel --preset micro|tiny|small|1b|11b|90b --out DIR [--seed N]\n"
               "                      [--tokenizer-dir DIR] [--fp8] [--header-only]\n\n"
               "Writes config.json, bf16 safetensors (sharded past 2 GB), the tokenizer and\n"
               "preprocessor_config.json: the real architecture with random weights.\n"
               "--fp8 writes the same weights as a compressed-tensors FP8 checkpoint (the\n"
               "text decoder's Linears F8_E4M3 with per-channel scales).\n"
               "--header-only writes the tensor names, shapes and dtypes with no values:\n"
               "sparse shards (cut at 5 GB) that read as zeros and take no disk; the 90b\n"
               "preset is header-only.\n"
               "--tokenizer-dir defaults to the project's config/tokenizer.\n");
}

int cmd_mkmodel(int argc, char **argv)
{
    const char *preset = NULL, *out = NULL, *tok_dir = ML_DEFAULT_TOKENIZER_DIR;
    long seed = 0;
    unsigned flags = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return SVC_EXIT_OK;
        }
        if (!strcmp(argv[i], "--fp8")) {
            flags |= ML_MKMODEL_FP8;
            continue;
        }
        if (!strcmp(argv[i], "--header-only")) {
            flags |= ML_MKMODEL_HEADER_ONLY;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, CMD ": %s needs a value\n", argv[i]);
            return SVC_EXIT_USAGE;
        }
        const char *a = argv[i], *v = argv[++i];
        if (!strcmp(a, "--preset"))
            preset = v;
        else if (!strcmp(a, "--out"))
            out = v;
        else if (!strcmp(a, "--tokenizer-dir"))
            tok_dir = v;
        else if (!strcmp(a, "--seed")) {
            if (svc_parse_long(CMD, a, v, 0, INT64_MAX, &seed))
                return SVC_EXIT_USAGE;
        } else {
            fprintf(stderr, CMD ": unknown option %s\n", a);
            return SVC_EXIT_USAGE;
        }
    }
    if (!preset || !out) {
        usage(stderr);
        return SVC_EXIT_USAGE;
    }
    char err[512];
    if (ml_mkmodel(preset, out, tok_dir, (uint64_t)seed, flags, err, sizeof err) != ML_OK) {
        fprintf(stderr, CMD ": %s\n", err);
        return SVC_EXIT_FAILURE;
    }
    fprintf(stderr, CMD ": wrote the %s preset%s%s to %s\n", preset,
            flags & ML_MKMODEL_FP8 ? " (fp8)" : "",
            flags & ML_MKMODEL_HEADER_ONLY ? " (header only)" : "", out);
    return SVC_EXIT_OK;
}
