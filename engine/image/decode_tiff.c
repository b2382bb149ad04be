/* TIFF -> RGB with libtiff, reproducing what transformers 4.47's
 * MllamaImageProcessor makes of PIL.Image.open(tiff) with Pillow 13: the
 * first page (IFD 0; a scan's further pages are not read), its samples as
 * Pillow's TiffImagePlugin maps them to a mode (OPEN_INFO), then
 * convert_to_rgb's composite over white (alpha.c), then the Orientation
 * tag applied, as Pillow 13 does on load (ImageOps.exif_transpose).
 *
 *   photometric        samples                        Pillow's mode, and what comes out
 *   0, 1 (grey)        1, 2, 4 or 8 bits              "1" or "L": grey, scaled to 0..255
 *                                                     (v * 255 / (2^bits - 1)), inverted
 *                                                     for 0 (WhiteIsZero)
 *                      8 bits + 1 extra               "L" (extra unspecified: dropped) or
 *                                                     "LA" (unassociated alpha)
 *   2 (RGB)            8 bits x 3, + 0..3 extra       "RGB" (extras unspecified), "RGBA"
 *                                                     (the first extra unassociated alpha,
 *                                                     the rest unspecified; or a fourth
 *                                                     sample without the ExtraSamples tag)
 *   3 (palette)        1, 2, 4 or 8 bits              "P": the colour map's 16-bit entries
 *                                                     divided by 256
 *   6 (YCbCr)          8 bits x 3, JPEG compression   "RGB": libjpeg's conversion, as Pillow
 *                                                     asks libtiff for it (JPEGCOLORMODE_RGB)
 *
 * Every compression Debian's libtiff decodes (none, LZW and Deflate with
 * or without a predictor, PackBits, CCITT fax for bilevel scans, JPEG,
 * ZSTD, LZMA, WebP, ...), strips or tiles, contiguous or separate planes,
 * either byte order and fill order. Refused, named: 16-bit and wider or
 * floating-point samples, associated (premultiplied) alpha, CMYK, CIELab
 * and the other photometrics, YCbCr without JPEG, old-style JPEG.
 *
 * Hostile input: libtiff reads from the caller's buffer (no copy, no file),
 * its errors come back per handle (TIFFOpenOptions, not the process-wide
 * handler), and its allocations are bounded (TIFFOpenOptionsSetMaxSingleMem
 * Alloc). The size comes from the first directory and is checked against
 * the limits before any pixel memory; the decode holds the raw samples
 * (at most 6 bytes a pixel), the RGB output, and one strip or tile. */
#include "image/image_internal.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tiffio.h>

#define SIGNATURE_BYTES 4
#define GREY_BITS_MAX 8
#define EXTRA_MAX 3                  /* extra samples Pillow's table knows, beyond the colour */
#define EXTRA_UNSPECIFIED 0
#define EXTRA_ASSOCIATED 1
#define EXTRA_UNASSOCIATED 2
#define EXTRA_COREL 999              /* Corel Draw 10's value, read as unassociated alpha */
#define COLORMAP_SHIFT 8             /* Pillow: b // 256 */
#define RGB_SAMPLES 3
/* libtiff's largest single allocation: a strip or tile of the largest image
 * the pixel limit lets through is far below it. */
#define MAX_SINGLE_ALLOC ((tmsize_t)1 << 30)

int ml_image_tiff_signature(const uint8_t *data, size_t len)
{
    return len >= SIGNATURE_BYTES &&
           (!memcmp(data, "II*\0", SIGNATURE_BYTES) || !memcmp(data, "MM\0*", SIGNATURE_BYTES));
}

/* ---- libtiff over the caller's bytes --------------------------------------------- */

typedef struct source {
    const uint8_t *data;
    toff_t len, pos;
    char msg[256];     /* libtiff's first error */
} source;

static tmsize_t src_read(thandle_t h, void *buf, tmsize_t n)
{
    source *s = h;
    toff_t k = s->pos < s->len ? s->len - s->pos : 0;
    if ((toff_t)n < k)
        k = (toff_t)n;
    memcpy(buf, s->data + s->pos, (size_t)k);
    s->pos += k;
    return (tmsize_t)k;
}

