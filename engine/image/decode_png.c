/* PNG -> RGB with libpng, reproducing what transformers 4.47's
 * MllamaImageProcessor makes of PIL.Image.open(png) with Pillow 13:
 * PngImagePlugin picks an image mode from the IHDR, and the processor's
 * convert_to_rgb leaves mode "RGB" as it is and turns every other mode into
 * RGBA (Image.convert) alpha-composited over opaque white
 * (Image.alpha_composite, alpha.c), then drops the alpha.
 *
 * libpng hands over raw samples: sub-byte samples are unpacked to one byte
 * each and nothing else is transformed; an Adam7 image is read as its seven
 * reduced pass images and scattered into place here. Pillow's conversions are
 * applied here rather than by libpng's transforms because several differ
 * from them:
 *
 *   IHDR                 Pillow mode    RGBA that Image.convert makes
 *   grey 1, 2, 4, 8 bit  "1" / "L"      v = sample * 255 / (2^depth - 1)
 *   grey 16 bit          "I;16"         v = min(sample, 255): clipped, not scaled
 *     either, with tRNS                 alpha 0 where v equals the low byte of the
 *                                       tRNS sample (1 bit: 0 or 255), as
 *                                       Convert.c rgbT2a compares them, so a 2- or
 *                                       4-bit key is compared unscaled
 *   grey+alpha 8 / 16    "LA" / "RGBA"  (l, l, l, a)
 *   RGB 8 / 16           "RGB"          none: convert_to_rgb returns it, tRNS unused
 *   RGBA 8 / 16          "RGBA"         as is
 *   palette 1..8 bit     "P"            256-entry table: the PLTE colours, black
 *                                       beyond them; alpha from tRNS, else 255
 * A 16-bit sample keeps its high byte (Unpack.c "RGB;16B", "LA;16B", ...).
 *
 * Hostile input: the IHDR size is checked against the limits before any
 * pixel memory exists; besides libpng's own row buffers, the only
 * allocations are the RGB output and one RGBA row. Ancillary chunks are
 * skipped without being read into memory (no iCCP or zTXt is inflated). The
 * image data goes through libpng's progressive reader, which stops inflating
 * at the first byte beyond the last row: the pull API would inflate every
 * trailing byte of the zlib stream, a 2 MB file making 2 GB of zeros. Chunk
 * lengths up to the image data are checked against the input, and every CRC
 * read is verified. libpng's fatal errors unwind with longjmp to
 * decode_guarded, whose state lives in a heap struct owned by its caller, so
 * cleanup never depends on locals of the function that called setjmp
 * (C11 7.13.2.1).
 *
 * Where this differs from Pillow, always on files that break the PNG
 * specification. Refused here, read by Pillow: a bad CRC in the image data
 * (Pillow checks no IDAT CRC) or in a chunk after it, a palette image
 * without PLTE, an unknown critical chunk, image data that ends before the
 * last row. Ignored here, used by Pillow: a tRNS chunk that libpng finds
 * invalid (longer than the palette, or out of place). Read here, refused by
 * Pillow: ancillary chunks Pillow cannot parse (an iCCP or text chunk
 * inflating past 1 MB, say), which are skipped here. Accepted by both: a
 * file that ends as soon as the last row is decoded (without the zlib
 * checksum, the last CRC or IEND), and bytes after IEND.
 *
 * APNG: Image.open shows frame 0, which is the IDAT image, and that is what
 * is decoded here. When a frame control chunk (fcTL) before IDAT gives frame
 * 0 a rectangle smaller than the canvas, Pillow decodes IDAT into that
 * rectangle; such files are refused as unsupported. */
#include "image/image_internal.h"

#include <assert.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <png.h>

#define SIGNATURE_BYTES 8
#define CHUNK_HEADER_BYTES 8   /* length, type */
#define CHUNK_OVERHEAD_BYTES 12 /* length, type, CRC */
#define CHUNK_TYPE_BYTES 4
#define FCTL_BYTES 26 /* APNG fcTL: sequence, width, height, x, y, delay, dispose, blend */
#define ADAM7_PASSES 7
#define PALETTE_ENTRIES 256
/* Only IHDR, PLTE and tRNS are read into memory (under 1 KB together); the
 * cap bounds anything a libpng version might buffer beyond them. */
#define MAX_BUFFERED_CHUNK_BYTES (1u << 20)
#define MSG_MAX 256

static const uint8_t png_signature[SIGNATURE_BYTES] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

/* The last APNG frame control chunk before the image data: Pillow's
 * rectangle for frame 0. */
typedef struct frame_control {
    int present;
    uint32_t width, height, x, y;
} frame_control;

