/* ml_image_decode: the format is told by its signature, never by a declared
 * media type. PNG goes to decode_png.c, WebP to decode_webp.c, GIF to
 * decode_gif.c; JPEG is decoded here, with the
 * libjpeg API, reproducing what Pillow's JpegImagePlugin and JpegDecode.c
 * hand to transformers after Image.convert("RGB").
 *
 * libjpeg rather than TurboJPEG: TurboJPEG 2.1 (Debian 12) cannot bound the
 * number of progressive scans by a caller-chosen limit, cannot tell a
 * truncated file from a complete one, and has no CMYK->RGB path matching
 * Pillow's. The libjpeg API gives a progress monitor, warnings and raw CMYK. */
#include "image/image.h"
#include "image/image_internal.h"

#include <setjmp.h>
#include <stdint.h>
#include <stdio.h> /* jpeglib.h needs FILE */
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

#define CMYK_COMPONENTS 4
#define SIGNATURE_BYTES 12 /* enough to tell the common image formats apart */

/* Decoder state shared with the libjpeg callbacks. It lives in the caller of
 * decode_guarded, so nothing that setjmp/longjmp crosses is a local of the
 * function that called setjmp (C11 7.13.2.1). */
typedef struct decoder {
    struct jpeg_decompress_struct cinfo;
    struct jpeg_error_mgr jerr;
    struct jpeg_progress_mgr progress;
    jmp_buf jump;
    const ml_image_limits *lim;
    int reading_pixels; /* between jpeg_read_header and the last scanline */
    ml_status status;   /* status of the longjmp */
    char msg[JMSG_LENGTH_MAX];
    uint8_t *pixels; /* owned until handed to the caller */
} decoder;

static decoder *decoder_of(j_common_ptr cinfo)
{
    /* cinfo is the first member of decoder. */
    return (decoder *)(void *)cinfo;
}

static void fail_jump(decoder *d, ml_status st, const char *msg)
{
    d->status = st;
    snprintf(d->msg, sizeof d->msg, "%s", msg);
    longjmp(d->jump, 1);
}

/* libjpeg fatal errors unwind to decode_guarded instead of exit(). */
static void on_error_exit(j_common_ptr cinfo)
{
    decoder *d = decoder_of(cinfo);
    char msg[JMSG_LENGTH_MAX];
    (*cinfo->err->format_message)(cinfo, msg);
    fail_jump(d, cinfo->err->msg_code == JERR_OUT_OF_MEMORY ? ML_ERR_NOMEM : ML_ERR_FORMAT, msg);
}

/* Warnings (corrupt entropy data, bogus progression) are ignored as Pillow
 * ignores them, except running out of data before the last scanline: Pillow's
 * suspending reader then raises "image file is truncated", while libjpeg's
 * memory source would quietly pad the image with grey. A missing EOI after
 * the last scanline is accepted, as Pillow accepts it. */
static void on_emit_message(j_common_ptr cinfo, int msg_level)
{
    decoder *d = decoder_of(cinfo);
    if (msg_level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF && d->reading_pixels)
        fail_jump(d, ML_ERR_FORMAT, "truncated JPEG data");
    if (msg_level < 0)
        cinfo->err->num_warnings++;
}

/* Called by libjpeg once per iMCU row while it absorbs input. count_scans
 * has refused a file of too many scans before decoding; this is the
 * backstop should libjpeg ever find a scan the marker walk did not. */
static void on_progress(j_common_ptr cinfo)
{
    decoder *d = decoder_of(cinfo);
    if ((uint32_t)d->cinfo.input_scan_number > d->lim->max_scans) {
        char msg[JMSG_LENGTH_MAX];
        snprintf(msg, sizeof msg, "JPEG has more than %u scans", d->lim->max_scans);
        fail_jump(d, ML_ERR_TOO_LARGE, msg);
    }
}

#define MARKER_PREFIX 0xffu
#define MARKER_STUFFED 0x00u /* a 0xff data byte in entropy-coded data */
#define MARKER_TEM 0x01u
#define MARKER_RST0 0xd0u
#define MARKER_RST7 0xd7u
#define MARKER_SOI 0xd8u
#define MARKER_EOI 0xd9u
#define MARKER_SOS 0xdau
#define SOI_BYTES 2
#define MARKER_BYTES 2
#define SEGMENT_LENGTH_BYTES 2