static tmsize_t src_write(thandle_t h, void *buf, tmsize_t n)
{
    (void)h, (void)buf, (void)n;
    return 0;
}

static toff_t src_seek(thandle_t h, toff_t off, int whence)
{
    source *s = h;
    if (whence == SEEK_CUR)
        off += s->pos;
    else if (whence == SEEK_END)
        off += s->len;
    s->pos = off;
    return off;
}

static int src_close(thandle_t h)
{
    (void)h;
    return 0;
}

static toff_t src_size(thandle_t h)
{
    return ((source *)h)->len;
}

/* Mapped: libtiff reads strips straight from the caller's bytes. */
static int src_map(thandle_t h, void **base, toff_t *size)
{
    source *s = h;
    *base = (void *)s->data;
    *size = s->len;
    return 1;
}

static void src_unmap(thandle_t h, void *base, toff_t size)
{
    (void)h, (void)base, (void)size;
}

static int on_error(TIFF *tif, void *user, const char *module, const char *fmt, va_list ap)
{
    (void)tif, (void)module;
    source *s = user;
    if (!s->msg[0])
        vsnprintf(s->msg, sizeof s->msg, fmt, ap);
    return 1;
}

static int on_warning(TIFF *tif, void *user, const char *module, const char *fmt, va_list ap)
{
    (void)tif, (void)user, (void)module, (void)fmt, (void)ap;
    return 1;
}

static TIFF *open_tiff(source *s, const uint8_t *data, size_t len)
{
    *s = (source){.data = data, .len = len};
    TIFFOpenOptions *o = TIFFOpenOptionsAlloc();
    if (!o)
        return NULL;
    TIFFOpenOptionsSetMaxSingleMemAlloc(o, MAX_SINGLE_ALLOC);
    TIFFOpenOptionsSetErrorHandlerExtR(o, on_error, s);
    TIFFOpenOptionsSetWarningHandlerExtR(o, on_warning, s);
    TIFF *tif = TIFFClientOpenExt("image", "r", s, src_read, src_write, src_seek, src_close,
                                  src_size, src_map, src_unmap, o);
    TIFFOpenOptionsFree(o);
    return tif;
}

static ml_status tiff_error(const source *s, const char *what, char *err, size_t errlen)
{
    return ml_fail(err, errlen, ML_ERR_FORMAT, "invalid TIFF: %s%s%s", what, s->msg[0] ? ": " : "",
                   s->msg);
}

/* ---- the layout, as Pillow reads it ---------------------------------------------- */

typedef enum kind { GREY, PALETTE, RGB, YCBCR_JPEG } kind;

typedef struct layout {
    uint32_t width, height;   /* as stored; orientation 5..8 swap them on output */
    uint16_t photometric, bits, spp, planar, orientation;
    kind kind;
    int alpha;                /* the sample after the colour is unassociated alpha */
    uint16_t *cmap[RGB_SAMPLES]; /* libtiff's (PALETTE) */
} layout;

