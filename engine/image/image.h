/* Image input for the vision tower: JPEG/PNG/WebP/GIF/TIFF decode and Mllama tile
 * preprocessing.
 *
 * Reproduces transformers 4.47 `MllamaImageProcessor` (the PIL/numpy "slow"
 * processor, engine/model/README.md §2) bit for bit on JPEG, PNG, WebP, GIF and TIFF
 * input:
 *
 *   bytes --ml_image_decode--> uint8 RGB (as the processor's convert_to_rgb makes
 *                               it of PIL's Image.open(...))
 *         --ml_image_plan----> canvas (tiles_h, tiles_w), fit size, aspect ratio id/mask
 *         --ml_image_preprocess--> float32 (n_tiles, 3, S, S): PIL bilinear resize,
 *                               bottom/right zero pad, rescale, normalize, tile
 *
 * JPEG (libjpeg), PNG (libpng), still WebP (libwebp), GIF (giflib, the
 * first frame) and TIFF (libtiff, the first page) are decoded, told apart by
 * their signatures; every other format is ML_ERR_UNSUPPORTED.
 * Preprocessing never allocates: the caller asks for the sizes and provides
 * the output tensor and a scratch workspace, so the runtime can slice both
 * from its per-request arena.
 * @locality: every function is thread-safe; there is no global state. */
#ifndef ML_IMAGE_H
#define ML_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define ML_IMAGE_CHANNELS 3

/* Decode limits. A 50-megapixel ceiling admits every phone camera (48-50 MP
 * sensors) while bounding a decode at about 150 MB of RGB output plus, for a
 * progressive JPEG, at most 8 bytes/pixel of libjpeg coefficient buffers (a
 * WebP decodes into 4 bytes/pixel of RGBA, and a lossless one needs libwebp's
 * own 4 more; a PNG or GIF needs only a row besides the output; a TIFF holds
 * its raw samples, at most 6 bytes/pixel, and one strip or tile). */
#define ML_IMAGE_DEFAULT_MAX_PIXELS 50000000ull
/* Largest width or height decoded: the resampler's limit (ml_image_resize).
 * A JPEG cannot exceed it; a PNG that does is ML_ERR_TOO_LARGE. */
#define ML_IMAGE_MAX_SIDE 65535u
/* Progressive JPEGs from real encoders have 10 scans (libjpeg's and
 * Pillow's script for colour), 6 for grey and 18 for CMYK (libjpeg's
 * jpeg_simple_progression), and optimised encoders (mozjpeg, jpegli) stay
 * around a dozen. Each scan re-walks the whole image, so a file of many
 * scans is a cheap CPU bomb: a few hundred bytes per scan of end-of-band
 * runs cost a pass over 50 megapixels each. 32 leaves room above every
 * encoder's script; the count is read from the markers before decoding. */
#define ML_IMAGE_DEFAULT_MAX_SCANS 32u

/* Preprocessing parameters, as in the published preprocessor_config.json. */
#define ML_IMAGE_DEFAULT_TILE_SIZE 560u
#define ML_IMAGE_DEFAULT_MAX_TILES 4u
/* Largest max_tiles accepted: bounds the tile grids and the mask below. */
#define ML_IMAGE_MAX_TILES_CAP 16u

typedef struct ml_image_limits {
    uint64_t max_pixels; /* width * height ceiling, checked from the header before any allocation */
    uint32_t max_scans;  /* JPEG scans ceiling (progressive and multi-scan sequential files) */
} ml_image_limits;

/* What ml_image_probe reads from a header. */
typedef struct ml_image_info {
    uint32_t width;
    uint32_t height;
    uint32_t n_scans; /* JPEG: scans (SOS markers) in the file; PNG: 1 */
} ml_image_info;

/* A decoded image. `pixels` is owned by the struct and released by
 * ml_image_rgb_deinit. */
typedef struct ml_image_rgb {
    uint8_t *pixels; /* (height, width, 3) row-major RGB */
    uint32_t width;
    uint32_t height;
} ml_image_rgb;

typedef struct ml_image_params {
    uint32_t tile_size;    /* size.height == size.width */
    uint32_t max_tiles;    /* max_image_tiles */
    int do_rescale;        /* multiply by rescale_factor (in float64, then cast to float32) */
    double rescale_factor; /* 1/255 */
    int do_normalize;      /* (x - mean) / std in float32 */
    float mean[ML_IMAGE_CHANNELS]; /* image_mean, cast to float32 as IT.normalize does */
    float std[ML_IMAGE_CHANNELS];  /* image_std, cast to float32 */
    ml_image_limits limits;
} ml_image_params;