/* Decoder state shared with the libpng callbacks. */
typedef struct png_decoder {
    png_structp png; /* owned, with info */
    png_infop info;
    const ml_image_limits *lim;
    frame_control frame;
    ml_status status;  /* status of the longjmp */
    int out_of_memory; /* an allocation made for libpng failed */
    char msg[MSG_MAX];
    char warning[MSG_MAX]; /* libpng's last warning, for a failure it explains */
    uint32_t width, height;
    int interlaced; /* Adam7 */
    uint64_t rows_total, rows_done; /* raw rows over all passes, 0 before the image data */
    uint8_t *pixels; /* owned until handed to the caller: (height, width, 3) */
    uint8_t *rgba;   /* owned: one (width, 4) RGBA row */
    /* How a raw row becomes RGBA (the table at the top). */
    int color_type;
    int bit_depth;
    unsigned grey_scale; /* 255 / (2^depth - 1) for grey up to 8 bits */
    int has_key;         /* grey tRNS present */
    uint8_t key;         /* the 8-bit value it makes transparent */
    uint8_t palette[PALETTE_ENTRIES * ML_IMAGE_RGBA_BYTES];
} png_decoder;

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* A chunk type fit for a message: letters kept, anything else as '?'. */
static void chunk_name(const uint8_t *type, char name[CHUNK_TYPE_BYTES + 1])
{
    for (int i = 0; i < CHUNK_TYPE_BYTES; i++) {
        uint8_t c = type[i];
        name[i] = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ? (char)c : '?';
    }
    name[CHUNK_TYPE_BYTES] = '\0';
}

/* Walk the chunk headers from the signature to the first IDAT, which libpng
 * reads next and checks in every other respect. Fails (ML_ERR_FORMAT) on a
 * chunk that runs past the end of the input, so an absurd length is named
 * with its chunk and offset, and on a truncated fcTL; records the last fcTL
 * in *fc. Stopping short of IDAT is left to libpng to report. */
static ml_status scan_header_chunks(const uint8_t *data, size_t len, frame_control *fc, char *err,
                                    size_t errlen)
{
    size_t pos = SIGNATURE_BYTES;
    while (len - pos >= CHUNK_HEADER_BYTES) {
        uint32_t n = be32(data + pos);
        const uint8_t *type = data + pos + 4;
        if (!memcmp(type, "IDAT", CHUNK_TYPE_BYTES))
            return ML_OK;
        char name[CHUNK_TYPE_BYTES + 1];
        chunk_name(type, name);
        size_t left = len - pos;
        if (left < CHUNK_OVERHEAD_BYTES || n > left - CHUNK_OVERHEAD_BYTES)
            return ml_fail(err, errlen, ML_ERR_FORMAT,
                           "truncated PNG: chunk %s at byte %zu declares %u data bytes, "
                           "%zu bytes remain",
                           name, pos, n, left);
        if (!memcmp(type, "fcTL", CHUNK_TYPE_BYTES)) {
            if (n < FCTL_BYTES)
                return ml_fail(err, errlen, ML_ERR_FORMAT,
                               "APNG fcTL chunk at byte %zu has %u bytes, fewer than %d", pos, n,
                               FCTL_BYTES);
            const uint8_t *f = data + pos + CHUNK_HEADER_BYTES;
            fc->present = 1;
            fc->width = be32(f + 4);
            fc->height = be32(f + 8);
            fc->x = be32(f + 12);
            fc->y = be32(f + 16);
        }
        pos += CHUNK_OVERHEAD_BYTES + (size_t)n;
    }
    return ML_OK;
}

/* ---- libpng callbacks ---------------------------------------------------- */

static void fail_jump(png_decoder *d, ml_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));

static void fail_jump(png_decoder *d, ml_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->msg, sizeof d->msg, fmt, ap);
    va_end(ap);
    d->status = st;
    png_longjmp(d->png, 1);
}

/* libpng's fatal errors unwind to decode_guarded instead of its default
 * handler, which would print to stderr first. */
static void on_error(png_structp png, png_const_charp msg)
{
    png_decoder *d = png_get_error_ptr(png);
    if (d->out_of_memory)
        fail_jump(d, ML_ERR_NOMEM, "out of memory decoding PNG (%s)", msg);
    /* libpng gives the reason for "Invalid IHDR data" as warnings. */
    fail_jump(d, ML_ERR_FORMAT, "corrupt PNG: %s%s%s%s", msg,
              d->warning[0] ? " (last libpng warning: " : "", d->warning, d->warning[0] ? ")" : "");
}