static ml_status unsupported(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ml_status unsupported(char *err, size_t errlen, const char *fmt, ...)
{
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ml_fail(err, errlen, ML_ERR_UNSUPPORTED, "TIFF with %s is not supported", what);
}

/* The first directory's size and sample layout, checked against the limits
 * and against what is decoded here. */
static ml_status read_layout(TIFF *tif, const source *s, const ml_image_limits *lim, layout *l,
                             char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    uint16_t compression = COMPRESSION_NONE, format = SAMPLEFORMAT_UINT, n_extra = 0;
    uint16_t *extra = NULL;
    if (!TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &l->width) ||
        !TIFFGetField(tif, TIFFTAG_IMAGELENGTH, &l->height))
        return tiff_error(s, "no image size", err, errlen);
    TIFFGetFieldDefaulted(tif, TIFFTAG_ORIENTATION, &l->orientation);
    if (l->orientation < ORIENTATION_TOPLEFT || l->orientation > ORIENTATION_LEFTBOT)
        l->orientation = ORIENTATION_TOPLEFT;
    bool swap = l->orientation >= ORIENTATION_LEFTTOP;
    ml_status st = ml_image_check_size(swap ? l->height : l->width, swap ? l->width : l->height,
                                       lim, err, errlen);
    if (st != ML_OK)
        return st;
    TIFFGetFieldDefaulted(tif, TIFFTAG_COMPRESSION, &compression);
    TIFFGetFieldDefaulted(tif, TIFFTAG_BITSPERSAMPLE, &l->bits);
    TIFFGetFieldDefaulted(tif, TIFFTAG_SAMPLESPERPIXEL, &l->spp);
    TIFFGetFieldDefaulted(tif, TIFFTAG_SAMPLEFORMAT, &format);
    TIFFGetFieldDefaulted(tif, TIFFTAG_PLANARCONFIG, &l->planar);
    TIFFGetField(tif, TIFFTAG_EXTRASAMPLES, &n_extra, &extra);
    if (!TIFFGetField(tif, TIFFTAG_PHOTOMETRIC, &l->photometric))
        return tiff_error(s, "no photometric interpretation", err, errlen);
    if (compression == COMPRESSION_OJPEG)
        return unsupported(err, errlen, "old-style JPEG compression");
    if (l->photometric > PHOTOMETRIC_PALETTE && l->photometric != PHOTOMETRIC_YCBCR)
        return unsupported(err, errlen, "photometric interpretation %u", l->photometric);
    unsigned colour = l->photometric == PHOTOMETRIC_RGB || l->photometric == PHOTOMETRIC_YCBCR
                          ? RGB_SAMPLES
                          : 1;
    if (l->spp < colour || l->spp - colour > EXTRA_MAX)
        return unsupported(err, errlen, "%u samples per pixel for photometric %u", l->spp,
                           l->photometric);
    /* Pillow's table names each extra: the first alpha when unassociated (or
     * Corel Draw's 999, alone), the others unspecified; a fourth RGB sample
     * without the tag is alpha too. Any other arrangement it cannot read. */
    unsigned n_more = l->spp - colour;
    bool untagged_alpha = colour == RGB_SAMPLES && n_more == 1 && n_extra == 0;
    bool named = n_extra == n_more;
    for (unsigned i = 1; named && i < n_more; i++)
        named = extra[i] == EXTRA_UNSPECIFIED;
    if (named && n_more > 1)
        named = extra[0] != EXTRA_COREL;
    if (!named && !untagged_alpha)
        return unsupported(err, errlen, "%u samples per pixel and %u extra samples", l->spp,
                           n_extra);
    unsigned first = n_more > 0 && n_extra > 0 ? extra[0] : EXTRA_UNSPECIFIED;
    if (first == EXTRA_ASSOCIATED)
        return unsupported(err, errlen, "associated (premultiplied) alpha");
    l->alpha = untagged_alpha || first == EXTRA_UNASSOCIATED || first == EXTRA_COREL;
    bool eight = l->bits == 8;
    switch (l->photometric) {
    case PHOTOMETRIC_MINISWHITE:
    case PHOTOMETRIC_MINISBLACK:
        l->kind = GREY;
        if (l->bits != 1 && l->bits != 2 && l->bits != 4 && !eight)
            return unsupported(err, errlen, "%u-bit grey samples", l->bits);
        if (l->spp > 1 && (!eight || l->photometric == PHOTOMETRIC_MINISWHITE || l->spp > 2))
            return unsupported(err, errlen, "%u samples of %u bits for grey", l->spp, l->bits);
        break;
    case PHOTOMETRIC_PALETTE:
        l->kind = PALETTE;
        if (l->spp != 1 || (l->bits != 1 && l->bits != 2 && l->bits != 4 && !eight))
            return unsupported(err, errlen, "a palette of %u samples of %u bits", l->spp,
                               l->bits);
        if (!TIFFGetField(tif, TIFFTAG_COLORMAP, &l->cmap[0], &l->cmap[1], &l->cmap[2]))
            return tiff_error(s, "a palette image without a colour map", err, errlen);
        break;
    case PHOTOMETRIC_RGB:
        l->kind = RGB;
        if (!eight)
            return unsupported(err, errlen, "%u-bit RGB samples", l->bits);
        break;
    case PHOTOMETRIC_YCBCR:
        l->kind = YCBCR_JPEG;
        if (compression != COMPRESSION_JPEG || l->planar != PLANARCONFIG_CONTIG || !eight ||
            l->spp != RGB_SAMPLES)
            return unsupported(err, errlen, "YCbCr samples other than 3 of 8 bits, contiguous, "
                               "JPEG-compressed");
        /* libjpeg converts to RGB, as Pillow has libtiff ask it to. */
        if (!TIFFSetField(tif, TIFFTAG_JPEGCOLORMODE, JPEGCOLORMODE_RGB))
            return tiff_error(s, "JPEG colour mode", err, errlen);
        break;
    }
    /* Pillow reads 8-bit signed grey as its bytes, and nothing else signed. */
    bool signed_grey = format == SAMPLEFORMAT_INT && l->kind == GREY && eight && l->spp == 1 &&
                       l->photometric == PHOTOMETRIC_MINISBLACK;
    if (format != SAMPLEFORMAT_UINT && !signed_grey)
        return unsupported(err, errlen, "sample format %u", format);
    return ML_OK;
}

