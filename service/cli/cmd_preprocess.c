/* `mllama preprocess`: one JPEG, PNG, WebP, GIF or TIFF through the Mllama image preprocessing,
 * written as a .npy tensor for comparison with transformers.
 * @locality: the main thread. */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "engine.h"

#define MAX_INPUT_BYTES (256u << 20) /* far above any image file within the pixel limit */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mllama preprocess --image FILE --out PIXELS.npy [--model DIR]\n"
            "                         [--max-tiles N] [--tile-size S]\n"
            "\n"
            "Decodes a JPEG, PNG, WebP, GIF or TIFF and runs the Mllama tile preprocessing.\n"
            "Writes the float32 (tiles, 3, S, S) pixel tensor as .npy and prints the layout\n"
            "as JSON.\n"
            "  --model DIR     read DIR/preprocessor_config.json (defaults otherwise)\n"
            "  --max-tiles N   override max_image_tiles (default %u)\n"
            "  --tile-size S   override the tile size (default %u)\n",
            ML_IMAGE_DEFAULT_MAX_TILES, ML_IMAGE_DEFAULT_TILE_SIZE);
}

/* A positive 32-bit option value; 0 and negatives are rejected. */
static int parse_u32(const char *opt, const char *s, uint32_t *out)
{
    long v;
    if (svc_parse_long("mllama preprocess", opt, s, 1, UINT32_MAX, &v))
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int cmd_preprocess(int argc, char **argv)
{
    static const struct option options[] = {
        {"image", required_argument, NULL, 'i'},     {"out", required_argument, NULL, 'o'},
        {"model", required_argument, NULL, 'm'},     {"max-tiles", required_argument, NULL, 'n'},
        {"tile-size", required_argument, NULL, 's'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *image_path = NULL, *out_path = NULL, *model_dir = NULL;
    uint32_t max_tiles = 0, tile_size = 0;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (opt) {
        case 'i': image_path = optarg; break;
        case 'o': out_path = optarg; break;
        case 'm': model_dir = optarg; break;
        case 'n':
            if (parse_u32("--max-tiles", optarg, &max_tiles))
                return SVC_EXIT_USAGE;
            break;
        case 's':
            if (parse_u32("--tile-size", optarg, &tile_size))
                return SVC_EXIT_USAGE;
            break;
        case 'h': usage(stdout); return SVC_EXIT_OK;
        default: usage(stderr); return SVC_EXIT_USAGE;
        }
    }
    if (!image_path || !out_path || optind != argc) {
        usage(stderr);
        return SVC_EXIT_USAGE;
    }

    char err[256];
    ml_image_params params;
    ml_status st = model_dir ? ml_image_params_load(model_dir, &params, err, sizeof err)
                             : (ml_image_params_default(&params), ML_OK);
    if (st != ML_OK) {
        fprintf(stderr, "mllama preprocess: %s\n", err);
        return SVC_EXIT_FAILURE;
    }
    if (max_tiles)
        params.max_tiles = max_tiles;
    if (tile_size)
        params.tile_size = tile_size;

    size_t len = 0;
    uint8_t *bytes = (uint8_t *)svc_read_file("mllama preprocess", image_path, MAX_INPUT_BYTES, &len);
    if (!bytes)
        return SVC_EXIT_FAILURE;
    ml_image_rgb img;
    st = ml_image_decode(bytes, len, &params.limits, &img, err, sizeof err);
    free(bytes);
    if (st != ML_OK) {
        fprintf(stderr, "mllama preprocess: %s: %s (%s)\n", image_path, err, ml_status_name(st));
        return SVC_EXIT_FAILURE;
    }

    int rc = SVC_EXIT_FAILURE;
    float *pixels = NULL;
    void *workspace = NULL;
    ml_image_layout layout;
    st = ml_image_plan(img.width, img.height, &params, &layout, err, sizeof err);
    if (st != ML_OK) {
        fprintf(stderr, "mllama preprocess: %s: %s (%s)\n", image_path, err, ml_status_name(st));
        goto done;
    }
    size_t n_floats = ml_image_pixels_count(&layout);
    size_t ws_bytes = ml_image_workspace_size(&layout);
    pixels = malloc(n_floats * sizeof *pixels);
    workspace = ws_bytes ? malloc(ws_bytes) : NULL;
    if (!pixels || (ws_bytes && !workspace)) {
        fprintf(stderr, "mllama preprocess: out of memory\n");
        goto done;
    }
    st = ml_image_preprocess(&img, &params, &layout, workspace, ws_bytes, pixels, n_floats, err,
                             sizeof err);
    if (st != ML_OK) {
        fprintf(stderr, "mllama preprocess: %s (%s)\n", err, ml_status_name(st));
        goto done;
    }
    size_t shape[4] = {layout.n_tiles, ML_IMAGE_CHANNELS, layout.tile_size, layout.tile_size};
    if (svc_write_npy_f32("mllama preprocess", out_path, pixels, 4, shape))
        goto done;

    printf("{\"tiles\": %u, \"tiles_h\": %u, \"tiles_w\": %u, \"width\": %u, \"height\": %u, "
           "\"resized_width\": %u, \"resized_height\": %u, \"aspect_ratio_id\": %u, "
           "\"aspect_ratio_mask\": [",
           layout.n_tiles, layout.tiles_h, layout.tiles_w, layout.width, layout.height,
           layout.resized_width, layout.resized_height, layout.aspect_ratio_id);
    for (uint32_t t = 0; t < layout.max_tiles; t++)
        printf("%s%u", t ? ", " : "", layout.aspect_ratio_mask[t]);
    printf("]}\n");
    rc = fflush(stdout) == 0 ? SVC_EXIT_OK : SVC_EXIT_FAILURE;
done:
    free(pixels);
    free(workspace);
    ml_image_rgb_deinit(&img);
    return rc;
}
