/* GIF -> RGB with giflib, reproducing what transformers 4.47's
 * MllamaImageProcessor makes of PIL.Image.open(gif) with Pillow 13, whose
 * GifImagePlugin decodes the first frame (an animation's too: frame 0
 * depends on no other, so animated GIFs give it as Pillow does) into:
 *
 *   size     the logical screen, grown to hold the frame when it extends
 *            past the screen's right or bottom edge
 *   pixels   outside the frame, the transparent index when the frame has
 *            one, else index 0; inside, the frame's indices (interlaced
 *            rows put back in order)
 *   mode     "P" with the frame's palette (the local one, else the global
 *            one), unless that palette is the grey ramp (entry i is
 *            (i, i, i) throughout; GifImagePlugin._is_palette_needed) or
 *            absent: mode "L", the index read as a grey level
 *   alpha    the graphic control extension's transparent index, the last
 *            one before the frame that sets the flag
 *
 * and convert_to_rgb turns both modes into RGBA, an index past the
 * palette's entries black, the transparent index alpha 0, composited over
 * white (alpha.c): the transparent index comes out white, every other as
 * its colour. One case Pillow decodes as neither: a local grey-ramp palette
 * over a global palette that is not one, which Pillow reads as mode "L"
 * with the global palette's colours (reproduced here) and cannot convert
 * at all when the frame has a transparent index (refused here).
 *
 * Where this differs from Pillow, on files that break the GIF
 * specification. Refused here, read by Pillow: a byte between blocks that
 * begins no block (Pillow skips it), image data whose sub-blocks end
 * without their terminator (giflib reads to it after the last pixel), a
 * graphic control extension shorter than 4 bytes that does not set the
 * transparency flag (Pillow refuses the ones that do), an LZW code size
 * under 2 (the specification's least; giflib decodes a code size of 1
 * otherwise than Pillow) or above 8.
 *
 * Hostile input: the size is known from the screen and the frame's
 * descriptor, read before any pixel memory exists, and checked against the
 * limits; the decode needs the RGB output and one row of indices. Only the
 * first frame is read: nothing after it is looked at, so frames appended
 * to a file cost nothing. */
#include "image/image_internal.h"

#include <stdlib.h>
#include <string.h>

#include <gif_lib.h>

#define SIGNATURE_BYTES 6
#define PALETTE_ENTRIES 256
/* The graphic control extension: flags, delay (2 bytes), transparent
 * index; giflib hands the block over after its length byte. */
#define GCE_BYTES 4
#define GCE_FLAGS 1
#define GCE_INDEX 4
#define GCE_TRANSPARENT 0x01u
#define NO_TRANSPARENCY (-1)
/* The image descriptor after its ',': left, top, width, height (2 bytes
 * each), flags; a local palette of 3 << ((flags & 7) + 1) bytes follows
 * when flags has 0x80, then the LZW code size. */
#define DESCRIPTOR_BYTES 9
#define DESCRIPTOR_FLAGS 8
#define LOCAL_PALETTE 0x80u
#define PALETTE_BITS 0x07u
#define RGB_BYTES 3
/* LZW code sizes giflib decodes as the specification means them: 2 for a
 * two-colour image, 8 for 256 colours. */
#define MIN_CODE_SIZE 2
#define MAX_CODE_SIZE 8
/* Interlaced rows: each pass's first row and step (the GIF specification). */
#define INTERLACE_PASSES 4
static const uint32_t pass_start[INTERLACE_PASSES] = {0, 4, 2, 1};
static const uint32_t pass_step[INTERLACE_PASSES] = {8, 8, 4, 2};

int ml_image_gif_signature(const uint8_t *data, size_t len)
{
    return len >= SIGNATURE_BYTES &&
           (!memcmp(data, "GIF87a", SIGNATURE_BYTES) || !memcmp(data, "GIF89a", SIGNATURE_BYTES));
}

/* giflib reads from memory. */
typedef struct reader {
    const uint8_t *data;
    size_t len, pos;
} reader;

static int read_bytes(GifFileType *g, GifByteType *buf, int n)
{
    reader *r = g->UserData;
    size_t k = r->len - r->pos < (size_t)n ? r->len - r->pos : (size_t)n;
    memcpy(buf, r->data + r->pos, k);
    r->pos += k;
    return (int)k;
}

/* The first frame, read up to its pixels, and what Pillow makes of it. */
typedef struct gif_frame {
    GifFileType *g;
    reader in;
    uint32_t width, height;         /* the image: the screen grown to the frame */
    uint32_t x0, y0, w, h;          /* the frame */
    int transparent;                /* the transparent index, or NO_TRANSPARENCY */
    uint8_t rgb[PALETTE_ENTRIES][ML_IMAGE_CHANNELS]; /* each index's output */
} gif_frame;