/* Where one image lands on the tile canvas (ml_image_plan). */
typedef struct ml_image_layout {
    uint32_t width, height;                 /* source image */
    uint32_t resized_width, resized_height; /* after the fit-to-canvas resize */
    uint32_t tile_size;
    uint32_t max_tiles;
    uint32_t tiles_h, tiles_w; /* canvas in tiles: (tiles_h * S) x (tiles_w * S) */
    uint32_t n_tiles;          /* tiles_h * tiles_w */
    uint32_t aspect_ratio_id;  /* 1 + index of (tiles_h, tiles_w) among the supported grids */
    uint8_t aspect_ratio_mask[ML_IMAGE_MAX_TILES_CAP]; /* first max_tiles used: 1 for t < n_tiles */
} ml_image_layout;

/* ---- decode ------------------------------------------------------------ */

/* Defaults: ML_IMAGE_DEFAULT_MAX_PIXELS, ML_IMAGE_DEFAULT_MAX_SCANS. */
void ml_image_limits_default(ml_image_limits *lim);

/* "image/png", "image/jpeg", "image/webp" or "image/gif" when data starts
 * with that format's signature (as ml_image_decode tells them apart), else NULL: the media
 * type a client labels a data URL with. Static strings. */
const char *ml_image_media_type(const uint8_t *data, size_t len);

/* Read the header of a JPEG (its markers up to the first scan, with
 * libjpeg, and the scan count, walking the markers without decoding) or of
 * a PNG (IHDR) and check it against lim, allocating no pixel memory and
 * decoding nothing: what a caller budgets a request's images with before it
 * decodes any. The work is a pass over the bytes, microseconds per
 * megabyte.
 * Returns ML_OK with *info filled, or:
 *   ML_ERR_UNSUPPORTED  neither JPEG nor PNG (as ml_image_decode);
 *   ML_ERR_TOO_LARGE    width*height above lim->max_pixels, a side above
 *                       ML_IMAGE_MAX_SIDE, or more than lim->max_scans
 *                       JPEG scans, with the numbers in err;
 *   ML_ERR_FORMAT       no readable header (ml_image_decode says more);
 *   ML_ERR_NOMEM        allocation failure (libjpeg's header tables).
 * ml_image_decode makes the same checks before it allocates the pixels, so
 * a file it accepts passes here. `data` is borrowed. */
ml_status ml_image_probe(const uint8_t *data, size_t len, const ml_image_limits *lim,
                         ml_image_info *info, char *err, size_t errlen);

/* Decode a JPEG or a PNG, recognised by its signature (the media type a
 * client declares plays no part), into the RGB that transformers'
 * convert_to_rgb makes of PIL.Image.open(BytesIO(data)).
 * JPEG, exactly as Pillow opens it and converts it to "RGB": libjpeg's
 * default accurate integer IDCT and fancy upsampling; grayscale is
 * replicated to three channels; CMYK/YCCK is read as Adobe-inverted CMYK and
 * converted with Pillow's cmyk2rgb.
 * PNG (every colour type and bit depth, tRNS, Adam7): Pillow's mode for the
 * file converted to RGBA and composited over white unless the mode is RGB,
 * with Pillow's integer arithmetic (16-bit samples keep their high byte,
 * 16-bit grey is clipped at 255; decode_png.c has the table). An APNG gives
 * its default image, which is Pillow's frame 0.
 * EXIF orientation is not applied, and neither are gamma or ICC profiles.
 * Returns ML_OK and fills *out (release with ml_image_rgb_deinit), or:
 *   ML_ERR_UNSUPPORTED  neither JPEG nor PNG (the format is named when
 *                       recognised), a JPEG with a component count other
 *                       than 1, 3 or 4, or an APNG whose first frame does not
 *                       cover the canvas;
 *   ML_ERR_TOO_LARGE    width*height above lim->max_pixels or a side above
 *                       ML_IMAGE_MAX_SIDE, or more than lim->max_scans JPEG
 *                       scans (all checked from the header and the markers
 *                       before the pixel buffer is allocated, as
 *                       ml_image_probe checks them);
 *   ML_ERR_FORMAT       corrupt or truncated data, a bad PNG CRC (the
 *                       decoder's message in err);
 *   ML_ERR_NOMEM        allocation failure.
 * On error *out is left empty (pixels NULL). `data` is borrowed. */
ml_status ml_image_decode(const uint8_t *data, size_t len, const ml_image_limits *lim,
                          ml_image_rgb *out, char *err, size_t errlen);

/* Release the pixels and zero the struct. NULL and empty structs are fine. */
void ml_image_rgb_deinit(ml_image_rgb *img);

/* ---- parameters -------------------------------------------------------- */

/* The published Llama 3.2 Vision preprocessor_config.json values
 * (engine/model/README.md §1) and the default decode limits. */
void ml_image_params_default(ml_image_params *p);