/* Warnings (benign errors included) are what libpng recovers from and
 * Pillow accepts; the last one is kept for the message should the image data
 * then stop short (the progressive reader reports a zlib error before the
 * last row that way). */
static void on_warning(png_structp png, png_const_charp msg)
{
    png_decoder *d = png_get_error_ptr(png);
    snprintf(d->warning, sizeof d->warning, "%s", msg);
}

static png_voidp on_alloc(png_structp png, png_alloc_size_t size)
{
    png_voidp p = malloc(size);
    if (!p)
        ((png_decoder *)png_get_mem_ptr(png))->out_of_memory = 1;
    return p;
}

static void on_free(png_structp png, png_voidp p)
{
    (void)png;
    free(p);
}

/* ---- Pillow's conversions ------------------------------------------------ */

/* Read the palette and transparency Pillow applies (the table at the top).
 * Called before png_read_update_info, while the info struct still holds the
 * file's own bit depth and tRNS values. */
static void set_up_conversion(png_decoder *d)
{
    if (d->color_type == PNG_COLOR_TYPE_GRAY) {
        d->grey_scale = d->bit_depth <= 8 ? 255u / ((1u << d->bit_depth) - 1) : 0;
        png_color_16p trans = NULL;
        if (png_get_tRNS(d->png, d->info, NULL, NULL, &trans) & PNG_INFO_tRNS) {
            d->has_key = 1;
            /* PngImagePlugin maps a 1-bit key to 0/255; rgbT2a masks the rest. */
            d->key = d->bit_depth == 1 ? (trans->gray ? 255 : 0) : (uint8_t)(trans->gray & 0xff);
        }
    } else if (d->color_type == PNG_COLOR_TYPE_PALETTE) {
        /* ImagingPaletteNew: black, opaque. */
        memset(d->palette, 0, sizeof d->palette);
        for (int i = 0; i < PALETTE_ENTRIES; i++)
            d->palette[i * ML_IMAGE_RGBA_BYTES + 3] = 255;
        png_colorp plte = NULL;
        int n_plte = 0;
        if (png_get_PLTE(d->png, d->info, &plte, &n_plte) & PNG_INFO_PLTE)
            for (int i = 0; i < n_plte && i < PALETTE_ENTRIES; i++) {
                d->palette[i * ML_IMAGE_RGBA_BYTES + 0] = plte[i].red;
                d->palette[i * ML_IMAGE_RGBA_BYTES + 1] = plte[i].green;
                d->palette[i * ML_IMAGE_RGBA_BYTES + 2] = plte[i].blue;
            }
        png_bytep alpha = NULL;
        int n_alpha = 0;
        if (png_get_tRNS(d->png, d->info, &alpha, &n_alpha, NULL) & PNG_INFO_tRNS)
            for (int i = 0; i < n_alpha && i < PALETTE_ENTRIES; i++)
                d->palette[i * ML_IMAGE_RGBA_BYTES + 3] = alpha[i];
    }
}

/* n pixels of one raw row (one byte per sub-byte sample, big-endian 16-bit
 * samples) to the RGBA of Pillow's Image.convert("RGBA"). */
static void row_to_rgba(const png_decoder *d, const uint8_t *raw, uint32_t n, uint8_t *rgba)
{
    /* Sample k's byte, or its high byte at 16 bits. */
    const size_t s = d->bit_depth == 16 ? 2 : 1;
    switch (d->color_type) {
    case PNG_COLOR_TYPE_GRAY:
        for (uint32_t x = 0; x < n; x++, rgba += ML_IMAGE_RGBA_BYTES) {
            const uint8_t *p = raw + x * s;
            uint8_t v = s == 2 ? (p[0] ? 255 : p[1]) : (uint8_t)(p[0] * d->grey_scale);
            rgba[0] = rgba[1] = rgba[2] = v;
            rgba[3] = d->has_key && v == d->key ? 0 : 255;
        }
        break;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
        for (uint32_t x = 0; x < n; x++, rgba += ML_IMAGE_RGBA_BYTES) {
            rgba[0] = rgba[1] = rgba[2] = raw[2 * x * s];
            rgba[3] = raw[(2 * x + 1) * s];
        }
        break;
    case PNG_COLOR_TYPE_RGB:
        for (uint32_t x = 0; x < n; x++, rgba += ML_IMAGE_RGBA_BYTES) {
            for (int c = 0; c < ML_IMAGE_CHANNELS; c++)
                rgba[c] = raw[(3 * x + c) * s];
            rgba[3] = 255;
        }
        break;
    case PNG_COLOR_TYPE_RGB_ALPHA:
        for (uint32_t x = 0; x < n; x++, rgba += ML_IMAGE_RGBA_BYTES)
            for (int c = 0; c < ML_IMAGE_RGBA_BYTES; c++)
                rgba[c] = raw[(ML_IMAGE_RGBA_BYTES * x + c) * s];
        break;
    case PNG_COLOR_TYPE_PALETTE:
        for (uint32_t x = 0; x < n; x++, rgba += ML_IMAGE_RGBA_BYTES)
            memcpy(rgba, d->palette + (size_t)raw[x] * ML_IMAGE_RGBA_BYTES, ML_IMAGE_RGBA_BYTES);
        break;
    default:
        assert(!"libpng accepts no other colour type");
    }
}