static const char *gif_error_text(int code)
{
    const char *what = GifErrorString(code);
    return what ? what : "unknown giflib error";
}

static ml_status gif_error(int code, char *err, size_t errlen)
{
    return ml_fail(err, errlen, code == D_GIF_ERR_NOT_ENOUGH_MEM ? ML_ERR_NOMEM : ML_ERR_FORMAT,
                   "invalid GIF: %s", gif_error_text(code));
}

/* Whether Pillow uses the palette: present, and not the grey ramp. */
static int palette_needed(const ColorMapObject *map)
{
    if (!map)
        return 0;
    for (int i = 0; i < map->ColorCount; i++) {
        const GifColorType *c = &map->Colors[i];
        if (c->Red != i || c->Green != i || c->Blue != i)
            return 1;
    }
    return 0;
}

/* Each index's colour as convert_to_rgb gives it (the table at the top). */
static void set_colours(gif_frame *f, const ColorMapObject *map)
{
    for (int i = 0; i < PALETTE_ENTRIES; i++) {
        uint8_t *c = f->rgb[i];
        if (i == f->transparent)
            memset(c, 255, ML_IMAGE_CHANNELS); /* alpha 0 over white */
        else if (!map)
            memset(c, i, ML_IMAGE_CHANNELS);
        else if (i < map->ColorCount)
            c[0] = map->Colors[i].Red, c[1] = map->Colors[i].Green, c[2] = map->Colors[i].Blue;
        else
            memset(c, 0, ML_IMAGE_CHANNELS);
    }
}

/* The extensions before the first frame: the transparent index of the
 * graphic control ones, every sub-block read past. */
static ml_status read_extension(gif_frame *f, char *err, size_t errlen)
{
    int code;
    GifByteType *block;
    if (DGifGetExtension(f->g, &code, &block) == GIF_ERROR)
        return gif_error(f->g->Error, err, errlen);
    if (code == GRAPHICS_EXT_FUNC_CODE) {
        if (!block || block[0] < GCE_BYTES)
            return ml_fail(err, errlen, ML_ERR_FORMAT,
                           "GIF graphic control extension of %d bytes (4 expected)",
                           block ? block[0] : 0);
        if (block[GCE_FLAGS] & GCE_TRANSPARENT)
            f->transparent = block[GCE_INDEX];
    }
    while (block)
        if (DGifGetExtensionNext(f->g, &block) == GIF_ERROR)
            return gif_error(f->g->Error, err, errlen);
    return ML_OK;
}

/* The LZW code size of the image whose descriptor starts at data[at] (after
 * its ','), read from the bytes: giflib reads it but does not say. -1 when
 * the data ends first. */
static int code_size_at(const uint8_t *data, size_t len, size_t at)
{
    if (len - at <= DESCRIPTOR_BYTES)
        return -1;
    const uint8_t flags = data[at + DESCRIPTOR_FLAGS];
    const size_t palette =
        flags & LOCAL_PALETTE ? (size_t)RGB_BYTES << ((flags & PALETTE_BITS) + 1) : 0;
    return len - at - DESCRIPTOR_BYTES > palette ? data[at + DESCRIPTOR_BYTES + palette] : -1;
}

/* Open data and read up to the first frame's pixels, checking its size;
 * the caller closes f->g whatever the result. */