/* The scans of a JPEG: its SOS markers, found by walking the marker
 * segments by their lengths and skipping entropy-coded data (where 0xff is
 * followed by a stuffed 0x00 or a restart marker), as libjpeg's marker
 * reader does, without decoding anything. Stops at EOI or at the end of the
 * data; a segment running past the end ends the walk. O(len). */
static uint32_t count_scans(const uint8_t *data, size_t len)
{
    uint32_t scans = 0;
    size_t pos = SOI_BYTES;
    while (len - pos >= MARKER_BYTES) {
        uint8_t m = data[pos + 1];
        if (data[pos] != MARKER_PREFIX || m == MARKER_PREFIX) {
            pos++; /* entropy-coded data, fill bytes, garbage between segments */
            continue;
        }
        if (m == MARKER_EOI)
            break;
        if (m == MARKER_STUFFED || m == MARKER_TEM || m == MARKER_SOI ||
            (m >= MARKER_RST0 && m <= MARKER_RST7)) {
            pos += MARKER_BYTES; /* no length follows */
            continue;
        }
        if (len - pos < MARKER_BYTES + SEGMENT_LENGTH_BYTES)
            break;
        if (m == MARKER_SOS)
            scans++;
        size_t seg = (size_t)data[pos + 2] << 8 | data[pos + 3]; /* counts its own 2 bytes */
        if (seg > len - pos - MARKER_BYTES)
            break;
        pos += MARKER_BYTES + seg;
    }
    return scans;
}

static const char *format_name(const uint8_t *data, size_t len)
{
    static const struct {
        const char *name;
        size_t offset;
        const char *magic;
        size_t magic_len;
    } formats[] = {
        {"BMP", 0, "BM", 2},
        {"HEIF/AVIF", 4, "ftyp", 4},
    };
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (len >= formats[i].offset + formats[i].magic_len &&
            !memcmp(data + formats[i].offset, formats[i].magic, formats[i].magic_len))
            return formats[i].name;
    return NULL;
}

/* Pillow reads 4-component JPEGs with rawmode "CMYK;I" (every channel
 * inverted, Adobe convention) and Image.convert("RGB") applies cmyk2rgb:
 * channel = clip(nk - nk*ink/255) with nk = 255 - K, using Pillow's rounded
 * divide-by-255 (MULDIV255). With the inversion undone, nk is the raw K. */
static inline uint8_t muldiv255(unsigned a, unsigned b)
{
    unsigned t = a * b + 128;
    return (uint8_t)(((t >> 8) + t) >> 8);
}

static void cmyk_row_to_rgb(const uint8_t *cmyk, uint8_t *rgb, uint32_t width)
{
    for (uint32_t x = 0; x < width; x++, cmyk += CMYK_COMPONENTS, rgb += ML_IMAGE_CHANNELS) {
        unsigned nk = cmyk[3];
        for (int c = 0; c < ML_IMAGE_CHANNELS; c++)
            rgb[c] = (uint8_t)(nk - muldiv255(255u - cmyk[c], nk)); /* never negative */
    }
}

/* Expand a grey row held in the first `width` bytes of rgb, in place, back to
 * front so no byte is overwritten before it is read. */
static void grey_row_to_rgb(uint8_t *rgb, uint32_t width)
{
    for (uint32_t x = width; x-- > 0;) {
        uint8_t v = rgb[x];
        rgb[3 * x] = rgb[3 * x + 1] = rgb[3 * x + 2] = v;
    }
}

/* jpeg_read_header and every check that needs no pixel memory: the size
 * and the scan count. Longjmps on failure; returns the scan count. */