/* ---- decode -------------------------------------------------------------- */

/* Where the rows of one pass land: Adam7 pass `pass`, or the whole image
 * when the PNG is not interlaced. */
typedef struct pass_geometry {
    uint32_t x0, y0, cols, rows;
    unsigned x_shift, y_shift;
} pass_geometry;

static pass_geometry pass_of(const png_decoder *d, int pass)
{
    pass_geometry g = {0, 0, d->width, d->height, 0, 0};
    if (d->interlaced) {
        g.x0 = PNG_PASS_START_COL(pass);
        g.y0 = PNG_PASS_START_ROW(pass);
        g.x_shift = PNG_PASS_COL_SHIFT(pass);
        g.y_shift = PNG_PASS_ROW_SHIFT(pass);
        g.cols = PNG_PASS_COLS(d->width, pass);
        g.rows = PNG_PASS_ROWS(d->height, pass);
    }
    return g;
}

/* The progressive reader has read every chunk up to the image data: check
 * the size and the APNG frame, choose the conversion, allocate. */
static void on_info(png_structp png, png_infop info)
{
    png_decoder *d = png_get_progressive_ptr(png);
    int interlace;
    png_get_IHDR(png, info, &d->width, &d->height, &d->bit_depth, &d->color_type, &interlace,
                 NULL, NULL);
    uint32_t w = d->width, h = d->height;
    char msg[MSG_MAX];
    if (ml_image_check_size(w, h, d->lim, msg, sizeof msg) != ML_OK)
        fail_jump(d, ML_ERR_TOO_LARGE, "%s", msg);
    const frame_control *fc = &d->frame;
    if (fc->present && (fc->width != w || fc->height != h || fc->x || fc->y))
        fail_jump(d, ML_ERR_UNSUPPORTED,
                  "APNG whose first frame is %ux%u at (%u,%u) of a %ux%u canvas is not supported",
                  fc->width, fc->height, fc->x, fc->y, w, h);

    set_up_conversion(d);
    if (d->bit_depth < 8)
        png_set_packing(png);
    png_read_update_info(png, info);

    /* Without png_set_interlace_handling, libpng hands over each Adam7 pass
     * as the reduced image it is and skips empty passes. */
    d->interlaced = interlace == PNG_INTERLACE_ADAM7;
    for (int pass = 0; pass < (d->interlaced ? ADAM7_PASSES : 1); pass++) {
        pass_geometry g = pass_of(d, pass);
        d->rows_total += g.cols ? g.rows : 0;
    }
    d->pixels = malloc((size_t)w * h * ML_IMAGE_CHANNELS);
    d->rgba = malloc((size_t)w * ML_IMAGE_RGBA_BYTES);
    if (!d->pixels || !d->rgba)
        fail_jump(d, ML_ERR_NOMEM, "out of memory for a %ux%u PNG", w, h);
}

/* One raw row of pass `pass` (0 when not interlaced), row_num counted within
 * the pass. */
static void on_row(png_structp png, png_bytep raw, png_uint_32 row_num, int pass)
{
    png_decoder *d = png_get_progressive_ptr(png);
    pass_geometry g = pass_of(d, pass);
    /* libpng calls for the rows of non-empty passes only, each once. */
    assert(raw && row_num < g.rows && g.cols > 0);
    row_to_rgba(d, raw, g.cols, d->rgba);
    size_t y = g.y0 + ((size_t)row_num << g.y_shift);
    /* An opaque pixel comes out unchanged, so RGB images, which
     * convert_to_rgb leaves alone, take the same path. */
    ml_image_rgba_over_white(d->rgba, g.cols,
                             d->pixels + (y * d->width + g.x0) * ML_IMAGE_CHANNELS,
                             (size_t)ML_IMAGE_CHANNELS << g.x_shift);
    d->rows_done++;
}

/* Everything that can longjmp. Returns ML_OK with *out filled, or the status
 * of the failure with d->msg set. The caller releases the libpng structs,
 * d->rgba and d->pixels in every case. */