static ml_status open_first_frame(const uint8_t *data, size_t len, const ml_image_limits *lim,
                                  gif_frame *f, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    f->transparent = NO_TRANSPARENCY;
    f->in = (reader){.data = data, .len = len};
    int code;
    if (!(f->g = DGifOpen(&f->in, read_bytes, &code)))
        return gif_error(code, err, errlen);
    for (;;) {
        GifRecordType type;
        if (DGifGetRecordType(f->g, &type) == GIF_ERROR)
            return gif_error(f->g->Error, err, errlen);
        if (type == TERMINATE_RECORD_TYPE)
            return ml_fail(err, errlen, ML_ERR_FORMAT, "GIF has no image");
        if (type == IMAGE_DESC_RECORD_TYPE)
            break;
        ml_status st = type == EXTENSION_RECORD_TYPE ? read_extension(f, err, errlen) : ML_OK;
        if (st != ML_OK)
            return st;
    }
    const size_t descriptor = f->in.pos;
    if (DGifGetImageDesc(f->g) == GIF_ERROR)
        return gif_error(f->g->Error, err, errlen);
    const int code_size = code_size_at(data, len, descriptor);
    if (code_size < MIN_CODE_SIZE || code_size > MAX_CODE_SIZE)
        return ml_fail(err, errlen, ML_ERR_FORMAT, "GIF LZW code size %d (2 to 8)", code_size);
    const GifImageDesc *d = &f->g->Image;
    if (f->g->SWidth <= 0 || f->g->SHeight <= 0 || d->Width <= 0 || d->Height <= 0)
        return ml_fail(err, errlen, ML_ERR_FORMAT, "GIF has a zero dimension");
    f->x0 = (uint32_t)d->Left, f->y0 = (uint32_t)d->Top;
    f->w = (uint32_t)d->Width, f->h = (uint32_t)d->Height;
    f->width = f->x0 + f->w > (uint32_t)f->g->SWidth ? f->x0 + f->w : (uint32_t)f->g->SWidth;
    f->height = f->y0 + f->h > (uint32_t)f->g->SHeight ? f->y0 + f->h : (uint32_t)f->g->SHeight;
    ml_status st = ml_image_check_size(f->width, f->height, lim, err, errlen);
    if (st != ML_OK)
        return st;

    const ColorMapObject *local = d->ColorMap, *global = f->g->SColorMap;
    if (palette_needed(local)) {
        set_colours(f, local);
        return ML_OK;
    }
    if (local && palette_needed(global) && f->transparent != NO_TRANSPARENCY)
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                       "GIF with a grey-ramp local palette over a global palette and a "
                       "transparent index (Pillow cannot convert it)");
    set_colours(f, palette_needed(global) ? global : NULL);
    return ML_OK;
}

static void close_gif(gif_frame *f)
{
    if (f->g)
        DGifCloseFile(f->g, NULL);
}

ml_status ml_image_gif_probe(const uint8_t *data, size_t len, const ml_image_limits *lim,
                             ml_image_info *info, char *err, size_t errlen)
{
    gif_frame *f = malloc(sizeof *f);
    if (!f)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory for the GIF decoder");
    ml_status st = open_first_frame(data, len, lim, f, err, errlen);
    if (st == ML_OK)
        *info = (ml_image_info){.width = f->width, .height = f->height, .n_scans = 1};
    close_gif(f);
    free(f);
    return st;
}

/* The frame's rows into pixels (the image, filled around the frame). */
static ml_status read_rows(gif_frame *f, uint8_t *pixels, char *err, size_t errlen)
{
    uint8_t *row = malloc(f->w);
    if (!row)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory for a GIF row");
    const int passes = f->g->Image.Interlace ? INTERLACE_PASSES : 1;
    ml_status st = ML_OK;
    for (int p = 0; p < passes && st == ML_OK; p++) {
        const uint32_t first = passes > 1 ? pass_start[p] : 0, step = passes > 1 ? pass_step[p] : 1;
        for (uint32_t y = first; y < f->h; y += step) {
            if (DGifGetLine(f->g, row, (int)f->w) == GIF_ERROR) {
                st = ml_fail(err, errlen, ML_ERR_FORMAT,
                             "truncated or corrupt GIF image data (%s)",
                             gif_error_text(f->g->Error));
                break;
            }
            uint8_t *dst = pixels + ((size_t)(f->y0 + y) * f->width + f->x0) * ML_IMAGE_CHANNELS;
            for (uint32_t x = 0; x < f->w; x++, dst += ML_IMAGE_CHANNELS)
                memcpy(dst, f->rgb[row[x]], ML_IMAGE_CHANNELS);
        }
    }
    free(row);
    return st;
}

ml_status ml_image_gif_decode(const uint8_t *data, size_t len, const ml_image_limits *lim,
                              ml_image_rgb *out, char *err, size_t errlen)
{
    gif_frame *f = malloc(sizeof *f);
    if (!f)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory for the GIF decoder");
    uint8_t *pixels = NULL;
    ml_status st = open_first_frame(data, len, lim, f, err, errlen);
    if (st == ML_OK) {
        const size_t n = (size_t)f->width * f->height;
        pixels = malloc(n * ML_IMAGE_CHANNELS);
        if (!pixels)
            st = ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory for the decoded image");
    }
    if (st == ML_OK) {
        /* The screen around the frame, when there is any: most frames cover it. */
        const uint8_t *fill = f->rgb[f->transparent != NO_TRANSPARENCY ? f->transparent : 0];
        if (f->w != f->width || f->h != f->height)
            for (size_t i = 0; i < (size_t)f->width * f->height; i++)
                memcpy(pixels + i * ML_IMAGE_CHANNELS, fill, ML_IMAGE_CHANNELS);
        st = read_rows(f, pixels, err, errlen);
    }
    if (st == ML_OK)
        *out = (ml_image_rgb){.pixels = pixels, .width = f->width, .height = f->height};
    else
        free(pixels);
    close_gif(f);
    free(f);
    return st;
}