/* ---- samples ---------------------------------------------------------------------- */

/* The raw samples, as libtiff decodes them (fill order and predictor
 * undone): one buffer of rows per plane (one plane when contiguous). */
typedef struct raw {
    uint8_t *plane[1 + EXTRA_MAX + RGB_SAMPLES];
    size_t row_bytes;         /* of one row of one plane */
    unsigned n_planes;
} raw;

static void raw_free(raw *r)
{
    for (unsigned p = 0; p < r->n_planes; p++)
        free(r->plane[p]);
}

/* Copy rows [y0, y0 + n) of a decoded strip or tile (cols [x0, x0 + w) of
 * each, `stride` bytes apart in buf) into plane p. Bit-packed samples only
 * come one to a pixel, in images whose tiles are whole bytes wide (the
 * TIFF specification makes tile widths multiples of 16). */
static void put_block(raw *r, unsigned p, const uint8_t *buf, size_t stride, uint32_t x0,
                      uint32_t y0, uint32_t w, uint32_t n, unsigned bits_per_pixel)
{
    size_t off = (size_t)x0 * bits_per_pixel / 8;
    size_t bytes = ((size_t)w * bits_per_pixel + 7) / 8;
    if (off + bytes > r->row_bytes)
        bytes = r->row_bytes - off;
    for (uint32_t y = 0; y < n; y++)
        memcpy(r->plane[p] + (size_t)(y0 + y) * r->row_bytes + off, buf + (size_t)y * stride,
               bytes);
}