static ml_status decode_guarded(png_decoder *d, const uint8_t *data, size_t len,
                                ml_image_rgb *out)
{
    if (setjmp(png_jmpbuf(d->png)))
        return d->status;

    png_set_progressive_read_fn(d->png, d, on_info, on_row, NULL);
    /* Pillow refuses a bad CRC in any chunk before the image data. */
    png_set_crc_action(d->png, PNG_CRC_ERROR_QUIT, PNG_CRC_ERROR_QUIT);
    /* Skip every chunk but IHDR, PLTE, tRNS, IDAT and IEND. */
    png_set_keep_unknown_chunks(d->png, PNG_HANDLE_CHUNK_NEVER, NULL, -1);
    /* libpng's default side limit (1e6) would answer a bare "Invalid IHDR
     * data"; on_info checks the size, with the limits and a clear status. */
    png_set_user_limits(d->png, PNG_UINT_31_MAX, PNG_UINT_31_MAX);
    png_set_chunk_malloc_max(d->png, MAX_BUFFERED_CHUNK_BYTES);
    /* The whole input at once; libpng only reads it (the prototype
     * predates const). What follows IEND is ignored, as Pillow ignores it. */
    png_process_data(d->png, d->info, (png_bytep)(uintptr_t)data, len);

    if (d->rows_total == 0)
        fail_jump(d, ML_ERR_FORMAT, "truncated PNG: no image data (IDAT) in %zu bytes", len);
    if (d->rows_done < d->rows_total)
        fail_jump(d, ML_ERR_FORMAT,
                  "truncated or corrupt PNG: the image data stops after %llu of %llu rows%s%s%s",
                  (unsigned long long)d->rows_done, (unsigned long long)d->rows_total,
                  d->warning[0] ? " (last libpng warning: " : "", d->warning,
                  d->warning[0] ? ")" : "");
    out->pixels = d->pixels;
    out->width = d->width;
    out->height = d->height;
    d->pixels = NULL;
    return ML_OK;
}

int ml_image_png_signature(const uint8_t *data, size_t len)
{
    return len >= SIGNATURE_BYTES && !memcmp(data, png_signature, SIGNATURE_BYTES);
}

/* The IHDR chunk: length 13, then width, height, bit depth, colour type,
 * compression, filter, interlace; first after the signature. */
#define IHDR_BYTES 13

ml_status ml_image_png_probe(const uint8_t *data, size_t len, const ml_image_limits *lim,
                             ml_image_info *info, char *err, size_t errlen)
{
    memset(info, 0, sizeof *info);
    const uint8_t *c = data + SIGNATURE_BYTES;
    if (len < SIGNATURE_BYTES + CHUNK_OVERHEAD_BYTES + IHDR_BYTES || be32(c) != IHDR_BYTES ||
        memcmp(c + 4, "IHDR", CHUNK_TYPE_BYTES))
        return ml_fail(err, errlen, ML_ERR_FORMAT, "corrupt PNG: no IHDR chunk first");
    uint32_t w = be32(c + CHUNK_HEADER_BYTES), h = be32(c + CHUNK_HEADER_BYTES + 4);
    if (w == 0 || h == 0)
        return ml_fail(err, errlen, ML_ERR_FORMAT, "corrupt PNG: IHDR is %ux%u", w, h);
    ml_status st = ml_image_check_size(w, h, lim, err, errlen);
    if (st != ML_OK)
        return st;
    *info = (ml_image_info){.width = w, .height = h, .n_scans = 1};
    return ML_OK;
}

ml_status ml_image_png_decode(const uint8_t *data, size_t len, const ml_image_limits *lim,
                              ml_image_rgb *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    frame_control frame = {0};
    ml_status st = scan_header_chunks(data, len, &frame, err, errlen);
    if (st != ML_OK)
        return st;

    png_decoder *d = calloc(1, sizeof *d);
    if (!d)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory for the PNG decoder");
    d->lim = lim;
    d->frame = frame;
    d->png = png_create_read_struct_2(PNG_LIBPNG_VER_STRING, d, on_error, on_warning, d, on_alloc,
                                      on_free);
    if (d->png)
        d->info = png_create_info_struct(d->png);
    if (!d->info) {
        st = ml_fail(err, errlen, ML_ERR_NOMEM, "cannot create the libpng decoder");
    } else {
        st = decode_guarded(d, data, len, out);
        if (st != ML_OK)
            ml_fail(err, errlen, st, "%s", d->msg);
    }
    png_destroy_read_struct(&d->png, &d->info, NULL);
    free(d->rgba);
    free(d->pixels);
    free(d);
    return st;
}