static uint32_t read_header_checked(decoder *d, const uint8_t *data, size_t len)
{
    jpeg_create_decompress(&d->cinfo);
    d->cinfo.progress = &d->progress;
    jpeg_mem_src(&d->cinfo, data, (unsigned long)len);
    d->reading_pixels = 1;
    jpeg_read_header(&d->cinfo, TRUE);

    struct jpeg_decompress_struct *ci = &d->cinfo;
    char msg[JMSG_LENGTH_MAX];
    if (ci->image_width == 0 || ci->image_height == 0)
        fail_jump(d, ML_ERR_FORMAT, "JPEG has a zero dimension");
    if (ml_image_check_size(ci->image_width, ci->image_height, d->lim, msg, sizeof msg) != ML_OK)
        fail_jump(d, ML_ERR_TOO_LARGE, msg);
    uint32_t scans = count_scans(data, len);
    if (scans > d->lim->max_scans) {
        snprintf(msg, sizeof msg, "JPEG has %u scans, above the limit of %u", scans,
                 d->lim->max_scans);
        fail_jump(d, ML_ERR_TOO_LARGE, msg);
    }
    return scans;
}

/* ml_image_probe's JPEG half; the caller releases cinfo. */
static ml_status probe_guarded(decoder *d, const uint8_t *data, size_t len, ml_image_info *info)
{
    if (setjmp(d->jump))
        return d->status;
    uint32_t scans = read_header_checked(d, data, len);
    *info = (ml_image_info){.width = d->cinfo.image_width, .height = d->cinfo.image_height,
                            .n_scans = scans};
    return ML_OK;
}

/* Everything that can longjmp. Returns ML_OK with d->pixels filled, or the
 * status of the failure with d->msg set. The caller releases cinfo and
 * d->pixels in every case. */
static ml_status decode_guarded(decoder *d, const uint8_t *data, size_t len, ml_image_rgb *out)
{
    if (setjmp(d->jump))
        return d->status;

    read_header_checked(d, data, len);
    struct jpeg_decompress_struct *ci = &d->cinfo;
    switch (ci->num_components) {
    case 1: ci->out_color_space = JCS_GRAYSCALE; break;
    case 3: ci->out_color_space = JCS_RGB; break;
    case CMYK_COMPONENTS: ci->out_color_space = JCS_CMYK; break;
    default: {
        char msg[JMSG_LENGTH_MAX];
        snprintf(msg, sizeof msg, "JPEG with %d components is not supported", ci->num_components);
        fail_jump(d, ML_ERR_UNSUPPORTED, msg);
    }
    }
    /* Pillow leaves these at libjpeg's defaults; stated so a changed default
     * elsewhere cannot shift pixels. */
    ci->dct_method = JDCT_ISLOW;
    ci->do_fancy_upsampling = TRUE;

    size_t row_bytes = (size_t)ci->image_width * ML_IMAGE_CHANNELS;
    d->pixels = malloc(row_bytes * ci->image_height);
    if (!d->pixels)
        fail_jump(d, ML_ERR_NOMEM, "out of memory for the decoded image");

    jpeg_start_decompress(ci);
    /* CMYK rows need a 4-byte staging row; libjpeg's image pool frees it on
     * every path, longjmp included. */
    JSAMPARRAY cmyk_row = NULL;
    if (ci->out_color_space == JCS_CMYK)
        cmyk_row = (*ci->mem->alloc_sarray)((j_common_ptr)ci, JPOOL_IMAGE,
                                            ci->output_width * CMYK_COMPONENTS, 1);
    while (ci->output_scanline < ci->output_height) {
        uint8_t *row = d->pixels + (size_t)ci->output_scanline * row_bytes;
        JSAMPROW target = cmyk_row ? cmyk_row[0] : row;
        if (jpeg_read_scanlines(ci, &target, 1) != 1)
            fail_jump(d, ML_ERR_FORMAT, "JPEG decoder stopped early");
        if (cmyk_row)
            cmyk_row_to_rgb(cmyk_row[0], row, ci->output_width);
        else if (ci->out_color_space == JCS_GRAYSCALE)
            grey_row_to_rgb(row, ci->output_width);
    }
    d->reading_pixels = 0;
    jpeg_finish_decompress(ci);

    out->pixels = d->pixels;
    out->width = ci->output_width;
    out->height = ci->output_height;
    d->pixels = NULL;
    return ML_OK;
}

/* Pillow's JPEG signature check (JpegImagePlugin._accept). */
static int jpeg_signature(const uint8_t *data, size_t len)
{
    static const uint8_t soi[] = {0xff, 0xd8, 0xff};
    return len >= sizeof soi && !memcmp(data, soi, sizeof soi);
}