static ml_status read_samples(TIFF *tif, const source *s, const layout *l,
                              const ml_image_limits *lim, raw *r, char *err, size_t errlen)
{
    bool separate = l->planar == PLANARCONFIG_SEPARATE && l->spp > 1;
    unsigned per_plane = separate ? 1 : l->spp;
    unsigned bpp = per_plane * l->bits;
    memset(r, 0, sizeof *r);
    r->n_planes = separate ? l->spp : 1;
    r->row_bytes = ((size_t)l->width * bpp + 7) / 8;
    for (unsigned p = 0; p < r->n_planes; p++)
        if (!(r->plane[p] = calloc(l->height, r->row_bytes)))
            return ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory for the TIFF samples");
    bool tiled = TIFFIsTiled(tif);
    tmsize_t size = tiled ? TIFFTileSize(tif) : TIFFStripSize(tif);
    uint32_t bw = l->width, bh = 0;
    if (tiled) {
        TIFFGetField(tif, TIFFTAG_TILEWIDTH, &bw);
        TIFFGetField(tif, TIFFTAG_TILELENGTH, &bh);
    } else {
        TIFFGetFieldDefaulted(tif, TIFFTAG_ROWSPERSTRIP, &bh);
        if (bh > l->height)
            bh = l->height;
    }
    /* A tile may be larger than a small image, not larger than the limit. */
    if (size <= 0 || bw == 0 || bh == 0 || (tiled && bw % 8 != 0) ||
        (uint64_t)bw * bh > lim->max_pixels)
        return tiff_error(s, tiled ? "bad tile size" : "bad strip size", err, errlen);
    size_t stride = tiled ? ((size_t)bw * bpp + 7) / 8 : r->row_bytes;
    if ((size_t)size < stride * bh)
        return tiff_error(s, "strips or tiles smaller than their rows", err, errlen);
    uint8_t *buf = malloc((size_t)size);
    if (!buf)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory for a TIFF strip");
    ml_status st = ML_OK;
    for (unsigned p = 0; p < r->n_planes && st == ML_OK; p++)
        for (uint32_t y = 0; y < l->height && st == ML_OK; y += bh)
            for (uint32_t x = 0; x < l->width && st == ML_OK; x += bw) {
                uint32_t n = l->height - y < bh ? l->height - y : bh;
                uint32_t w = l->width - x < bw ? l->width - x : bw;
                tmsize_t got =
                    tiled ? TIFFReadEncodedTile(tif, TIFFComputeTile(tif, x, y, 0, (uint16_t)p),
                                                buf, size)
                          : TIFFReadEncodedStrip(tif, TIFFComputeStrip(tif, y, (uint16_t)p), buf,
                                                 (tmsize_t)(stride * n));
                if (got < 0)
                    st = tiff_error(s, tiled ? "a tile does not decode" : "a strip does not decode",
                                    err, errlen);
                else
                    put_block(r, p, buf, stride, x, y, w, n, bpp);
            }
    free(buf);
    return st;
}

/* Sample i (0 = the first) of pixel x of row y. */
static unsigned sample(const raw *r, const layout *l, uint32_t x, uint32_t y, unsigned i)
{
    if (r->n_planes > 1)
        return r->plane[i][(size_t)y * r->row_bytes + x];
    const uint8_t *row = r->plane[0] + (size_t)y * r->row_bytes;
    if (l->bits == 8)
        return row[(size_t)x * l->spp + i];
    size_t bit = (size_t)x * l->bits;
    unsigned mask = (1u << l->bits) - 1;
    return (unsigned)row[bit / 8] >> (8 - l->bits - bit % 8) & mask;
}

/* ---- pixels, then the orientation ------------------------------------------------- */

/* Row y as RGBA, what convert_to_rgb composites (alpha 255 without alpha). */
static void rgba_row(const raw *r, const layout *l, uint32_t y, uint8_t *out)
{
    unsigned max = (1u << l->bits) - 1;
    for (uint32_t x = 0; x < l->width; x++, out += ML_IMAGE_RGBA_BYTES) {
        unsigned v = sample(r, l, x, y, 0);
        switch (l->kind) {
        case GREY:
            v = v * 255 / max;
            if (l->photometric == PHOTOMETRIC_MINISWHITE)
                v = 255 - v;
            out[0] = out[1] = out[2] = (uint8_t)v;
            out[3] = l->alpha ? (uint8_t)sample(r, l, x, y, 1) : 255;
            break;
        case PALETTE:
            for (unsigned c = 0; c < RGB_SAMPLES; c++)
                out[c] = (uint8_t)(l->cmap[c][v] >> COLORMAP_SHIFT);
            out[3] = 255;
            break;
        case RGB:
        case YCBCR_JPEG:
            out[0] = (uint8_t)v;
            out[1] = (uint8_t)sample(r, l, x, y, 1);
            out[2] = (uint8_t)sample(r, l, x, y, 2);
            out[3] = l->alpha ? (uint8_t)sample(r, l, x, y, RGB_SAMPLES) : 255;
            break;
        }
    }
}

/* Where the stored pixel (x, y) of a w x h image lands under orientation o
 * (ImageOps.exif_transpose: 2 mirror, 3 rotate 180, 4 flip, 5 transpose,
 * 6 rotate 270, 7 transverse, 8 rotate 90), in an image of out_w columns. */