/* Override *p with the keys present in a preprocessor_config.json text:
 * size {height, width}, max_image_tiles, resample (must be 2, bilinear),
 * do_rescale, rescale_factor, do_normalize, image_mean, image_std, and
 * do_resize / do_pad / do_convert_rgb (must be true, as transformers
 * requires). Other keys are ignored; absent keys keep their value in *p.
 * Returns ML_ERR_FORMAT (bad JSON or a mistyped key, named in err) or
 * ML_ERR_UNSUPPORTED (a valid setting this implementation does not cover);
 * *p is unchanged on error. */
ml_status ml_image_params_parse(const char *json, size_t len, ml_image_params *p, char *err,
                                size_t errlen);

/* Defaults, overridden by <model_dir>/preprocessor_config.json when that file
 * exists. A missing file is not an error (ML_OK with defaults); a file that
 * cannot be read is ML_ERR_IO; otherwise as ml_image_params_parse. */
ml_status ml_image_params_load(const char *model_dir, ml_image_params *p, char *err,
                               size_t errlen);

/* ---- planning and preprocessing ---------------------------------------- */

/* Choose the tile canvas and the resized size of a width x height image
 * (transformers get_optimal_tiled_canvas and get_image_size_fit_to_canvas)
 * and fill *layout, including the aspect ratio id and mask.
 * Returns ML_ERR_INVALID_ARG for zero dimensions or parameters out of range
 * (tile_size 0 or above 65535, max_tiles 0 or above ML_IMAGE_MAX_TILES_CAP),
 * ML_ERR_UNSUPPORTED when the aspect ratio is so extreme that a side would
 * resize to 0 pixels (transformers raises there too). */
ml_status ml_image_plan(uint32_t width, uint32_t height, const ml_image_params *p,
                        ml_image_layout *layout, char *err, size_t errlen);

/* Floats in the pixel tensor of a planned image: n_tiles * 3 * S * S. */
size_t ml_image_pixels_count(const ml_image_layout *layout);

/* Bytes of scratch memory ml_image_preprocess needs for a planned image. */
size_t ml_image_workspace_size(const ml_image_layout *layout);

/* Resize, pad, rescale, normalize and tile one decoded image.
 * `pixels` receives the float32 (n_tiles, 3, S, S) tensor, tile index
 * row * tiles_w + col (split_to_tiles); it must hold
 * ml_image_pixels_count(layout) floats. `workspace` must hold
 * ml_image_workspace_size(layout) bytes, any alignment.
 * Returns ML_ERR_INVALID_ARG when img does not match the layout or a buffer is
 * too small; nothing is written then. All buffers are borrowed. */
ml_status ml_image_preprocess(const ml_image_rgb *img, const ml_image_params *p,
                              const ml_image_layout *layout, void *workspace,
                              size_t workspace_size, float *pixels, size_t pixels_count,
                              char *err, size_t errlen);

/* Zero tiles n_tiles .. max_tiles-1 of a vision-tower slot whose first
 * n_tiles tiles ml_image_preprocess has written:
 * slot is float32 (max_tiles, 3, S, S) (pack_images: missing tiles are 0.0). */
void ml_image_pack_slot(const ml_image_layout *layout, float *slot);

/* Aspect ratio ids and masks of a sample with n_slots image slots of which the
 * first n_images are real (convert_aspect_ratios_to_ids,
 * build_aspect_ratio_mask): ids[n_slots] (0 for a padding slot),
 * mask[n_slots * max_tiles] (1 for real tiles; tile 0 is 1 in every slot,
 * padding slots included). Requires n_images <= n_slots and every layout
 * planned with this max_tiles. */
void ml_image_pack_aspect(const ml_image_layout *layouts, size_t n_images, size_t n_slots,
                          uint32_t max_tiles, int32_t *ids, int32_t *mask);

/* ---- the resampler ----------------------------------------------------- */

/* Bytes of scratch memory ml_image_resize needs. */
size_t ml_image_resize_workspace_size(uint32_t src_w, uint32_t src_h, uint32_t dst_w,
                                      uint32_t dst_h);

/* Pillow's Image.resize((dst_w, dst_h), Resampling.BILINEAR) on an RGB image,
 * bit-exact with Pillow 13 (libImaging/Resample.c: antialiased triangle
 * filter, weights quantised to 22 fractional bits, two separable passes with
 * a uint8 clip in between, vertical first only when the height shrinks by
 * more than twice as many pixels as the width; a same-size resize is a copy).
 * src is (src_h, src_w, 3), dst is (dst_h, dst_w, 3), both uint8 and
 * borrowed; workspace holds ml_image_resize_workspace_size bytes.
 * Returns ML_ERR_INVALID_ARG for a zero dimension or a side above 65535. */
ml_status ml_image_resize(const uint8_t *src, uint32_t src_w, uint32_t src_h, uint8_t *dst,
                          uint32_t dst_w, uint32_t dst_h, void *workspace, size_t workspace_size);

#endif