/* The formats decoded in files of their own, told by their signatures. */
typedef struct other_format {
    int (*signature)(const uint8_t *data, size_t len);
    ml_status (*probe)(const uint8_t *data, size_t len, const ml_image_limits *lim,
                       ml_image_info *info, char *err, size_t errlen);
    ml_status (*decode)(const uint8_t *data, size_t len, const ml_image_limits *lim,
                        ml_image_rgb *out, char *err, size_t errlen);
    const char *media_type;
} other_format;

static const other_format other_formats[] = {
    {ml_image_png_signature, ml_image_png_probe, ml_image_png_decode, "image/png"},
    {ml_image_webp_signature, ml_image_webp_probe, ml_image_webp_decode, "image/webp"},
    {ml_image_gif_signature, ml_image_gif_probe, ml_image_gif_decode, "image/gif"},
    {ml_image_tiff_signature, ml_image_tiff_probe, ml_image_tiff_decode, "image/tiff"},
};

/* The entry of other_formats data belongs to, or NULL. */
static const other_format *other_format_of(const uint8_t *data, size_t len)
{
    for (size_t i = 0; data && i < sizeof other_formats / sizeof other_formats[0]; i++)
        if (other_formats[i].signature(data, len))
            return &other_formats[i];
    return NULL;
}

const char *ml_image_media_type(const uint8_t *data, size_t len)
{
    const other_format *f = other_format_of(data, len);
    if (f)
        return f->media_type;
    return data && jpeg_signature(data, len) ? "image/jpeg" : NULL;
}

/* ML_ERR_UNSUPPORTED for data of no format decoded here, naming the format
 * when it is a common one. */
static ml_status not_decoded_here(const uint8_t *data, size_t len, char *err, size_t errlen)
{
    const char *name = data ? format_name(data, len < SIGNATURE_BYTES ? len : SIGNATURE_BYTES)
                            : NULL;
    if (name)
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                       "%s images are not supported (JPEG, PNG, WebP, GIF and TIFF only)", name);
    return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                   "not a JPEG, PNG, WebP, GIF or TIFF image (unrecognised signature, %zu bytes)",
                   len);
}

/* A decoder with the callbacks installed, or NULL without memory. */
static decoder *decoder_create(const ml_image_limits *lim)
{
    decoder *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->lim = lim;
    d->cinfo.err = jpeg_std_error(&d->jerr);
    d->jerr.error_exit = on_error_exit;
    d->jerr.emit_message = on_emit_message;
    d->progress.progress_monitor = on_progress;
    return d;
}

ml_status ml_image_probe(const uint8_t *data, size_t len, const ml_image_limits *lim,
                         ml_image_info *info, char *err, size_t errlen)
{
    memset(info, 0, sizeof *info);
    const other_format *f = other_format_of(data, len);
    if (f)
        return f->probe(data, len, lim, info, err, errlen);
    if (!data || !jpeg_signature(data, len))
        return not_decoded_here(data, len, err, errlen);
    decoder *d = decoder_create(lim);
    if (!d)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory for the JPEG decoder");
    ml_status st = probe_guarded(d, data, len, info);
    if (st != ML_OK)
        ml_fail(err, errlen, st, "%s", d->msg);
    jpeg_destroy_decompress(&d->cinfo);
    free(d);
    return st;
}

ml_status ml_image_decode(const uint8_t *data, size_t len, const ml_image_limits *lim,
                          ml_image_rgb *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    const other_format *f = other_format_of(data, len);
    if (f)
        return f->decode(data, len, lim, out, err, errlen);
    if (!data || !jpeg_signature(data, len))
        return not_decoded_here(data, len, err, errlen);

    decoder *d = decoder_create(lim);
    if (!d)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory for the JPEG decoder");
    ml_status st = decode_guarded(d, data, len, out);
    if (st != ML_OK)
        ml_fail(err, errlen, st, "%s", d->msg);
    jpeg_destroy_decompress(&d->cinfo);
    free(d->pixels);
    free(d);
    return st;
}

void ml_image_rgb_deinit(ml_image_rgb *img)
{
    if (!img)
        return;
    free(img->pixels);
    memset(img, 0, sizeof *img);
}