static size_t oriented(uint16_t o, uint32_t x, uint32_t y, uint32_t w, uint32_t h, uint32_t out_w)
{
    uint32_t ox = x, oy = y;
    switch (o) {
    case ORIENTATION_TOPRIGHT: ox = w - 1 - x; break;
    case ORIENTATION_BOTRIGHT: ox = w - 1 - x, oy = h - 1 - y; break;
    case ORIENTATION_BOTLEFT: oy = h - 1 - y; break;
    case ORIENTATION_LEFTTOP: ox = y, oy = x; break;
    case ORIENTATION_RIGHTTOP: ox = h - 1 - y, oy = x; break;
    case ORIENTATION_RIGHTBOT: ox = h - 1 - y, oy = w - 1 - x; break;
    case ORIENTATION_LEFTBOT: ox = y, oy = w - 1 - x; break;
    default: break;
    }
    return ((size_t)oy * out_w + ox) * ML_IMAGE_CHANNELS;
}

static ml_status to_rgb(const raw *r, const layout *l, ml_image_rgb *out, char *err,
                        size_t errlen)
{
    bool swap = l->orientation >= ORIENTATION_LEFTTOP;
    uint32_t ow = swap ? l->height : l->width, oh = swap ? l->width : l->height;
    uint8_t *rgb = malloc((size_t)ow * oh * ML_IMAGE_CHANNELS);
    uint8_t *rgba = malloc((size_t)l->width * ML_IMAGE_RGBA_BYTES);
    if (!rgb || !rgba) {
        free(rgb);
        free(rgba);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory for the decoded image");
    }
    for (uint32_t y = 0; y < l->height; y++) {
        rgba_row(r, l, y, rgba);
        if (l->orientation == ORIENTATION_TOPLEFT) {
            ml_image_rgba_over_white(rgba, l->width, rgb + (size_t)y * ow * ML_IMAGE_CHANNELS,
                                     ML_IMAGE_CHANNELS);
            continue;
        }
        ml_image_rgba_over_white(rgba, l->width, rgba, ML_IMAGE_CHANNELS);
        for (uint32_t x = 0; x < l->width; x++)
            memcpy(rgb + oriented(l->orientation, x, y, l->width, l->height, ow),
                   rgba + (size_t)x * ML_IMAGE_CHANNELS, ML_IMAGE_CHANNELS);
    }
    free(rgba);
    *out = (ml_image_rgb){.pixels = rgb, .width = ow, .height = oh};
    return ML_OK;
}

/* ---- entry points ------------------------------------------------------------------ */

/* data opened and its first directory read: the handle (TIFFClose is the
 * caller's), or NULL with *st and err set. */
static TIFF *open_layout(const uint8_t *data, size_t len, const ml_image_limits *lim,
                         source *s, layout *l, ml_status *st, char *err, size_t errlen)
{
    TIFF *tif = open_tiff(s, data, len);
    if (!tif) {
        *st = tiff_error(s, "no first directory", err, errlen);
        return NULL;
    }
    *st = read_layout(tif, s, lim, l, err, errlen);
    if (*st != ML_OK) {
        TIFFClose(tif);
        return NULL;
    }
    return tif;
}

ml_status ml_image_tiff_probe(const uint8_t *data, size_t len, const ml_image_limits *lim,
                              ml_image_info *info, char *err, size_t errlen)
{
    source s;
    layout l;
    ml_status st;
    TIFF *tif = open_layout(data, len, lim, &s, &l, &st, err, errlen);
    if (!tif)
        return st;
    TIFFClose(tif);
    bool swap = l.orientation >= ORIENTATION_LEFTTOP;
    *info = (ml_image_info){.width = swap ? l.height : l.width,
                            .height = swap ? l.width : l.height, .n_scans = 1};
    return ML_OK;
}

ml_status ml_image_tiff_decode(const uint8_t *data, size_t len, const ml_image_limits *lim,
                               ml_image_rgb *out, char *err, size_t errlen)
{
    source s;
    layout l;
    ml_status st;
    TIFF *tif = open_layout(data, len, lim, &s, &l, &st, err, errlen);
    if (!tif)
        return st;
    raw r = {0};
    st = read_samples(tif, &s, &l, lim, &r, err, errlen);
    if (st == ML_OK)
        st = to_rgb(&r, &l, out, err, errlen);
    raw_free(&r);
    TIFFClose(tif);
    return st;
}
