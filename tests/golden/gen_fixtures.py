#!/usr/bin/env python3
"""Golden fixtures for mllama-worker, made by Hugging Face transformers.

    /opt/refvenv/bin/python tests/golden/gen_fixtures.py [--only GROUP]

GROUP is one of images, seeds, masks, models, tokenizer, lora, reference (default: all).

Writes under tests/golden/fixtures/ (see tests/golden/README.md for the layout):
  images/     real JPEG/PNG/WebP/GIF photos and, per image, what the transformers 4.47.1
              MllamaImageProcessor (the PIL/numpy one) makes of it: canvas choice,
              resize size, aspect ratio id/mask and sha256 of the decoded, resized and
              normalized tensors; a 2-sample packed batch; small PNGs of every colour
              type, bit depth, tRNS form, Adam7 and APNG; lossy and lossless WebPs with
              and without alpha; GIFs Pillow writes and GIFs only its reader handles.
  masks/      cross-attention masks from transformers' own processing_mllama helpers.
  models/     tiny random Mllama checkpoints (bf16 safetensors in the 4.47 layout) and
              float32 reference activations, logits and greedy tokens.
  tokenizer/  written by tests/golden/tokenizer_refs.py (another generator; called here).
  lora/       a tiny model (m3's configuration, its own weights), two PEFT LoRA adapters
              saved with save_pretrained, and float32 logits and greedy tokens of the base
              model and of each adapter on one two-image prompt.
  reference_mode/
              the same models and adapters run with Meta's cross-attention row mask
              (a one-function patch of transformers' cross-attention decoder layer, checked
              against a direct re-implementation of Meta's CrossAttentionTransformerBlock),
              and how far their logits and greedy tokens are from transformers' own.

The group `seeds` writes the png_*.png, webp_*.webp, gif_*.gif and tiff_*.tif seeds of
tests/fuzz/corpus/image/
(tiny valid files and hostile ones) and prints what Pillow + convert_to_rgb make of
each, the expectations tests/engine/test_image_decode.c holds.

Everything is deterministic: photos come from scikit-image's bundled samples, random
numbers from numpy's PCG64 with fixed seeds, torch runs on one CPU thread. Re-running
on the same machine and package versions rewrites identical files. The float32
reference activations may differ in the last bits on a CPU with a different SIMD
path; weights, images and every integer output do not.

Python is only needed to regenerate these files: tests never run it. The generator
refuses transformers versions outside TRANSFORMERS_RANGE (tests/golden/README.md says why).
"""
import argparse
import contextlib
import hashlib
import importlib.util
import inspect
import io
import json
import math
import os
import shutil
import struct
import sys
import zlib
from fractions import Fraction

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN_DIR = os.path.join(REPO_ROOT, "tests", "golden")
FIXTURES_DIR = os.path.join(GOLDEN_DIR, "fixtures")
IMAGES_DIR = os.path.join(FIXTURES_DIR, "images")
IMAGE_SEEDS_DIR = os.path.join(REPO_ROOT, "tests", "fuzz", "corpus", "image")
MASKS_DIR = os.path.join(FIXTURES_DIR, "masks")
MODELS_DIR = os.path.join(FIXTURES_DIR, "models")
TOKENIZER_REFS = os.path.join(GOLDEN_DIR, "tokenizer_refs.py")

# preprocessor_config.json of Llama-3.2-11B-Vision(-Instruct) (engine/model/README.md §1, end).
REAL_TILE = 560
MAX_TILES = 4
IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]
RESCALE_FACTOR = 0.00392156862745098
RESAMPLE_BILINEAR = 2
SUPPORTED_ASPECT_RATIOS = [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]]

JPEG_QUALITY = 85
REAL_IMAGE_TOKEN = 128256
PATCH_SIZE = 14
# The text vocabulary of a tiny model mirrors the real one: its last SPECIALS ids are
# special tokens at the same offsets as 128000..128255 (bos +0, eot +9, ...).
SPECIALS = 256
GREEDY_STEPS = 32
# Cached-decode vs. recomputed float32 logits agree to ~5e-6; this only guards
# against a semantic mismatch (e.g. a wrong decode-time cross-attention mask).
RECOMPUTE_TOL = 1e-4
SDPA_TOL = 1e-4
# A greedy run stuck on one or two tokens checks little of the decode path.
MIN_DISTINCT_GREEDY = 8
# transformers versions whose Mllama behaves as the fixtures record: 4.45.0 introduced
# Mllama; from 4.54 the vision encoder's hidden_states list no longer starts with the
# encoder's input, so intermediate_layers_indices select one layer late and an index equal
# to num_hidden_layers raises IndexError. [low, high): the committed files were made with
# 4.47.1 (requirements.txt).
TRANSFORMERS_RANGE = ("4.45.0", "4.54.0")


def log(msg):
    print(msg, flush=True)


# ======================================================================================
# Small helpers
# ======================================================================================

def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def sha256_file(path):
    with open(path, "rb") as f:
        return sha256_bytes(f.read())


def sha256_array(arr, dtype):
    """sha256 of the C-order little-endian bytes of arr cast to dtype ('<f4', 'u1', ...)."""
    return sha256_bytes(np.ascontiguousarray(arr, dtype=np.dtype(dtype)).tobytes())


def to_builtin(obj):
    """numpy scalars/arrays inside obj -> plain Python, so json can write them."""
    if isinstance(obj, dict):
        return {str(k): to_builtin(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_builtin(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_builtin(obj.tolist())
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def json_text(obj, indent=0):
    """JSON with 2-space indentation where lists of scalars stay on one line."""
    pad, inner = " " * indent, " " * (indent + 2)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = ["%s%s: %s" % (inner, json.dumps(k), json_text(v, indent + 2))
                 for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        items = [inner + json_text(v, indent + 2) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj)


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        f.write(json_text(to_builtin(obj)) + "\n")
    log("wrote %s" % os.path.relpath(path, REPO_ROOT))


def reset_dir(path):
    """Empty path (it is ours entirely) so stale files never survive a regeneration."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)


def versions():
    import PIL
    import safetensors
    import skimage
    import tokenizers
    import torch
    import transformers
    from PIL import features

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "pillow": PIL.__version__,
        "pillow_libjpeg_turbo": features.version("libjpeg_turbo"),
        "pillow_zlib": features.version("zlib"),
        "pillow_libwebp": features.version("webp"),
        "scikit_image": skimage.__version__,
    }


def sample_photo(name):
    """A real photo from scikit-image's bundled sample data, as a uint8 array."""
    import skimage.data

    return getattr(skimage.data, name)()


def photo_at(source, width, height):
    """source cropped to the width:height aspect around its center, resized to
    width x height with LANCZOS. Returns a PIL image (RGB, or L for gray sources)."""
    from PIL import Image

    img = Image.fromarray(sample_photo(source))
    sw, sh = img.size
    if sw * height > sh * width:
        cw, ch = max(1, round(sh * width / height)), sh
    else:
        cw, ch = sw, max(1, round(sw * height / width))
    left, top = (sw - cw) // 2, (sh - ch) // 2
    img = img.crop((left, top, left + cw, top + ch))
    return img.resize((width, height), Image.Resampling.LANCZOS)


def make_image_processor(tile):
    """transformers' PIL/numpy MllamaImageProcessor with the published settings and
    the given tile size (560 for the real model, image_size for a tiny one)."""
    from transformers.models.mllama.image_processing_mllama import MllamaImageProcessor

    return MllamaImageProcessor(
        do_convert_rgb=True, do_resize=True, size={"height": tile, "width": tile},
        resample=RESAMPLE_BILINEAR, do_rescale=True, rescale_factor=RESCALE_FACTOR,
        do_normalize=True, image_mean=IMAGE_MEAN, image_std=IMAGE_STD, do_pad=True,
        max_image_tiles=MAX_TILES)


def canvas_analysis(height, width, tile):
    """The candidates of get_optimal_tiled_canvas with their scales, evaluated as the
    processor does (float64 numpy), plus which ones tie at the selected scale."""
    from transformers.models.mllama.image_processing_mllama import get_optimal_tiled_canvas

    cands = []
    for a, b in SUPPORTED_ASPECT_RATIOS:
        sh = np.float64(a * tile) / height
        sw = np.float64(b * tile) / width
        cands.append(((a, b), float(sh if sw > sh else sw)))
    scales = [s for _, s in cands]
    up = [s for s in scales if s >= 1]
    selected = min(up) if up else max(scales)
    tied = [list(ab) for ab, s in cands if s == selected]
    canvas = get_optimal_tiled_canvas(height, width, MAX_TILES, tile)
    return {
        "candidates": [{"tiles": list(ab), "scale": s} for ab, s in cands],
        "branch": "upscale" if up else "downscale",
        "selected_scale": selected,
        "tied_at_selected_scale": tied,
        "canvas_height": int(canvas[0]),
        "canvas_width": int(canvas[1]),
    }


def exact_resize_size(height, width, canvas_h, canvas_w, tile):
    """get_image_size_fit_to_canvas in exact rational arithmetic: where it differs from
    the processor's float64 result, the float rounding decided the size."""
    tw = min(max(width, tile), canvas_w)
    th = min(max(height, tile), canvas_h)
    sh, sw = Fraction(th, height), Fraction(tw, width)
    if sw < sh:
        return min(math.floor(height * sw), th), tw
    return th, min(math.floor(width * sh), tw)


def run_processor(processor, images):
    """processor(images) with the uint8 output of its own resize step captured.

    images: list (batch) of lists of PIL images. Returns (BatchFeature as numpy,
    list of (H, W, 3) uint8 resized images in processing order)."""
    resized = []
    original = processor.resize

    def capture(*args, **kwargs):
        out = original(*args, **kwargs)
        resized.append(np.ascontiguousarray(out[0].transpose(1, 2, 0)))  # (3,H,W) -> (H,W,3)
        return out

    processor.resize = capture
    try:
        out = processor(images=images, return_tensors="np")
    finally:
        del processor.resize
    return out, resized


# ======================================================================================
# A) Images
# ======================================================================================

# (stem, scikit-image source, width, height, container, save options, purpose)
IMAGE_CASES = [
    ("ex_640x480", "astronaut", 640, 480, "jpeg", {},
     "spec worked example: canvas (1,2), fits, no resize"),
    ("ex_1024x768", "coffee", 1024, 768, "jpeg", {},
     "spec worked example: canvas (2,2), fits, no resize"),
    ("ex_1920x1080", "chelsea", 1920, 1080, "jpeg", {},
     "spec worked example: canvas (2,2), antialiased downscale to 630x1120"),
    ("ex_300x1200", "astronaut", 300, 1200, "jpeg", {},
     "spec worked example: canvas (3,1), no resize"),
    ("ex_4000x500", "coffee", 4000, 500, "jpeg", {},
     "spec worked example: canvas (1,4), downscale to 280x2240"),
    ("ex_224x220", "chelsea", 224, 220, "jpeg", {},
     "spec worked example: canvas (1,1), upscale to 550x560"),
    ("ex_561x560", "astronaut", 561, 560, "jpeg", {},
     "spec worked example: canvas (1,2), odd width, no resize"),
    ("ex_800x800", "coffee", 800, 800, "jpeg", {},
     "spec worked example: canvas (2,2), fits, no resize"),
    ("ar13_1500x500", "chelsea", 1500, 500, "jpeg", {},
     "canvas (1,3): ties with (1,4) at scale 1.12, the smaller area wins; no resize"),
    ("ar21_500x900", "astronaut", 500, 900, "jpeg", {},
     "canvas (2,1): ties with (3,1) and (4,1), the smallest area wins; no resize"),
    ("ar41_300x2000", "coffee", 300, 2000, "jpeg", {},
     "canvas (4,1), no resize"),
    ("tile_560x560", "astronaut", 560, 560, "jpeg", {},
     "exactly one tile, no resize"),
    ("tie_down_2200x1100", "coffee", 2200, 1100, "jpeg", {},
     "downscale branch with (1,2),(1,3),(1,4),(2,2) tied; float64 floor makes the width "
     "1119 (exact arithmetic would give 1120)"),
    ("floor_up_100x45", "chelsea", 100, 45, "jpeg", {},
     "upscale to width 560; float64 floor makes the height 251 (exact: 252)"),
    ("floor_down_1900x1045", "astronaut", 1900, 1045, "jpeg", {},
     "canvas (2,2) downscale; float64 floor makes the height 615 (exact: 616)"),
    ("tiny_16x16", "coffee", 16, 16, "jpeg", {},
     "35x bilinear upscale; 7 candidates tie, (1,1) wins"),
    ("gray_700x420", "camera", 700, 420, "jpeg", {},
     "1-channel (mode L) JPEG: processor converts via RGBA + white composite"),
    ("cmyk_420x700", "rocket", 420, 700, "jpeg", {"cmyk": True},
     "CMYK JPEG (Adobe, inverted in the file): Pillow CMYK->RGB then the white composite"),
    ("rgba_160x120", "astronaut", 160, 120, "png", {"alpha": True},
     "RGBA PNG with an alpha gradient and a transparent block: composite over white"),
    ("progressive_900x600", "rocket", 900, 600, "jpeg", {"progressive": True},
     "progressive JPEG, canvas (2,2)"),
    ("sub444_600x450", "chelsea", 600, 450, "jpeg", {"subsampling": 0},
     "baseline JPEG with 4:4:4 chroma (no chroma upsampling)"),
    ("sub422_450x600", "coffee", 450, 600, "jpeg", {"subsampling": 1},
     "baseline JPEG with 4:2:2 chroma"),
    ("restart_640x360", "rocket", 640, 360, "jpeg", {"restart_marker_rows": 1},
     "JPEG with a restart marker after every MCU row"),
    ("exif6_320x240", "astronaut", 320, 240, "jpeg", {"exif_orientation": 6},
     "EXIF Orientation=6; Image.open + the processor ignore it (pixels as stored)"),
    ("webp_lossy_640x480", "coffee", 640, 480, "webp", {"quality": 80},
     "lossy WebP (VP8): libwebp's YUV 4:2:0 with its default fancy upsampling, mode RGB"),
    ("webp_lossless_300x200", "chelsea", 300, 200, "webp", {"lossless": True},
     "lossless WebP (VP8L), mode RGB"),
    ("webp_alpha_lossy_320x240", "astronaut", 320, 240, "webp", {"quality": 75, "alpha": True},
     "lossy WebP with an alpha plane (VP8X + ALPH), mode RGBA: composite over white"),
    ("webp_alpha_lossless_200x150", "rocket", 200, 150, "webp",
     {"lossless": True, "alpha": True},
     "lossless WebP with alpha, mode RGBA: composite over white"),
]

# ---- GIF variants -------------------------------------------------------------------
# Pillow writes palette, grey and animated GIFs; gif_encode writes what Pillow's writer
# never does: a first frame smaller than the screen or past it, a transparent index
# around the frame, indices past the palette, a local palette over a global one, an LZW
# code size under 8. Pillow only reads them back, as the reference.

GIF_TRAILER = b";"


def gif_lzw(indices, code_size):
    """LZW data coding every index as a literal, with a clear code before the code
    width would grow (valid LZW that any decoder reads)."""
    clear = 1 << code_size
    width = code_size + 1
    literals_per_clear = (1 << width) - clear - 2 - 1
    out, acc, nbits, run = bytearray(), 0, 0, 0

    def emit(code):
        nonlocal acc, nbits
        acc |= code << nbits
        nbits += width
        while nbits >= 8:
            out.append(acc & 0xff)
            acc >>= 8
            nbits -= 8

    emit(clear)
    for v in indices:
        if run == literals_per_clear:
            emit(clear)
            run = 0
        emit(int(v))
        run += 1
    emit(clear + 1)
    if nbits:
        out.append(acc & 0xff)
    return bytes(out)


def gif_sub_blocks(data):
    return b"".join(bytes([len(data[i:i + 255])]) + data[i:i + 255]
                    for i in range(0, len(data), 255)) + b"\0"


def gif_palette_field(palette):
    """(flag bits, bytes) of a palette of 2^n RGB entries."""
    bits = max(1, (len(palette) - 1).bit_length())
    if len(palette) != 1 << bits:
        raise ValueError("a GIF palette has 2^n entries")
    return 0x80 | (bits - 1), np.asarray(palette, np.uint8).tobytes()


def gif_encode(screen, frame, indices, global_palette=None, local_palette=None,
               transparent=None, interlace=False, code_size=8):
    """A GIF89a of one frame: screen (w, h), frame (x, y, w, h), indices (h, w)."""
    flags, gpal = (0, b"") if global_palette is None else gif_palette_field(global_palette)
    if global_palette is not None:
        flags |= (flags & 7) << 4
    out = b"GIF89a" + struct.pack("<HHBBB", screen[0], screen[1], flags, 0, 0) + gpal
    if transparent is not None:
        out += b"!\xf9\x04" + struct.pack("<BHB", 1, 10, transparent) + b"\0"
    lflags, lpal = (0, b"") if local_palette is None else gif_palette_field(local_palette)
    rows = np.asarray(indices, np.uint8)
    if interlace:
        lflags |= 0x40
        rows = np.concatenate([rows[0::8], rows[4::8], rows[2::4], rows[1::2]])
    out += b"," + struct.pack("<HHHHB", *frame, lflags) + lpal
    return out + bytes([code_size]) + gif_sub_blocks(gif_lzw(rows.reshape(-1), code_size)) \
        + GIF_TRAILER


def gif_quantized(source, width, height, colors):
    """(indices (h, w), palette of `colors` entries) of the photo quantized by Pillow."""
    img = photo_at(source, width, height).convert("RGB").quantize(colors)
    palette = np.asarray(img.getpalette()[:3 * colors], np.uint8).reshape(-1, 3)
    return np.asarray(img), [tuple(int(c) for c in p) for p in palette]


def write_gif_case(stem, spec, directory):
    """Write one GIF_CASES image; returns its path."""
    from PIL import Image

    path = os.path.join(directory, stem + ".gif")
    w, h = spec["width"], spec["height"]
    if "pillow" in spec:
        img = photo_at(spec["source"], w, h)
        img = img.convert("L") if spec["pillow"] == "L" else img.convert("RGB").quantize(256)
        kwargs = {k: spec[k] for k in ("transparency",) if k in spec}
        if spec.get("animated"):
            kwargs.update(save_all=True, append_images=[img.transpose(Image.Transpose.ROTATE_180)],
                          duration=100)
        img.save(path, format="GIF", **kwargs)
        return path
    fx, fy, fw, fh = spec.get("frame", (0, 0, w, h))
    local_palette = None
    if spec.get("grey"):  # the photo's grey levels as indices
        indices = np.asarray(photo_at(spec["source"], fw, fh).convert("L"))
        global_palette = [(i, i, i) for i in range(256)] if spec["grey"] == "ramp" else None
    else:
        indices, palette = gif_quantized(spec["source"], fw, fh, spec.get("colors", 256))
        global_palette = palette[:spec.get("palette_entries", len(palette))]
    if spec.get("local") == "own":
        local_palette, global_palette = palette, [tuple(255 - c for c in p) for p in palette]
    elif spec.get("local") == "grey_ramp":
        local_palette = [(i, i, i) for i in range(len(palette))]
    data = gif_encode(spec.get("screen", (w, h)), (fx, fy, fw, fh), indices, global_palette,
                      local_palette, spec.get("transparent"), spec.get("interlace", False),
                      spec.get("code_size", 8))
    with open(path, "wb") as f:
        f.write(data)
    return path


# (stem, spec, purpose). The stem's size is the decoded image's.
GIF_CASES = [
    ("gif_pillow_palette_64x48", dict(source="chelsea", width=64, height=48, pillow="P"),
     "Pillow's own GIF (adaptive palette): mode P"),
    ("gif_pillow_grey_48x36", dict(source="camera", width=48, height=36, pillow="L"),
     "a grey image as Pillow writes it: only the greys in use, so mode P"),
    ("gif_grey_ramp_40x30", dict(source="camera", width=40, height=30, grey="ramp"),
     "a global palette that is the grey ramp: mode L, the index is the grey level"),
    ("gif_no_palette_40x30", dict(source="camera", width=40, height=30, grey="none"),
     "no palette at all: mode L"),
    ("gif_pillow_transparent_48x36",
     dict(source="coffee", width=48, height=36, pillow="P", transparency=0),
     "Pillow's GIF with transparent index 0: those pixels white"),
    ("gif_pillow_animated_48x36",
     dict(source="rocket", width=48, height=36, pillow="P", animated=True),
     "two frames: the first is the image"),
    ("gif_subframe_trns_40x30",
     dict(source="astronaut", width=40, height=30, frame=(6, 4, 24, 18), colors=64,
          transparent=63),
     "a frame inside the screen with a transparent index: the screen around it is that "
     "index, so white"),
    ("gif_past_screen_44x34",
     dict(source="chelsea", width=44, height=34, screen=(36, 24), frame=(8, 6, 36, 28),
          colors=32, interlace=True),
     "an interlaced frame past the screen's right and bottom: the image grows to hold it, "
     "index 0's colour around it"),
    ("gif_short_palette_32x24",
     dict(source="coffee", width=32, height=24, colors=32, palette_entries=16),
     "indices 16..31 past a 16-entry palette: black"),
    ("gif_local_palette_32x24",
     dict(source="rocket", width=32, height=24, colors=64, local="own"),
     "a local palette over a different global one: the local one colours the frame"),
    ("gif_local_grey_ramp_32x24",
     dict(source="astronaut", width=32, height=24, colors=16, local="grey_ramp"),
     "a local grey-ramp palette over a global one: Pillow's mode L with the global colours"),
    ("gif_code_size2_32x24",
     dict(source="chelsea", width=32, height=24, colors=4, code_size=2),
     "four colours at LZW code size 2"),
]


# Extra uint8 dumps to debug a resampler mismatch: (stem, what, rows, cols) where rows
# and cols are Python slices of the resized (H, W, 3) image.
RESIZED_DUMPS = [
    ("floor_up_100x45", "full upscaled image (bilinear upscale path, float64-floored height)",
     slice(None), slice(None)),
    ("ex_1920x1080", "bottom-right 160x160 of the downscaled image (antialias path, edges)",
     slice(-160, None), slice(-160, None)),
]

BATCH_CASE = {
    "name": "batch_b2_n2",
    "samples": [["ex_1024x768", "ar13_1500x500"], ["ex_224x220"]],
    "purpose": "pack_images: B=2, N=2; sample 1's second slot is a padding image "
               "(aspect id 0, mask [1,0,0,0], zero pixels); sample 0 image 1 has 3 real "
               "tiles and one zero tile",
}


# ---- PNG variants -------------------------------------------------------------------
# Pillow cannot write most PNG flavours (16-bit RGB, sub-byte grey, tRNS on grey,
# Adam7), so png_encode below writes them, cycling through the five filter types;
# Pillow only reads them back, as the reference. APNGs are written by Pillow.

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_SAMPLES_PER_PIXEL = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples
PNG_GREY, PNG_RGB, PNG_PALETTE, PNG_GREY_ALPHA, PNG_RGBA = 0, 2, 3, 4, 6
# Adam7 passes: (x0, y0, dx, dy)
PNG_ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4),
             (1, 0, 2, 2), (0, 1, 1, 2)]


def png_chunk(ctype, data):
    return struct.pack(">I", len(data)) + ctype + data + struct.pack(">I", zlib.crc32(ctype + data))


def png_ihdr(width, height, depth, color_type, interlace=0):
    return png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0,
                                          interlace))


def png_pack_row(samples, depth):
    """One row of samples (1-D, channels interleaved) as PNG bytes, MSB first."""
    if depth == 16:
        return samples.astype(">u2").tobytes()
    if depth == 8:
        return samples.astype(np.uint8).tobytes()
    per_byte = 8 // depth
    out = bytearray((len(samples) + per_byte - 1) // per_byte)
    for i, v in enumerate(samples):
        out[i // per_byte] |= int(v) << (8 - depth * (i % per_byte + 1))
    return bytes(out)


def png_filter_row(ftype, row, prev, bpp):
    """Filter type ftype (0 None, 1 Sub, 2 Up, 3 Average, 4 Paeth) applied to row."""
    out = bytearray(len(row))
    for i in range(len(row)):
        a = row[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if ftype == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
        else:
            pred = [0, a, b, (a + b) // 2][ftype]
        out[i] = (row[i] - pred) & 255
    return bytes([ftype]) + bytes(out)


def png_scanlines(img, depth, first_filter):
    """Filtered scanlines of img (H, W, samples), the filter type cycling per row."""
    height, _, samples = img.shape
    bpp = max(1, samples * depth // 8)
    out, prev = [], None
    for y in range(height):
        row = png_pack_row(img[y].reshape(-1), depth)
        prev = bytes(len(row)) if prev is None else prev
        out.append(png_filter_row((first_filter + y) % 5, row, prev, bpp))
        prev = row
    return b"".join(out)


def png_encode(img, depth, color_type, palette=None, trns=None, interlace=False):
    """A PNG file of the raw samples img ((H, W) or (H, W, samples)); palette is
    (n, 3) uint8, trns the tRNS chunk's bytes."""
    img = np.asarray(img)
    img = img[:, :, None] if img.ndim == 2 else img
    height, width, samples = img.shape
    assert samples == PNG_SAMPLES_PER_PIXEL[color_type]
    if interlace:
        raw = b"".join(png_scanlines(img[y0::dy, x0::dx], depth, p)
                       for p, (x0, y0, dx, dy) in enumerate(PNG_ADAM7)
                       if img[y0::dy, x0::dx].size)
    else:
        raw = png_scanlines(img, depth, 0)
    out = PNG_SIGNATURE + png_ihdr(width, height, depth, color_type, 1 if interlace else 0)
    if palette is not None:
        out += png_chunk(b"PLTE", np.asarray(palette, np.uint8).tobytes())
    if trns is not None:
        out += png_chunk(b"tRNS", trns)
    return out + png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b"")


def png_alpha(height, width, maxval):
    """Alpha: a ramp 0..maxval along x, a fully transparent block, an opaque band."""
    alpha = np.tile(np.linspace(0, maxval, width).round().astype(np.int64), (height, 1))
    alpha[height // 4: height // 2, width // 4: width // 2] = 0
    alpha[-max(1, height // 6):, :] = maxval
    return alpha


def png_samples(stem, spec):
    """Raw samples (H, W, samples) and PLTE of one PNG_CASES spec, from a photo.
    16-bit samples get random low bytes, so a decoder that rounds instead of keeping
    the high byte shows; 16-bit grey mixes values below 256 with large ones (Pillow
    clips I;16 at 255)."""
    width, height, depth, ct = spec["width"], spec["height"], spec["depth"], spec["color_type"]
    rng = np.random.default_rng(zlib.crc32(stem.encode()))
    photo = photo_at(spec["source"], width, height)
    palette = None
    if ct == PNG_PALETTE:
        quantized = photo.convert("RGB").quantize(colors=1 << depth)
        img = np.asarray(quantized).astype(np.int64)
        palette = np.array(quantized.getpalette()[:3 * spec.get("plte_entries", 1 << depth)],
                           np.uint8).reshape(-1, 3)
        return img[:, :, None], palette
    base = np.asarray(photo.convert("RGB" if ct in (PNG_RGB, PNG_RGBA) else "L")).astype(np.int64)
    base = base[:, :, None] if base.ndim == 2 else base
    maxval = (1 << depth) - 1
    if depth == 16:
        samples = base * 256 + rng.integers(0, 256, base.shape)
        if ct == PNG_GREY:
            small = ((np.arange(height)[:, None] // 4 + np.arange(width)[None, :] // 4) % 2 == 0)
            samples = np.where(small[:, :, None], base, samples)
    else:
        samples = base >> (8 - depth)
    if ct in (PNG_GREY_ALPHA, PNG_RGBA):
        samples = np.concatenate([samples, png_alpha(height, width, maxval)[:, :, None]], -1)
    return samples, palette


def png_trns(spec, samples):
    """The tRNS chunk of a spec: a grey key, 'first_pixel' (an RGB colour that
    occurs), or palette alphas as bytes."""
    trns = spec.get("trns")
    if trns is None or isinstance(trns, bytes):
        return trns
    if trns == "first_pixel":
        return struct.pack(">HHH", *(int(v) for v in samples[0, 0]))
    return struct.pack(">H", trns)


def write_png_case(stem, spec, directory):
    """Write one PNG_CASES (or seed) image; returns its path."""
    from PIL import Image

    path = os.path.join(directory, stem + ".png")
    if "apng" in spec:
        frame = photo_at(spec["source"], spec["width"], spec["height"]).convert("RGB")
        frames = [frame, frame.transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
        frames[0].save(path, format="PNG", save_all=True, append_images=frames[1:],
                       default_image=spec["apng"] == "default", duration=100)
        return path
    samples, palette = png_samples(stem, spec)
    trns = png_trns(spec, samples)
    if palette is not None and trns is not None and len(trns) > len(palette):
        raise RuntimeError("%s: tRNS longer than PLTE, which libpng ignores" % stem)
    data = png_encode(samples, spec["depth"], spec["color_type"], palette, trns,
                      spec.get("interlace", False))
    with open(path, "wb") as f:
        f.write(data)
    return path


def png_case(source, width, height, color_type, depth, **extra):
    return dict(source=source, width=width, height=height, color_type=color_type, depth=depth,
                **extra)


# (stem, spec, purpose). Heights avoid 1 and 3, which transformers takes for channels.
PNG_CASES = [
    ("png_rgb8_48x36", png_case("astronaut", 48, 36, PNG_RGB, 8),
     "RGB, 8 bits, every filter type: mode RGB, which convert_to_rgb leaves as it is"),
    ("png_rgb8_trns_48x36", png_case("chelsea", 48, 36, PNG_RGB, 8, trns="first_pixel"),
     "RGB with a tRNS colour that occurs: mode RGB, so the processor never applies it"),
    ("png_rgb16_32x24", png_case("coffee", 32, 24, PNG_RGB, 16),
     "RGB, 16 bits, random low bytes: Pillow keeps the high byte (no rounding)"),
    ("png_rgba16_32x24", png_case("rocket", 32, 24, PNG_RGBA, 16),
     "RGBA, 16 bits: high bytes, then the composite over white"),
    ("png_grey1_trns_48x36", png_case("camera", 48, 36, PNG_GREY, 1, trns=0),
     "grey 1 bit (mode 1), tRNS 0: black becomes transparent, so white"),
    ("png_grey2_trns_48x36", png_case("camera", 48, 36, PNG_GREY, 2, trns=2),
     "grey 2 bits, tRNS 2: Pillow compares the unscaled key with the scaled values "
     "0/85/170/255, so no pixel becomes transparent"),
    ("png_grey4_trns_48x36", png_case("camera", 48, 36, PNG_GREY, 4, trns=0),
     "grey 4 bits, tRNS 0: the key matches black"),
    ("png_grey8_trns_48x36", png_case("camera", 48, 36, PNG_GREY, 8, trns=25),
     "grey 8 bits, tRNS 25, the most frequent value"),
    ("png_grey16_40x30", png_case("camera", 40, 30, PNG_GREY, 16),
     "grey 16 bits (mode I;16): Pillow clips at 255 rather than scaling"),
    ("png_grey16_trns_40x30", png_case("camera", 40, 30, PNG_GREY, 16, trns=0x100 + 25),
     "grey 16 bits, tRNS 281: Pillow compares the key's low byte (25, a frequent value "
     "below 256) with the clipped values"),
    ("png_greya8_48x36", png_case("camera", 48, 36, PNG_GREY_ALPHA, 8),
     "grey + alpha, 8 bits (mode LA)"),
    ("png_greya16_32x24", png_case("camera", 32, 24, PNG_GREY_ALPHA, 16),
     "grey + alpha, 16 bits (Pillow reads it as RGBA, high bytes)"),
    ("png_pal1_48x36", png_case("astronaut", 48, 36, PNG_PALETTE, 1),
     "palette, 1 bit, no tRNS"),
    ("png_pal2_trns_48x36", png_case("chelsea", 48, 36, PNG_PALETTE, 2, trns=b"\xff\x00"),
     "palette, 2 bits, one fully transparent entry (Pillow's single-index transparency)"),
    ("png_pal4_trns_48x36",
     png_case("coffee", 48, 36, PNG_PALETTE, 4, trns=bytes(range(0, 250, 25))),
     "palette, 4 bits, tRNS shorter than PLTE: the later entries stay opaque"),
    ("png_pal8_trns_48x36",
     png_case("rocket", 48, 36, PNG_PALETTE, 8, trns=bytes((i * 37) % 256 for i in range(200))),
     "palette, 8 bits, 200 alphas"),
    ("png_pal4_short_plte_48x36", png_case("astronaut", 48, 36, PNG_PALETTE, 4, plte_entries=12),
     "palette of 12 entries while pixels use all 16 indices (outside the PNG spec): "
     "Pillow shows the missing entries as black"),
    ("png_adam7_rgb8_37x29", png_case("chelsea", 37, 29, PNG_RGB, 8, interlace=True),
     "Adam7 RGB"),
    ("png_adam7_pal2_trns_33x21",
     png_case("coffee", 33, 21, PNG_PALETTE, 2, trns=b"\x40\xff\x00", interlace=True),
     "Adam7 palette, 2 bits, tRNS"),
    ("png_adam7_grey16_trns_30x22",
     png_case("camera", 30, 22, PNG_GREY, 16, trns=0x100 + 208, interlace=True),
     "Adam7 grey 16 bits, tRNS 464 (low byte 208, a frequent value)"),
    ("png_adam7_rgba16_27x19", png_case("rocket", 27, 19, PNG_RGBA, 16, interlace=True),
     "Adam7 RGBA 16 bits"),
    ("png_adam7_greya8_5x2", png_case("camera", 5, 2, PNG_GREY_ALPHA, 8, interlace=True),
     "Adam7 5x2: passes 1, 2 and 4 are empty"),
    ("png_adam7_grey8_1x6", png_case("camera", 1, 6, PNG_GREY, 8, interlace=True),
     "Adam7 one pixel wide: only passes 0, 2, 4 and 6 have columns"),
    ("png_apng_frame0_48x36", png_case("astronaut", 48, 36, PNG_RGB, 8, apng="frame0"),
     "APNG written by Pillow, IDAT is frame 0: Image.open shows it"),
    ("png_apng_default_48x36", png_case("chelsea", 48, 36, PNG_RGB, 8, apng="default"),
     "APNG whose IDAT default image is not an animation frame: Image.open shows it as "
     "frame 0"),
]

def save_photo(stem, source, width, height, container, options):
    """Write the fixture photo; returns its path."""
    from PIL import Image

    img = photo_at(source, width, height)
    path = os.path.join(IMAGES_DIR, stem + {"png": ".png", "webp": ".webp"}.get(container, ".jpg"))
    if options.get("alpha"):
        # Horizontal alpha ramp 0..255 plus a fully transparent block.
        alpha = np.tile(np.linspace(0, 255, width).round().astype(np.uint8), (height, 1))
        alpha[height // 4: height // 2, width // 4: width // 2] = 0
        img = img.convert("RGB")
        img.putalpha(Image.fromarray(alpha, "L"))
    if container == "png":
        img.save(path, format="PNG")
        return path
    if container == "webp":
        img.save(path, format="WEBP", lossless=options.get("lossless", False),
                 quality=options.get("quality", 80))
        return path
    kwargs = {"quality": JPEG_QUALITY}
    if options.get("cmyk"):
        img = img.convert("CMYK")
    if options.get("progressive"):
        kwargs["progressive"] = True
    if "subsampling" in options:
        kwargs["subsampling"] = options["subsampling"]
    if "restart_marker_rows" in options:
        kwargs["restart_marker_rows"] = options["restart_marker_rows"]
    if "exif_orientation" in options:
        exif = Image.Exif()
        exif[0x0112] = options["exif_orientation"]
        kwargs["exif"] = exif.tobytes()
    img.save(path, format="JPEG", **kwargs)
    return path


def describe_image(path, purpose, processor):
    """Process one fixture image as transformers does and describe every stage."""
    from PIL import Image
    from transformers.models.mllama.image_processing_mllama import (
        convert_to_rgb, get_image_size_fit_to_canvas)

    with Image.open(path) as probe:
        mode = probe.mode
        decoded = np.asarray(probe)
        orientation = probe.getexif().get(0x0112)
    with Image.open(path) as probe:
        rgb = np.asarray(convert_to_rgb(probe))
    height, width = rgb.shape[:2]

    with Image.open(path) as img:
        out, resized = run_processor(processor, [[img]])
    pixels = out["pixel_values"]                           # (1, 1, 4, 3, 560, 560)
    num_tiles = int(out["num_tiles"][0][0])
    canvas = canvas_analysis(height, width, REAL_TILE)
    tiles_h = canvas["canvas_height"] // REAL_TILE
    tiles_w = canvas["canvas_width"] // REAL_TILE
    new_h, new_w = get_image_size_fit_to_canvas(height, width, canvas["canvas_height"],
                                                canvas["canvas_width"], REAL_TILE)
    new_h, new_w = int(new_h), int(new_w)
    (resized_img,) = resized
    if resized_img.shape != (new_h, new_w, 3):
        raise RuntimeError("%s: processor resized to %s, helper says %s"
                           % (path, resized_img.shape, (new_h, new_w)))
    if num_tiles != tiles_h * tiles_w:
        raise RuntimeError("%s: num_tiles %d != %dx%d" % (path, num_tiles, tiles_h, tiles_w))
    if np.any(pixels[0, 0, num_tiles:] != 0):
        raise RuntimeError("%s: padding tiles are not exact zeros" % path)
    real = pixels[0, 0, :num_tiles]                        # (num_tiles, 3, 560, 560)

    desc = {
        "file": os.path.basename(path),
        "file_sha256": sha256_file(path),
        "purpose": purpose,
        "pil_mode": mode,
        "exif_orientation": orientation,
        "width": width,
        "height": height,
        "decoded_shape": list(decoded.shape),
        "decoded_sha256": sha256_array(decoded, "<u2" if decoded.dtype == np.uint16 else "u1"),
        "rgb_sha256": sha256_array(rgb, "u1"),
        "canvas": canvas,
        "tiles_h": tiles_h,
        "tiles_w": tiles_w,
        "num_tiles": num_tiles,
        "aspect_ratio_id": int(out["aspect_ratio_ids"][0, 0]),
        "aspect_ratio_mask": out["aspect_ratio_mask"][0, 0].tolist(),
        "resized_height": new_h,
        "resized_width": new_w,
        "resize_applied": (new_h, new_w) != (height, width),
        "resized_sha256": sha256_array(resized_img, "u1"),
        "pixel_values_shape": list(real.shape),
        "pixel_values_sha256": sha256_array(real, "<f4"),
        "pixel_values_tile_sha256": [sha256_array(t, "<f4") for t in real],
        "pixel_values_sum_f64": float(real.astype(np.float64).sum()),
        "pixel_values_abs_sum_f64": float(np.abs(real.astype(np.float64)).sum()),
    }
    exact = exact_resize_size(height, width, canvas["canvas_height"], canvas["canvas_width"],
                              REAL_TILE)
    if exact != (new_h, new_w):
        desc["exact_rational_resize"] = list(exact)
    return desc, resized_img


def describe_batch(processor, paths_by_sample, name, purpose):
    """The packed arrays for a multi-image batch (pack_images semantics)."""
    from PIL import Image

    images = [[Image.open(p) for p in sample] for sample in paths_by_sample]
    try:
        out, _ = run_processor(processor, images)
    finally:
        for sample in images:
            for img in sample:
                img.close()
    pixels = out["pixel_values"]                           # (B, N, 4, 3, 560, 560)
    return {
        "name": name,
        "purpose": purpose,
        "images": [[os.path.basename(p) for p in sample] for sample in paths_by_sample],
        "pixel_values_shape": list(pixels.shape),
        "pixel_values_sha256": sha256_array(pixels, "<f4"),
        "pixel_values_slot_sha256": [[sha256_array(pixels[b, n], "<f4")
                                      for n in range(pixels.shape[1])]
                                     for b in range(pixels.shape[0])],
        "aspect_ratio_ids": out["aspect_ratio_ids"].tolist(),
        "aspect_ratio_mask": out["aspect_ratio_mask"].tolist(),
        "num_tiles": out["num_tiles"],
    }


def gen_images():
    reset_dir(IMAGES_DIR)
    processor = make_image_processor(REAL_TILE)
    paths, index, canvases = {}, [], set()
    resized_by_stem = {}
    for stem, source, width, height, container, options, purpose in IMAGE_CASES:
        path = save_photo(stem, source, width, height, container, options)
        log("wrote %s" % os.path.relpath(path, REPO_ROOT))
        desc, resized = describe_image(path, purpose, processor)
        desc["source"] = ("skimage.data.%s(), center-cropped to %d:%d, PIL LANCZOS resize"
                          % (source, width, height))
        desc["save_options"] = dict(options, quality=JPEG_QUALITY) if container == "jpeg" \
            else options
        write_json(os.path.join(IMAGES_DIR, stem + ".json"), desc)
        paths[stem] = path
        resized_by_stem[stem] = resized
        index.append(stem)
        canvases.add((desc["tiles_h"], desc["tiles_w"]))
    for stem, spec, purpose in GIF_CASES:
        path = write_gif_case(stem, spec, IMAGES_DIR)
        log("wrote %s" % os.path.relpath(path, REPO_ROOT))
        desc, _ = describe_image(path, purpose, processor)
        desc["source"] = ("skimage.data.%s(), center-cropped, PIL LANCZOS resize"
                          % spec["source"])
        desc["gif"] = spec
        write_json(os.path.join(IMAGES_DIR, stem + ".json"), desc)
        index.append(stem)
    for stem, spec, purpose in PNG_CASES:
        path = write_png_case(stem, spec, IMAGES_DIR)
        log("wrote %s" % os.path.relpath(path, REPO_ROOT))
        desc, _ = describe_image(path, purpose, processor)
        desc["source"] = ("skimage.data.%s(), center-cropped to %d:%d, PIL LANCZOS resize"
                          % (spec["source"], spec["width"], spec["height"]))
        desc["png"] = {k: (v.hex() if isinstance(v, bytes) else v) for k, v in spec.items()
                       if k != "source"}
        write_json(os.path.join(IMAGES_DIR, stem + ".json"), desc)
        index.append(stem)
    missing = {tuple(ar) for ar in SUPPORTED_ASPECT_RATIOS} - canvases
    if missing:
        raise RuntimeError("no image selects canvases %s" % sorted(missing))

    dumps = []
    for stem, what, rows, cols in RESIZED_DUMPS:
        full = resized_by_stem[stem]
        part = np.ascontiguousarray(full[rows, cols])
        row0 = range(full.shape[0])[rows][0]
        col0 = range(full.shape[1])[cols][0]
        name = "%s.resized_r%d_c%d.npy" % (stem, row0, col0)
        np.save(os.path.join(IMAGES_DIR, name), part)
        log("wrote %s" % os.path.relpath(os.path.join(IMAGES_DIR, name), REPO_ROOT))
        dumps.append({"file": name, "image": stem, "what": what, "row0": row0, "col0": col0,
                      "shape": list(part.shape), "dtype": "uint8"})

    batch = describe_batch(processor, [[paths[s] for s in sample]
                                       for sample in BATCH_CASE["samples"]],
                           BATCH_CASE["name"], BATCH_CASE["purpose"])
    write_json(os.path.join(IMAGES_DIR, BATCH_CASE["name"] + ".json"), batch)
    write_json(os.path.join(IMAGES_DIR, "index.json"), {
        "generator": "tests/golden/gen_fixtures.py --only images",
        "versions": versions(),
        "processor": {
            "class": "transformers.models.mllama.image_processing_mllama.MllamaImageProcessor "
                     "(PIL/numpy; 4.47.1 has no fast variant)",
            "input": "PIL.Image.open(path) passed unchanged; the processor itself applies "
                     "convert_to_rgb (RGBA + alpha composite over white) to non-RGB modes",
            "config": {"size": {"height": REAL_TILE, "width": REAL_TILE},
                       "max_image_tiles": MAX_TILES, "resample": RESAMPLE_BILINEAR,
                       "rescale_factor": RESCALE_FACTOR, "image_mean": IMAGE_MEAN,
                       "image_std": IMAGE_STD, "do_convert_rgb": True, "do_resize": True,
                       "do_pad": True, "do_rescale": True, "do_normalize": True},
        },
        "hashes": {
            "decoded_sha256": "np.asarray(Image.open(path)) in the file's PIL mode "
                              "(shape decoded_shape), C order: uint8, little-endian uint16 "
                              "for I;16",
            "rgb_sha256": "uint8 (H, W, 3) after transformers' convert_to_rgb",
            "resized_sha256": "uint8 (resized_height, resized_width, 3) out of the "
                              "processor's resize step",
            "pixel_values_sha256": "float32 little-endian (num_tiles, 3, 560, 560) real "
                                   "tiles, C order; per tile in pixel_values_tile_sha256",
        },
        "images": index,
        "resized_dumps": dumps,
        "batches": [BATCH_CASE["name"]],
    })


# ======================================================================================
# A1) PNG seeds of the image fuzz target (tests/fuzz/corpus/image/png_*.png)
# ======================================================================================

# Tiny valid files: every sample layout and the Adam7 corner cases (empty passes,
# 1x1). test_image.c checks their decoded RGB against Pillow's.
PNG_SEEDS = [
    ("png_rgb8_11x13", png_case("astronaut", 11, 13, PNG_RGB, 8)),
    ("png_adam7_rgba16_9x9", png_case("rocket", 9, 9, PNG_RGBA, 16, interlace=True)),
    ("png_adam7_grey1_trns_1x1",
     png_case("camera", 1, 1, PNG_GREY, 1, trns=0, interlace=True)),
    ("png_adam7_pal4_trns_3x5",
     png_case("coffee", 3, 5, PNG_PALETTE, 4, trns=b"\x00\x80", interlace=True)),
    ("png_adam7_greya16_7x2", png_case("camera", 7, 2, PNG_GREY_ALPHA, 16, interlace=True)),
    ("png_grey2_trns_6x4", png_case("camera", 6, 4, PNG_GREY, 2, trns=0)),
    ("png_grey16_trns_5x3", png_case("camera", 5, 3, PNG_GREY, 16, trns=300)),
    ("png_pal8_trns_8x6", png_case("chelsea", 8, 6, PNG_PALETTE, 8, trns=bytes(range(0, 250, 25)))),
    ("png_apng_6x4", png_case("astronaut", 6, 4, PNG_RGB, 8, apng="frame0")),
]


def png_hostile_seeds():
    """(stem, bytes) of malformed PNGs, all but one built from one valid 8x6 RGB file;
    test_image.c holds the status each must give."""
    samples, _ = png_samples("png_hostile", png_case("coffee", 8, 6, PNG_RGB, 8))
    good = png_encode(samples, 8, PNG_RGB)
    ihdr_bytes = 25
    head = good[:len(PNG_SIGNATURE) + ihdr_bytes]  # signature + IHDR
    body = good[len(head):]                         # IDAT + IEND
    iend = png_chunk(b"IEND", b"")
    # Unfiltered scanlines (filter byte 0 + 8 RGB pixels each).
    row_bytes = 1 + 8 * 3
    rows = b"".join(b"\0" + png_pack_row(samples[y].reshape(-1), 8) for y in range(6))

    def flip(data, offset):
        out = bytearray(data)
        out[offset] ^= 1
        return bytes(out)

    def fctl(width, height, x, y):
        return png_chunk(b"fcTL", struct.pack(">IIIIIHHBB", 0, width, height, x, y, 1, 10, 0, 0))

    actl = png_chunk(b"acTL", struct.pack(">II", 2, 0))
    # A palette image with its PLTE chunk (12 bytes + 3 per entry) cut out.
    indices, palette = png_samples("png_hostile_pal", png_case("coffee", 8, 6, PNG_PALETTE, 2))
    with_plte = png_encode(indices, 2, PNG_PALETTE, palette)
    plte_at = len(PNG_SIGNATURE) + ihdr_bytes
    no_plte = with_plte[:plte_at] + with_plte[plte_at + 12 + palette.size:]
    return [
        ("png_truncated_idat", good[:len(head) + 30]),
        ("png_no_iend", good[:-len(iend)]),
        ("png_bad_crc_ihdr", flip(good, len(head) - 1)),
        ("png_bad_crc_idat", flip(good, len(good) - len(iend) - 1)),
        ("png_bad_crc_text", head + flip(png_chunk(b"tEXt", b"Comment\0hi"), -1) + body),
        ("png_huge_60000x60000", PNG_SIGNATURE + png_ihdr(60000, 60000, 8, PNG_RGB) + body),
        ("png_wide_70000x1", PNG_SIGNATURE + png_ihdr(70000, 1, 8, PNG_RGB) + body),
        ("png_zero_width", PNG_SIGNATURE + png_ihdr(0, 6, 8, PNG_RGB) + body),
        ("png_chunk_2g", head + struct.pack(">I", 0x7fffffff) + b"tEXt" + b"abc" + body),
        ("png_no_plte", no_plte),
        # A stored block whose LEN and NLEN disagree: a zlib data error.
        ("png_bad_zlib", head + png_chunk(b"IDAT", b"\x78\x9c" + bytes(range(40))) + iend),
        ("png_apng_subframe", head + actl + fctl(2, 2, 1, 1) + body),
        ("png_short_fctl", head + actl + png_chunk(b"fcTL", bytes(10)) + body),
        ("png_too_few_rows", head + png_chunk(b"IDAT", zlib.compress(rows[:4 * row_bytes])) + iend),
        ("png_bad_filter", head + png_chunk(b"IDAT", zlib.compress(b"\x07" + rows[1:])) + iend),
        # 8 MB of zeros after the last row, in 8 KB: must not be inflated.
        ("png_trailing_zlib_bomb",
         head + png_chunk(b"IDAT", zlib.compress(rows + bytes(8 << 20), 9)) + iend),
    ]


def clear_seeds(prefix, suffix):
    """Remove the seeds one generator writes, so a seed it no longer writes goes too."""
    for name in os.listdir(IMAGE_SEEDS_DIR):
        if name.startswith(prefix) and name.endswith(suffix):
            os.remove(os.path.join(IMAGE_SEEDS_DIR, name))


def pillow_outcome(path):
    """What transformers' convert_to_rgb makes of PIL.Image.open(path): (width,
    height, sha256 of the RGB) or the exception's name and message."""
    from PIL import Image
    from transformers.models.mllama.image_processing_mllama import convert_to_rgb

    with open(path, "rb") as f:
        data = io.BytesIO(f.read())
    try:
        with Image.open(data) as img:
            rgb = np.asarray(convert_to_rgb(img))
        return "%dx%d %s" % (rgb.shape[1], rgb.shape[0], sha256_array(rgb, "u1"))
    except Exception as e:  # the outcome is what is recorded
        return "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:80])


def webp_vp8l_header(width, height):
    """A lossless WebP that is only a header announcing width x height (VP8L: the
    signature byte, then 14 bits each of width - 1 and height - 1)."""
    bits = (width - 1) | (height - 1) << 14
    vp8l = b"\x2f" + struct.pack("<I", bits)
    chunk = b"VP8L" + struct.pack("<I", len(vp8l)) + vp8l + b"\0" * (len(vp8l) % 2)
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def gen_webp_seeds():
    """Tiny WebP seeds of the image fuzz target and test_image_decode: each kind of
    bitstream Pillow writes, an animation, a truncated file and a header past the
    pixel limit."""
    from PIL import Image

    clear_seeds("webp_", ".webp")
    rgb = photo_at("astronaut", 9, 7).convert("RGB")
    rgba = photo_at("coffee", 6, 5).convert("RGB")
    rgba.putalpha(Image.fromarray(np.arange(30, dtype=np.uint8).reshape(5, 6) * 8, "L"))
    frames = [photo_at(src, 4, 4).convert("RGB") for src in ("chelsea", "rocket")]
    written = {}

    def save(stem, img, **kwargs):
        path = os.path.join(IMAGE_SEEDS_DIR, stem + ".webp")
        img.save(path, format="WEBP", **kwargs)
        written[stem] = path

    save("webp_lossy_9x7", rgb, quality=80)
    save("webp_lossless_9x7", rgb, lossless=True)
    save("webp_alpha_lossy_6x5", rgba, quality=80)
    save("webp_alpha_lossless_6x5", rgba, lossless=True)
    save("webp_animated_4x4", frames[0], save_all=True, append_images=frames[1:], duration=100,
         lossless=True)
    with open(written["webp_lossy_9x7"], "rb") as f:
        lossy = f.read()
    hostile = [("webp_truncated", lossy[:len(lossy) * 2 // 3]),
               ("webp_huge_16384x16384", webp_vp8l_header(16384, 16384))]
    for stem, data in hostile:
        written[stem] = os.path.join(IMAGE_SEEDS_DIR, stem + ".webp")
        with open(written[stem], "wb") as f:
            f.write(data)
    for path in written.values():
        log("wrote %s (%d bytes): Pillow %s" % (os.path.relpath(path, REPO_ROOT),
                                               os.path.getsize(path), pillow_outcome(path)))


def gen_gif_seeds():
    """Tiny GIF seeds of the image fuzz target and test_image_decode: valid frames of
    each kind gif_encode writes, an animation, and hostile headers and data."""
    clear_seeds("gif_", ".gif")
    indices, palette = gif_quantized("coffee", 7, 6, 8)
    ramp = [(i, i, i) for i in range(8)]
    valid = gif_encode((7, 6), (0, 0, 7, 6), indices, palette, interlace=True, transparent=3)
    screen = 13 + 3 * len(palette)  # signature, screen descriptor, global palette
    gce = 8
    header, body = valid[:screen], valid[screen + gce:]
    seeds = [
        ("gif_interlaced_trns_7x6", valid),
        ("gif_subframe_9x8", gif_encode((9, 8), (2, 1, 7, 6), indices, palette)),
        ("gif_local_grey_ramp_7x6", gif_encode((7, 6), (0, 0, 7, 6), indices, palette, ramp)),
        ("gif_animated_7x6", valid[:-1] + body),
        ("gif_truncated", valid[:len(valid) - 8]),
        ("gif_no_image", header + GIF_TRAILER),
        ("gif_code_size1", gif_encode((2, 2), (0, 0, 2, 2), np.array([[0, 1], [1, 0]]),
                                      palette[:2], code_size=1)),
        ("gif_short_gce", header + b"!\xf9\x02\x01\x00\x00" + body),
        ("gif_huge_65535x65535",
         gif_encode((65535, 65535), (0, 0, 1, 1), np.zeros((1, 1)), palette)),
        ("gif_frame_past_side", gif_encode((8, 8), (65000, 0, 1000, 1), np.zeros((1, 1000)),
                                           palette)),
    ]
    for stem, data in seeds:
        path = os.path.join(IMAGE_SEEDS_DIR, stem + ".gif")
        with open(path, "wb") as f:
            f.write(data)
        log("wrote %s (%d bytes): Pillow %s" % (os.path.relpath(path, REPO_ROOT), len(data),
                                               pillow_outcome(path)))


TIFF_TYPES = {"SHORT": (3, "H"), "LONG": (4, "I")}


def tiff_encode(width, height, photometric, bits, planes, *, spp=1, big_endian=False,
                extra=None, colormap=None, orientation=None, fillorder=None, tile=None,
                rows_per_strip=None, sample_format=None):
    """An uncompressed classic TIFF of one page, written field by field, for the
    layouts Pillow does not write: planes is one byte string of packed rows
    (contiguous) or one per sample (separate planes); tile (w, h) writes tiles
    instead of strips, partial tiles padded with zeros."""
    end = ">" if big_endian else "<"
    separate = len(planes) > 1
    per_plane = 1 if separate else spp
    row_bytes = (width * bits * per_plane + 7) // 8
    blocks = []
    for plane in planes:
        if tile:
            tw, th = tile
            tile_row = (tw * bits * per_plane + 7) // 8
            for ty in range(0, height, th):
                for tx in range(0, width, tw):
                    data = b""
                    for y in range(ty, ty + th):
                        row = plane[y * row_bytes:(y + 1) * row_bytes] if y < height else b""
                        part = row[tx * bits * per_plane // 8:][:tile_row]
                        data += part + b"\0" * (tile_row - len(part))
                    blocks.append(data)
        else:
            rps = rows_per_strip or height
            for y in range(0, height, rps):
                blocks.append(plane[y * row_bytes:min(height, y + rps) * row_bytes])
    fields = [(256, "LONG", [width]), (257, "LONG", [height]), (258, "SHORT", [bits] * spp),
              (259, "SHORT", [1]), (262, "SHORT", [photometric]), (277, "SHORT", [spp]),
              (284, "SHORT", [2 if separate else 1])]
    if fillorder:
        fields.append((266, "SHORT", [fillorder]))
    if orientation:
        fields.append((274, "SHORT", [orientation]))
    if colormap is not None:
        fields.append((320, "SHORT", list(colormap)))
    if extra is not None:
        fields.append((338, "SHORT", list(extra)))
    if sample_format:
        fields.append((339, "SHORT", [sample_format] * spp))
    offsets_tag, counts_tag = (324, 325) if tile else (273, 279)
    if tile:
        fields += [(322, "LONG", [tile[0]]), (323, "LONG", [tile[1]])]
    else:
        fields.append((278, "LONG", [rows_per_strip or height]))
    header = 8
    pixel_start = header
    pixel_bytes = sum(len(b) for b in blocks)
    offsets, at = [], pixel_start
    for b in blocks:
        offsets.append(at)
        at += len(b)
    fields += [(offsets_tag, "LONG", offsets), (counts_tag, "LONG", [len(b) for b in blocks])]
    fields.sort()
    ifd_at = pixel_start + pixel_bytes + (pixel_bytes & 1)
    extra_at = ifd_at + 2 + 12 * len(fields) + 4
    entries, spill = b"", b""
    for tag, kind, values in fields:
        code, fmt = TIFF_TYPES[kind]
        packed = struct.pack(end + fmt * len(values), *values)
        if len(packed) <= 4:
            value = packed + b"\0" * (4 - len(packed))
        else:
            value = struct.pack(end + "I", extra_at + len(spill))
            spill += packed + b"\0" * (len(packed) & 1)
        entries += struct.pack(end + "HHI", tag, code, len(values)) + value
    magic = b"MM\0*" if big_endian else b"II*\0"
    out = magic + struct.pack(end + "I", ifd_at) + b"".join(blocks)
    out += b"\0" * (ifd_at - len(out))
    return out + struct.pack(end + "H", len(fields)) + entries + b"\0\0\0\0" + spill


def pack_bits(values, bits, width):
    """Rows of width samples of `bits` bits each, MSB first, each row padded to a byte."""
    out = b""
    for row in np.asarray(values).reshape(-1, width):
        acc, n, data = 0, 0, bytearray()
        for v in row:
            acc, n = acc << bits | int(v), n + bits
            if n == 8:
                data.append(acc)
                acc, n = 0, 0
        if n:
            data.append(acc << (8 - n))
        out += bytes(data)
    return out


def gen_tiff_seeds():
    """Small TIFF seeds of the image fuzz target and test_image_decode: what Pillow
    writes through libtiff (LZW, Deflate with a predictor, PackBits, JPEG, CCITT G4, a
    second page), the layouts tiff_encode writes (2- and 4-bit grey and palettes,
    separate planes, tiles, big-endian, fill order 2, each orientation, grey with
    alpha, signed grey), the ones refused here, and hostile files."""
    from PIL import Image

    clear_seeds("tiff_", ".tif")
    rgb = photo_at("astronaut", 9, 7).convert("RGB")
    rgba = photo_at("coffee", 6, 5).convert("RGB")
    rgba.putalpha(Image.fromarray(np.arange(30, dtype=np.uint8).reshape(5, 6) * 8, "L"))
    grey = photo_at("camera", 13, 11).convert("L")
    written = {}

    def path_of(stem):
        written[stem] = os.path.join(IMAGE_SEEDS_DIR, stem + ".tif")
        return written[stem]

    def save(stem, img, **kwargs):
        img.save(path_of(stem), format="TIFF", **kwargs)

    def put(stem, data):
        with open(path_of(stem), "wb") as f:
            f.write(data)

    save("tiff_rgb_lzw_9x7", rgb, compression="tiff_lzw")
    save("tiff_rgb_deflate_pred_9x7", rgb, compression="tiff_adobe_deflate",
         tiffinfo={317: 2})
    save("tiff_rgb_packbits_9x7", rgb, compression="packbits")
    save("tiff_rgb_jpeg_16x16", photo_at("chelsea", 16, 16).convert("RGB"),
         compression="jpeg", quality=90)
    save("tiff_rgba_lzw_6x5", rgba, compression="tiff_lzw")
    save("tiff_grey_deflate_13x11", grey, compression="tiff_adobe_deflate")
    save("tiff_bilevel_g4_13x11", grey.point(lambda v: 255 if v > 110 else 0).convert("1"),
         compression="group4")
    save("tiff_pal8_lzw_9x7", rgb.quantize(16), compression="tiff_lzw")
    save("tiff_two_pages_9x7", rgb, save_all=True,
         append_images=[photo_at("rocket", 9, 7).convert("RGB")], compression="tiff_lzw")

    px = np.asarray(rgb)
    g = np.asarray(grey)
    put("tiff_grey4_miniswhite_13x11", tiff_encode(13, 11, 0, 4, [pack_bits(g >> 4, 4, 13)]))
    put("tiff_grey2_13x11", tiff_encode(13, 11, 1, 2, [pack_bits(g >> 6, 2, 13)]))
    ramp = [v * 4369 for v in range(16)]
    cmap = [((i * 37) % 256) * 257 for i in range(16)] + ramp + [(255 - i * 16) << 8
                                                                for i in range(16)]
    put("tiff_pal4_13x11", tiff_encode(13, 11, 3, 4, [pack_bits(g >> 4, 4, 13)],
                                       colormap=cmap))
    put("tiff_bilevel_fill2_13x11",
        tiff_encode(13, 11, 1, 1, [bytes(int("{:08b}".format(b)[::-1], 2)
                                         for b in pack_bits(g > 110, 1, 13))], fillorder=2))
    put("tiff_rgb_planar_9x7", tiff_encode(9, 7, 2, 8, [px[:, :, c].tobytes() for c in range(3)],
                                           spp=3))
    put("tiff_rgb_tiled_big_endian_20x18",
        tiff_encode(20, 18, 2, 8, [np.asarray(photo_at("coffee", 20, 18).convert("RGB"))
                                   .tobytes()], spp=3, tile=(16, 16), big_endian=True))
    put("tiff_rgb_strips_9x7", tiff_encode(9, 7, 2, 8, [px.tobytes()], spp=3,
                                           rows_per_strip=2))
    for o in range(2, 9):
        put("tiff_rgb_orientation%d_9x7" % o, tiff_encode(9, 7, 2, 8, [px.tobytes()], spp=3,
                                                         orientation=o))
    ga = np.stack([g[:5, :6], (np.arange(30).reshape(5, 6) * 8).astype(np.uint8)], axis=2)
    put("tiff_grey_alpha_6x5", tiff_encode(6, 5, 1, 8, [ga.tobytes()], spp=2, extra=[2]))
    rgbx = np.concatenate([px, np.full((7, 9, 1), 7, np.uint8)], axis=2)
    put("tiff_rgbx_9x7", tiff_encode(9, 7, 2, 8, [rgbx.tobytes()], spp=4, extra=[0]))
    put("tiff_grey_signed_13x11", tiff_encode(13, 11, 1, 8, [g.tobytes()], sample_format=2))
    # Refused here (named), and hostile files.
    put("tiff_cmyk_2x2", tiff_encode(2, 2, 5, 8, [bytes(range(16))], spp=4))
    put("tiff_rgb16_2x2", tiff_encode(2, 2, 2, 16, [bytes(range(24))], spp=3))
    put("tiff_premultiplied_2x2", tiff_encode(2, 2, 2, 8, [bytes(range(16))], spp=4,
                                              extra=[1]))
    put("tiff_huge_65535x65535", tiff_encode(65535, 65535, 1, 8, [b""]))
    with open(written["tiff_rgb_lzw_9x7"], "rb") as f:
        lzw = f.read()
    put("tiff_truncated", lzw[:len(lzw) // 2])
    for path in written.values():
        log("wrote %s (%d bytes): Pillow %s" % (os.path.relpath(path, REPO_ROOT),
                                               os.path.getsize(path), pillow_outcome(path)))


def gen_png_seeds():
    clear_seeds("png_", ".png")
    paths = [write_png_case(stem, spec, IMAGE_SEEDS_DIR) for stem, spec in PNG_SEEDS]
    for stem, data in png_hostile_seeds():
        paths.append(os.path.join(IMAGE_SEEDS_DIR, stem + ".png"))
        with open(paths[-1], "wb") as f:
            f.write(data)
    for path in paths:
        log("wrote %s (%d bytes): Pillow %s" % (os.path.relpath(path, REPO_ROOT),
                                               os.path.getsize(path), pillow_outcome(path)))

# ======================================================================================
# A2) Cross-attention masks (processor helpers, on the real token ids)
# ======================================================================================

# Token ids: 128000 bos, 128006/128007 header, 128009 eot, 128256 <|image|>; small
# numbers stand for ordinary text tokens.
MASK_CASES = [
    ("no_image", [[128000, 10, 11, 12]], [[]],
     "no <|image|>: no ranges (the processor builds no mask without images)"),
    ("base_image_first", [[128256, 128000, 10, 11, 12, 13]], [[4]],
     "base-model style: image token first, every row sees the image"),
    ("instruct_one_image",
     [[128000, 128006, 882, 128007, 271, 128256, 10, 11, 128009, 128006, 78191, 128007, 271]],
     [[2]], "Instruct template: the 5 rows before <|image|> see nothing (row mask 0)"),
    ("two_images_interleaved", [[128000, 10, 128256, 11, 12, 128256, 13, 14]], [[3, 1]],
     "text after image 2 does not see image 1"),
    ("two_images_adjacent", [[128000, 128256, 128256, 10, 11, 12]], [[4, 2]],
     "adjacent image tokens: both cover all following text"),
    ("three_images_pair_at_end", [[128256, 10, 11, 128256, 128256, 12, 13]], [[1, 2, 4]],
     "image 0 until image 1; images 1 and 2 adjacent, both to the end"),
    ("image_last_token", [[128000, 10, 11, 128256]], [[4]],
     "image token is the last prompt token: only that row sees it"),
    ("adjacent_pair_at_end", [[128000, 10, 128256, 128256]], [[2, 3]],
     "two image tokens close the prompt"),
    ("batch_unequal",
     [[128000, 128256, 10, 11, 12, 13, 14], [128000, 10, 128256, 11, 128256]],
     [[4], [1, 3]],
     "B=2 of unequal length (ids not padded): length = max length; sample 0 has a "
     "padding image column; its single range ends at -1 -> the padded length"),
]
DECODE_GROWTH_STEPS = 2


def gen_masks():
    import torch
    from transformers.models.mllama.modeling_mllama import _prepare_cross_attention_mask
    from transformers.models.mllama.processing_mllama import (
        convert_sparse_cross_attention_mask_to_dense, get_cross_attention_token_mask)

    reset_dir(MASKS_DIR)
    vision_tokens = 3  # any count works: the model-side mask repeats each tile entry
    cases = []
    for name, batch_ids, num_tiles, purpose in MASK_CASES:
        sparse = [get_cross_attention_token_mask(ids, REAL_IMAGE_TOKEN) for ids in batch_ids]
        case = {"name": name, "purpose": purpose, "input_ids": batch_ids,
                "num_tiles": num_tiles, "ranges": sparse}
        if any(sparse):
            length = max(len(ids) for ids in batch_ids)
            dense = convert_sparse_cross_attention_mask_to_dense(
                sparse, num_tiles=num_tiles, max_num_tiles=MAX_TILES, length=length)
            _, row_mask = _prepare_cross_attention_mask(
                torch.from_numpy(dense), num_vision_tokens=vision_tokens, dtype=torch.float32)
            grown = dense
            for _ in range(DECODE_GROWTH_STEPS):
                grown = np.concatenate([grown, grown[:, -1:]], axis=1)
            case.update({
                "dense_shape": list(dense.shape),
                "dense": dense.tolist(),
                "full_text_row_mask": row_mask[:, 0, :, 0].to(torch.int64).tolist(),
                "dense_after_%d_decode_steps" % DECODE_GROWTH_STEPS: grown.tolist(),
            })
        cases.append(case)
    write_json(os.path.join(MASKS_DIR, "cross_attention_mask_cases.json"), {
        "generator": "tests/golden/gen_fixtures.py --only masks",
        "versions": versions(),
        "image_token_id": REAL_IMAGE_TOKEN,
        "max_num_tiles": MAX_TILES,
        "functions": {
            "ranges": "processing_mllama.get_cross_attention_token_mask(ids, 128256) per sample",
            "dense": "processing_mllama.convert_sparse_cross_attention_mask_to_dense(ranges, "
                     "num_tiles, max_num_tiles=4, length=max len) -> (B, S, N, 4) int64",
            "full_text_row_mask": "modeling_mllama._prepare_cross_attention_mask(...)[1] as "
                                  "(B, S) ints: 1 where the row has an allowed key",
            "dense_after_N_decode_steps": "what generate() feeds the model after N decode "
                                          "steps: the last row appended N times",
        },
        "cases": cases,
    })


# ======================================================================================
# B) Tiny random models
# ======================================================================================

def vision_config(image_size, hidden, heads, intermediate, layers, indices):
    return {
        "hidden_size": hidden, "num_attention_heads": heads, "intermediate_size": intermediate,
        "num_hidden_layers": layers, "num_global_layers": 2, "image_size": image_size,
        "patch_size": PATCH_SIZE, "num_channels": 3, "max_num_tiles": MAX_TILES,
        "norm_eps": 1e-5, "hidden_act": "gelu", "intermediate_layers_indices": indices,
        "supported_aspect_ratios": SUPPORTED_ASPECT_RATIOS,
        "vision_output_dim": hidden * (1 + len(indices)),
    }


def text_config(vocab, hidden, heads, kv_heads, intermediate, layers, cross, theta,
                original_max, eos_list):
    base = vocab - SPECIALS
    eos = [base + 1, base + 8, base + 9] if eos_list else base + 1
    return {
        "vocab_size": vocab, "hidden_size": hidden, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "intermediate_size": intermediate,
        "num_hidden_layers": layers, "cross_attention_layers": cross, "rope_theta": theta,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0,
                         "original_max_position_embeddings": original_max},
        "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "hidden_act": "silu",
        "tie_word_embeddings": False, "bos_token_id": base, "eos_token_id": eos,
        "pad_token_id": base + 4,
    }


# Prompt layouts. Symbols: BOS SH EH EOT NN USER ASSISTANT SYSTEM IMG, and ("t", n) for
# n random text tokens. SH/EH = start/end header, NN = "\n\n".
INSTRUCT_HEAD = ["BOS", "SH", "USER", "EH", "NN"]
INSTRUCT_TAIL = ["EOT", "SH", "ASSISTANT", "EH", "NN"]

MODEL_CASES = [
    {
        "name": "m1_instruct_1tile_mqa",
        "exercises": [
            "one image, 1 tile (aspect (1,1), id 1), image_size 28 -> 5 tokens/tile padded to 8",
            "Instruct layout: 5 rows before <|image|> have full_text_row_mask 0 (uniform "
            "cross-attention over all 4 tile slots, MLP zeroed)",
            "GQA ratio 4 with a single KV head (MQA)",
            "one cross-attention layer, the last layer",
        ],
        "vision": vision_config(28, 32, 2, 64, 4, [1, 3]),
        "text": text_config(512, 64, 4, 1, 128, 4, [3], 500000.0, 64, True),
        "images": [[("chelsea", 24, 20, (1, 1))]],
        "prompts": [INSTRUCT_HEAD + ["IMG", ("t", 8)] + INSTRUCT_TAIL],
        "seed": 101,
    },
    {
        "name": "m2_4tiles_cross_first_last",
        "exercises": [
            "one image, 4 tiles (aspect (2,2), id 6) after an antialiased downscale; "
            "image_size 42 -> 10 tokens/tile padded to 16",
            "cross-attention layers at the first and the last position [0, 5]",
            "GQA ratio 1 (2 heads, 2 KV heads), head_dim 32",
            "vision intermediate_layers_indices [0, 2, 5]: index 0 = local-transformer input "
            "(after layernorm_pre and padding), 5 == num_hidden_layers = its final output "
            "(before layernorm_post)",
            "base-model layout: <|image|> first, so every row sees the image",
        ],
        "vision": vision_config(42, 32, 2, 64, 5, [0, 2, 5]),
        "text": text_config(512, 64, 2, 2, 128, 6, [0, 5], 500000.0, 512, False),
        "images": [[("coffee", 100, 90, (2, 2))]],
        "prompts": [["IMG", "BOS", ("t", 12)]],
        "seed": 204,
    },
    {
        "name": "m3_two_images_interleaved",
        "exercises": [
            "two images in one prompt with text between: aspects (1,3) id 3 (3 tiles, one "
            "zero tile) and (2,1) id 5 (2 tiles)",
            "image_size 56 -> 17 tokens/tile padded to 24 (7 pad tokens, as in the real model)",
            "rows before image 0 masked out; rows after image 1 do not see image 0",
            "consecutive cross-attention layers [1, 2]",
            "GQA ratio 4 (8 heads, 2 KV heads)",
            "vocab 700 (not a multiple of 8): <|image|> = 700, embedding rows 708",
            "unsorted intermediate_layers_indices [3, 1]: channel = d*2 + position in list",
        ],
        "vision": vision_config(56, 32, 2, 64, 4, [3, 1]),
        "text": text_config(700, 128, 8, 2, 128, 4, [1, 2], 500000.0, 64, True),
        "images": [[("astronaut", 150, 50, (1, 3)), ("rocket", 50, 100, (2, 1))]],
        "prompts": [INSTRUCT_HEAD + [("t", 4), "IMG", ("t", 5), "IMG", ("t", 6)]
                    + INSTRUCT_TAIL],
        "seed": 303,
    },
    {
        "name": "m4_two_adjacent_images",
        "exercises": [
            "two adjacent <|image|> tokens: both images cover all following text",
            "aspects (1,2) id 2 and (4,1) id 8",
            "GQA ratio 2 (4 heads, 2 KV heads); cross-attention layers [1, 3]",
        ],
        "vision": vision_config(28, 32, 2, 64, 4, [0, 2]),
        "text": text_config(512, 64, 4, 2, 128, 5, [1, 3], 500000.0, 64, False),
        "images": [[("coffee", 50, 26, (1, 2)), ("chelsea", 20, 100, (4, 1))]],
        "prompts": [INSTRUCT_HEAD + ["IMG", "IMG", ("t", 7)] + INSTRUCT_TAIL],
        "seed": 404,
    },
    {
        "name": "m5_text_only",
        "exercises": [
            "no image: no pixel_values, no cross_attention_mask; every cross-attention layer "
            "(here [1]) is skipped entirely, including its MLP",
            "text_hidden_states: entry 1 (input of the skipped layer) equals entry 2",
            "rope_theta 10000 with original_max_position_embeddings 256",
        ],
        "vision": vision_config(28, 32, 2, 64, 4, [3]),
        "text": text_config(512, 64, 4, 4, 128, 4, [1], 10000.0, 256, True),
        "images": None,
        "prompts": [["BOS", "SH", "SYSTEM", "EH", "NN", ("t", 10), "EOT"] + ["SH", "USER", "EH",
                    "NN", ("t", 6)] + INSTRUCT_TAIL],
        "seed": 505,
    },
    {
        "name": "m6_batch2_padding_image",
        "exercises": [
            "text batch B=2 with N=2 image slots: sample 0 has two images ((1,4) id 4, (1,1) "
            "id 1), sample 1 one image ((2,1) id 5) plus a padding slot (id 0, mask "
            "[1,0,0,0], zero pixels) that is still run through the vision encoder",
            "sample 1 cross-attention mask column for the padding image is all 0",
            "GQA ratio 3 (6 heads, 2 KV heads), hidden 96; cross-attention layer [2]",
            "prompts of equal length, so no attention padding",
        ],
        "vision": vision_config(28, 32, 2, 64, 4, [2]),
        "text": text_config(512, 96, 6, 2, 128, 4, [2], 500000.0, 64, True),
        "images": [[("rocket", 110, 25, (1, 4)), ("coffee", 24, 20, (1, 1))],
                   [("astronaut", 25, 50, (2, 1))]],
        "prompts": [INSTRUCT_HEAD + ["IMG", ("t", 4), "IMG", ("t", 5)] + INSTRUCT_TAIL,
                    INSTRUCT_HEAD + ["IMG", ("t", 10)] + INSTRUCT_TAIL],
        "seed": 606,
    },
    {
        "name": "m7_sharded",
        "exercises": [
            "sharded checkpoint: model.safetensors.index.json + several shards",
            "one image, aspect (3,1) id 7 (3 tiles); image_size 42",
            "GQA ratio 2; cross-attention layer [2] of 4",
        ],
        "vision": vision_config(42, 32, 2, 64, 4, [1, 2]),
        "text": text_config(512, 64, 4, 2, 128, 4, [2], 500000.0, 64, True),
        "images": [[("chelsea", 40, 120, (3, 1))]],
        "prompts": [INSTRUCT_HEAD + ["IMG", ("t", 10)] + INSTRUCT_TAIL],
        "seed": 707,
        "max_shard_size": "150KB",
    },
]

# FP8 fixtures: a model of the cases above, its Linears quantized by compressed-tensors
# (pinned in requirements.txt) with the weights of the published Llama 3.2 Vision FP8
# checkpoints (float8 E4M3, one symmetric scale per output channel, the MinMax observer),
# the vision tower, the projector and lm_head left bf16 by `ignore`, saved compressed
# (float-quantized). transformers 4.47.1 loads it with run_compressed=True:
# CompressedLinear decompresses each weight on every forward, q.to(scale dtype) * scale,
# in a float32 model's float32 scale dtype, so its weight is q * scale exactly: W8A16,
# what the engine computes. Input activations are not quantized (input_activations
# null, compressed-tensors' FP8 weight-only scheme): with the published FP8_DYNAMIC
# scheme, compressed-tensors 0.8.1 fake-quantizes each Linear's input with "token"
# scales reduced over dim 0 only, which is exact for the text rows (batch 1) but not for
# the cross-attention k/v projections (the image's tiles are dim 0), so its reference
# would be neither W8A16 nor per-token W8A8.
FP8_IGNORE = ["re:.*lm_head", "re:multi_modal_projector.*", "re:vision_model.*"]
FP8_CASES = [
    {
        "name": "m8_fp8_sharded",
        "exercises": [
            "compressed-tensors FP8 checkpoint (float-quantized; F8_E4M3 weights + BF16 "
            "weight_scale (out, 1) for every text-decoder Linear), FP8 channel weights "
            "without input quantization, vision/projector/lm_head ignored by name",
            "sharded: model.safetensors.index.json + several shards",
            "one image, aspect (3,1) id 7 (3 tiles); <|image|> first, so every row sees it",
            "GQA ratio 2; cross-attention layer [2] of 4; MLP 256 wide",
        ],
        "vision": vision_config(42, 32, 2, 64, 4, [1, 2]),
        "text": text_config(512, 64, 4, 2, 256, 4, [2], 500000.0, 64, True),
        "images": [[("chelsea", 40, 120, (3, 1))]],
        "prompts": [["IMG", "BOS", ("t", 14)]],
        "seed": 808,
        "max_shard_size": "100KB",
        "fp8": True,
    },
]

# Initialisation scales. HF's init (std 0.02, zero gates) would give near-uniform
# logits and hide gate bugs, so everything is O(1) and every gate is nonzero.
NORM_WEIGHT_NOISE = 0.1
BIAS_STD = 0.1
POS_EMBED_STD = 0.5
LM_HEAD_GAIN = 2.0
GATE_RANGE = (0.5, 1.5)


def special_ids(vocab):
    base = vocab - SPECIALS
    # Ordinary tokens standing for "user", "assistant", "system" and "\n\n".
    return {"BOS": base, "SH": base + 6, "EH": base + 7, "EOT": base + 9,
            "USER": 101, "ASSISTANT": 102, "SYSTEM": 103, "NN": 104}


def build_prompt(layout, vocab, rng):
    """Token ids for a layout; text tokens are random ordinary ids (never special)."""
    sym = special_ids(vocab)
    ids, parts = [], []
    for item in layout:
        if isinstance(item, tuple):
            _, n = item
            ids.extend(int(x) for x in rng.integers(0, vocab - SPECIALS, n))
            parts.append("t*%d" % n)
        elif item == "IMG":
            ids.append(vocab)
            parts.append("<|image|>")
        else:
            ids.append(sym[item])
            parts.append(item.lower())
    return ids, " ".join(parts)


def param_rng(seed, name):
    digest = hashlib.sha256(name.encode()).digest()
    return np.random.default_rng([seed, int.from_bytes(digest[:8], "little")])


def init_value(name, shape, rng):
    """Deterministic O(1) value for one parameter, chosen by its name."""
    leaf = name.rsplit(".", 1)[-1]
    owner = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
    if leaf in ("gate", "gate_attn", "gate_ffn", "cross_attn_attn_gate", "cross_attn_mlp_gate"):
        sign = 1.0 if rng.random() < 0.5 else -1.0
        return sign * rng.uniform(*GATE_RANGE, size=shape)
    if "norm" in owner:
        if leaf == "weight":
            return 1.0 + NORM_WEIGHT_NOISE * rng.standard_normal(shape)
        return BIAS_STD * rng.standard_normal(shape)
    if leaf == "bias":
        return BIAS_STD * rng.standard_normal(shape)
    if name.endswith("embed_tokens.weight") or leaf == "class_embedding":
        return rng.standard_normal(shape)
    if ("positional_embedding" in name) or name.endswith("tile_embedding.weight"):
        return POS_EMBED_STD * rng.standard_normal(shape)
    if leaf == "weight" and len(shape) in (2, 4):
        fan_in = int(np.prod(shape[1:]))
        gain = LM_HEAD_GAIN if name.endswith("lm_head.weight") else 1.0
        return gain / math.sqrt(fan_in) * rng.standard_normal(shape)
    raise RuntimeError("no init rule for parameter %s %s" % (name, shape))


def randomize(model, seed):
    """Overwrite every parameter (including padding rows of embeddings and the tile
    table rows of padding tiles/images, which the real checkpoint has as zeros)."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            value = init_value(name, tuple(param.shape), param_rng(seed, name))
            param.copy_(torch.from_numpy(np.asarray(value, dtype=np.float32)))


def rope_regions(text_cfg_obj):
    """Per inv_freq index: 'unchanged', 'smoothed' or 'scaled' (HF llama3 rope)."""
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    default, _ = ROPE_INIT_FUNCTIONS["default"](text_cfg_obj, torch.device("cpu"))
    llama3, _ = ROPE_INIT_FUNCTIONS["llama3"](text_cfg_obj, torch.device("cpu"))
    factor = text_cfg_obj.rope_scaling["factor"]
    regions = []
    for d, l in zip(default.tolist(), llama3.tolist()):
        if l == d:
            regions.append("unchanged")
        elif l == np.float32(np.float32(d) / np.float32(factor)):
            regions.append("scaled")
        else:
            regions.append("smoothed")
    return regions, llama3


def model_images(case, tile):
    """The tiny model's input photos: PIL images, per text sample."""
    from transformers.models.mllama.image_processing_mllama import get_optimal_tiled_canvas

    batch = []
    for sample in case["images"]:
        imgs = []
        for source, width, height, want in sample:
            img = photo_at(source, width, height).convert("RGB")
            canvas = get_optimal_tiled_canvas(height, width, MAX_TILES, tile)
            got = (int(canvas[0]) // tile, int(canvas[1]) // tile)
            if got != want:
                raise RuntimeError("%s: %dx%d gives canvas %s, wanted %s"
                                   % (case["name"], width, height, got, want))
            imgs.append(img)
        batch.append(imgs)
    return batch


class Capture:
    """Forward hooks that record the intermediate tensors of one forward pass."""

    def __init__(self, model):
        vm = model.vision_model
        self.values = {}
        self.handles = []
        self._hook(vm.patch_embedding, "patch", lambda i, o: o)
        self._hook(vm.layernorm_pre, "pre_ln_in", lambda i, o: i[0])
        self._hook(vm.transformer, "local", lambda i, o: o[1])
        self._hook(vm.global_transformer, "global_in", lambda i, o: i[0])
        self._hook(vm.global_transformer, "global", lambda i, o: o[1])
        self._hook(vm, "vision_out", lambda i, o: o[0])
        self._hook(model.multi_modal_projector, "projector", lambda i, o: o)
        self._hook(model.language_model.model.norm, "norm_in", lambda i, o: i[0])

    def _hook(self, module, key, pick):
        def fn(_module, inputs, output):
            self.values[key] = pick(inputs, output)
        self.handles.append(module.register_forward_hook(fn))

    def remove(self):
        for h in self.handles:
            h.remove()


def load_model(path, dtype, attn):
    from transformers import MllamaForConditionalGeneration

    model = MllamaForConditionalGeneration.from_pretrained(
        path, torch_dtype=dtype, attn_implementation=attn)
    model.eval()
    if model.config.text_config._attn_implementation != attn:
        raise RuntimeError("attention implementation is %s, wanted %s"
                           % (model.config.text_config._attn_implementation, attn))
    return model


def forward(model, inputs, **kwargs):
    import torch

    with torch.no_grad():
        return model(**inputs, use_cache=False, **kwargs)


def greedy(model, inputs, pad_id, steps=GREEDY_STEPS):
    """`steps` greedy tokens with stop tokens disabled, and the raw logits of every step."""
    import torch
    from transformers import GenerationConfig

    cfg = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=steps,
                           min_new_tokens=0, pad_token_id=pad_id, use_cache=True,
                           output_logits=True, return_dict_in_generate=True)
    # generate() fills an unset eos_token_id from model.generation_config: clear it there.
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(**inputs, generation_config=cfg)
    prompt_len = inputs["input_ids"].shape[1]
    tokens = out.sequences[:, prompt_len:]
    if tokens.shape[1] != steps:
        raise RuntimeError("generate returned %d tokens" % tokens.shape[1])
    step_logits = torch.stack(out.logits, dim=1)          # (B, steps, V)
    return tokens, step_logits


def check_against_recompute(model, inputs, tokens, step_logits, steps=GREEDY_STEPS):
    """Each cached decode step must match a full no-cache forward over the prompt plus
    the tokens so far, with the cross-attention mask grown by repeating its last row
    (engine/model/README.md §8). Returns the max abs logit difference."""
    import torch

    worst = 0.0
    for k in range(steps):
        step = dict(inputs)
        step["input_ids"] = torch.cat([inputs["input_ids"], tokens[:, :k]], dim=1)
        step["attention_mask"] = torch.ones_like(step["input_ids"])
        if "cross_attention_mask" in inputs:
            mask = inputs["cross_attention_mask"]
            step["cross_attention_mask"] = torch.cat([mask] + [mask[:, -1:]] * k, dim=1)
        logits = forward(model, step).logits[:, -1]
        diff = float((logits - step_logits[:, k]).abs().max())
        worst = max(worst, diff)
        if diff > RECOMPUTE_TOL or not torch.equal(logits.argmax(-1), tokens[:, k]):
            raise RuntimeError("decode step %d differs from a full recompute (max diff %g)"
                               % (k, diff))
    return worst


def build_inputs(case, config, rng):
    """input_ids, images and the processor outputs for one model case."""
    import torch
    from transformers.models.mllama.processing_mllama import (
        convert_sparse_cross_attention_mask_to_dense, get_cross_attention_token_mask)

    vocab = config.text_config.vocab_size
    prompts = [build_prompt(layout, vocab, rng) for layout in case["prompts"]]
    ids = [p[0] for p in prompts]
    if len({len(x) for x in ids}) != 1:
        raise RuntimeError("%s: prompts must have equal length" % case["name"])
    inputs = {"input_ids": torch.tensor(ids, dtype=torch.int64)}
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    images, info = None, {}
    if case["images"] is not None:
        tile = config.vision_config.image_size
        images = model_images(case, tile)
        out, resized = run_processor(make_image_processor(tile), images)
        for key in ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask"):
            inputs[key] = torch.from_numpy(np.ascontiguousarray(out[key]))
        sparse = [get_cross_attention_token_mask(x, config.image_token_index) for x in ids]
        dense = convert_sparse_cross_attention_mask_to_dense(
            sparse, num_tiles=out["num_tiles"], max_num_tiles=MAX_TILES, length=len(ids[0]))
        inputs["cross_attention_mask"] = torch.from_numpy(dense)
        info = {"num_tiles": out["num_tiles"], "ranges": sparse,
                "resized_sizes": [list(r.shape[:2]) for r in resized]}
    return inputs, images, [p[1] for p in prompts], info


def tensor_table(tensors):
    return {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
            for k, v in tensors.items()}


def reference_tensors(model, inputs, has_images):
    """Run the float32 eager forward with hooks; returns the named reference tensors."""
    import torch
    from transformers.models.mllama.modeling_mllama import _prepare_cross_attention_mask

    cap = Capture(model)
    try:
        out = forward(model, inputs, output_hidden_states=True)
    finally:
        cap.remove()
    ref = {"input_ids": inputs["input_ids"]}
    if has_images:
        v = cap.values
        patch = v["patch"]                                # (M*T, Dv, g, g)
        ref.update({
            "pixel_values": inputs["pixel_values"],
            "aspect_ratio_ids": inputs["aspect_ratio_ids"],
            "aspect_ratio_mask": inputs["aspect_ratio_mask"],
            "cross_attention_mask": inputs["cross_attention_mask"],
            "full_text_row_mask": _prepare_cross_attention_mask(
                inputs["cross_attention_mask"], model.vision_model.num_patches,
                torch.float32)[1][:, 0, :, 0],
            "vision_patch_embeds": patch.flatten(2).transpose(1, 2),
            "vision_pre_layernorm_input": v["pre_ln_in"],
            "vision_local_hidden_states": torch.stack(v["local"]),
            "vision_global_input": v["global_in"],
            "vision_global_hidden_states": torch.stack(v["global"]),
            "vision_output": v["vision_out"],
            "projector_output": v["projector"],
        })
    ref["text_hidden_states"] = torch.stack(out.hidden_states)
    ref["text_final_norm_input"] = cap.values["norm_in"]
    ref["logits"] = out.logits
    return {k: t.detach().contiguous() for k, t in ref.items()}


def check_stage_layout(model, ref):
    """The captured stages must compose as engine/model/README.md §3.7–§3.12 and §4 say: the vision
    output is [global output, intermediates interleaved d*K + k] without pad tokens, and
    the last text hidden state is the final norm of text_final_norm_input."""
    import torch

    with torch.no_grad():
        last = model.language_model.model.norm(ref["text_final_norm_input"])
    if not torch.equal(last, ref["text_hidden_states"][-1]):
        raise RuntimeError("text_hidden_states[-1] is not norm(text_final_norm_input)")
    if "vision_output" not in ref:
        return
    out = ref["vision_output"]                            # (B, N, T, P, vision_output_dim)
    b, n, t, p, _ = out.shape
    local = ref["vision_local_hidden_states"]             # (L+1, B*N, T*Pp, Dv)
    dv = local.shape[-1]
    local = local.reshape(local.shape[0], b * n, t, -1, dv)[:, :, :, :p]
    inter = torch.stack([local[i] for i in model.vision_model.intermediate_layers_indices], -1)
    final = ref["vision_global_hidden_states"][-1].reshape(b * n, t, -1, dv)[:, :, :p]
    want = torch.cat([final, inter.flatten(-2)], dim=-1).reshape(out.shape)
    if not torch.equal(want, out):
        raise RuntimeError("vision_output does not match the captured stages")


def full_config(config):
    """Every Mllama field with the value the model used. save_pretrained writes only the
    fields that differ from the class defaults, so config.json alone is incomplete."""
    import inspect

    def fields(cfg):
        names = [n for n in inspect.signature(type(cfg).__init__).parameters
                 if n not in ("self", "kwargs")]
        # MllamaVisionConfig takes num_attention_heads but stores attention_heads.
        names = ["attention_heads" if n == "num_attention_heads" and
                 not hasattr(cfg, n) else n for n in names]
        return {n: getattr(cfg, n) for n in names}

    return {"image_token_index": config.image_token_index,
            "text_config": fields(config.text_config),
            "vision_config": fields(config.vision_config)}


def fp8_quantization_config():
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig,
                                                 QuantizationScheme)

    fp8 = dict(num_bits=8, type="float", symmetric=True)
    scheme = QuantizationScheme(
        targets=["Linear"], weights=QuantizationArgs(strategy="channel", dynamic=False, **fp8))
    return QuantizationConfig(config_groups={"group_0": scheme}, ignore=FP8_IGNORE,
                              format="float-quantized")


def fp8_compress(model):
    """Quantize model's Linears in place as llm-compressor's FP8 recipes do for weights (the
    MinMax observer over each weight row, then calculate_qparams), and return the
    compressed state dict, the compressor that wrote it and the number of Linears."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationStatus, apply_quantization_config
    from compressed_tensors.quantization.utils import calculate_qparams

    apply_quantization_config(model, fp8_quantization_config())
    quantized = 0
    with torch.no_grad():
        for module in model.modules():
            scheme = getattr(module, "quantization_scheme", None)
            if scheme is None:
                continue
            w = module.weight
            scale, zp = calculate_qparams(w.amin(dim=1, keepdim=True),
                                          w.amax(dim=1, keepdim=True), scheme.weights)
            module.weight_scale.data.copy_(scale)
            module.weight_zero_point.data.copy_(zp)
            module.quantization_status = QuantizationStatus.FROZEN
            quantized += 1
    compressor = ModelCompressor.from_pretrained_model(model,
                                                       quantization_format="float-quantized")
    return compressor.compress(model), compressor, quantized


def gen_model(case, ver):
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import MllamaConfig, MllamaForConditionalGeneration

    name = case["name"]
    out_dir = os.path.join(MODELS_DIR, name)
    reset_dir(out_dir)
    config = MllamaConfig(vision_config=case["vision"], text_config=case["text"],
                          image_token_index=case["text"]["vocab_size"])
    vcfg, tcfg = config.vision_config, config.text_config
    patches = (vcfg.image_size // vcfg.patch_size) ** 2 + 1
    npad = (8 - patches % 8) % 8
    if npad == 0:
        raise RuntimeError("%s: patches+CLS is a multiple of 8 (HF mis-masks npad == 0)" % name)
    regions, inv_freq = rope_regions(tcfg)
    if len(set(regions)) != 3:
        raise RuntimeError("%s: rope regions %s do not include all three" % (name, regions))

    # Weights: random f32 -> bf16, saved in the 4.47 save_pretrained layout.
    torch.manual_seed(case["seed"])
    model = MllamaForConditionalGeneration(config)
    randomize(model, case["seed"])
    model = model.to(torch.bfloat16)
    save_kwargs = {"safe_serialization": True}
    if "max_shard_size" in case:
        save_kwargs["max_shard_size"] = case["max_shard_size"]
    unquantized_dir = None
    if case.get("fp8"):
        # The unquantized model too, for the FP8-vs-bf16 difference only.
        unquantized_dir = out_dir + ".bf16"
        reset_dir(unquantized_dir)
        model.save_pretrained(unquantized_dir, safe_serialization=True)
        state, compressor, n_fp8 = fp8_compress(model)
        bf16_state = {k: v.clone() for k, v in state.items()}
        model.save_pretrained(out_dir, state_dict=state, **save_kwargs)
        compressor.update_config(out_dir)
    else:
        bf16_state = {k: v.clone() for k, v in model.state_dict().items()}
        model.save_pretrained(out_dir, **save_kwargs)
    del model

    rng = np.random.default_rng(case["seed"])
    inputs, images, layouts, img_info = build_inputs(case, config, rng)
    if images is not None:
        make_image_processor(vcfg.image_size).save_pretrained(out_dir)
        for b, sample in enumerate(images):
            for n, img in enumerate(sample):
                img.save(os.path.join(out_dir, "image_b%d_n%d.png" % (b, n)), format="PNG")

    # Reference: the saved bf16 weights, loaded as float32 (exact), eager attention.
    model = load_model(out_dir, torch.float32, "eager")
    for k, v in model.state_dict().items():
        want = bf16_state[k]
        if want.dtype == torch.float8_e4m3fn:  # compare the codes
            same = v.dtype == want.dtype and torch.equal(v.view(torch.uint8),
                                                         want.view(torch.uint8))
        else:
            same = torch.equal(v, want.float())
        if not same:
            raise RuntimeError("%s: %s does not reload bit-identically" % (name, k))
    ref = reference_tensors(model, inputs, images is not None)
    check_stage_layout(model, ref)
    tokens, step_logits = greedy(model, inputs, tcfg.pad_token_id)
    for row in tokens.tolist():
        if len(set(row)) < MIN_DISTINCT_GREEDY:
            raise RuntimeError("%s: degenerate greedy output %s; pick another seed" % (name, row))
    recompute_diff = check_against_recompute(model, inputs, tokens, step_logits)
    ref["greedy_tokens"] = tokens.contiguous()
    ref["step_logits"] = step_logits.contiguous()
    prefill_diff = float((step_logits[:, 0] - ref["logits"][:, -1]).abs().max())

    sdpa = load_model(out_dir, torch.float32, "sdpa")
    sdpa_diff = float((forward(sdpa, inputs).logits - ref["logits"]).abs().max())
    if sdpa_diff > SDPA_TOL:
        raise RuntimeError("%s: sdpa and eager differ by %g" % (name, sdpa_diff))
    del sdpa
    bf16 = load_model(out_dir, torch.bfloat16, "eager")
    ref["logits_bf16"] = forward(bf16, inputs).logits.float().contiguous()
    ref["greedy_tokens_bf16"] = greedy(bf16, inputs, tcfg.pad_token_id)[0].contiguous()
    del bf16
    same = (ref["greedy_tokens_bf16"] == tokens).all(dim=0).tolist() + [False]
    bf16_agree_steps = same.index(False)
    bf16_diff = ref["logits_bf16"] - ref["logits"]
    fp8_checks = None
    if unquantized_dir:
        plain = load_model(unquantized_dir, torch.float32, "eager")
        plain_logits = forward(plain, inputs).logits
        plain_tokens = greedy(plain, inputs, tcfg.pad_token_id)[0]
        del plain
        shutil.rmtree(unquantized_dir)
        agree = (plain_tokens == tokens).all(dim=0).tolist() + [False]
        fp8_checks = {
            "fp8_linears": n_fp8,
            "max_abs_diff_fp8_vs_unquantized_logits": float(
                (plain_logits - ref["logits"]).abs().max()),
            "fp8_vs_unquantized_argmax_agreement": float(
                (plain_logits.argmax(-1) == ref["logits"].argmax(-1)).double().mean()),
            "greedy_fp8_equals_unquantized_for_first_steps": agree.index(False),
        }

    ref_path = os.path.join(out_dir, "reference.safetensors")
    save_file(ref, ref_path, metadata={"generator": "tests/golden/gen_fixtures.py"})
    log("wrote %s" % os.path.relpath(ref_path, REPO_ROOT))

    # Sanity: reload both files from disk and reproduce the stored logits exactly.
    stored = load_file(ref_path)
    again = load_model(out_dir, torch.float32, "eager")
    replay = forward(again, inputs).logits
    if not torch.equal(replay, stored["logits"]):
        raise RuntimeError("%s: reloaded model does not reproduce the stored logits" % name)

    logits = ref["logits"]
    top2 = step_logits.topk(2, dim=-1).values
    margins = top2[..., 0] - top2[..., 1]
    meta = {
        "name": name,
        "exercises": case["exercises"],
        "versions": ver,
        "reference": {
            "dtype": "float32 forward of the bf16 weights (exactly representable)",
            "attn_implementation": "eager",
            "device": "cpu, torch.set_num_threads(1)",
            "call": "MllamaForConditionalGeneration.forward(input_ids, attention_mask=1, "
                    "pixel_values, aspect_ratio_ids, aspect_ratio_mask, cross_attention_mask, "
                    "use_cache=False, output_hidden_states=True)",
            "generation": "generate(do_sample=False, max_new_tokens=32, eos_token_id=None): "
                          "exactly 32 tokens, stop tokens disabled; step_logits are the raw "
                          "logits of each step (output_logits=True)",
            "checks": {
                "weights_reload_bit_identical": True,
                "reloaded_forward_reproduces_logits_bitwise": True,
                "max_abs_diff_sdpa_vs_eager_logits": sdpa_diff,
                "max_abs_diff_cached_decode_vs_full_recompute": recompute_diff,
                "max_abs_diff_prefill_step_vs_forward_last_logits": prefill_diff,
                "max_abs_diff_bf16_vs_f32_logits": float(bf16_diff.abs().max()),
                "bf16_argmax_agreement": float((ref["logits_bf16"].argmax(-1)
                                                == logits.argmax(-1)).double().mean()),
                "greedy_bf16_equals_f32_for_first_steps": bf16_agree_steps,
                "min_top1_top2_step_logit_margin": float(margins.min()),
                "logits_std": float(logits.std()),
                **(fp8_checks or {}),
            },
        },
        "derived": {
            "vision_tokens_per_tile": patches,
            "vision_tokens_per_tile_padded": patches + npad,
            "vision_pad_tokens": npad,
            "vision_head_dim": vcfg.hidden_size // vcfg.attention_heads,
            "text_head_dim": tcfg.hidden_size // tcfg.num_attention_heads,
            "gqa_ratio": tcfg.num_attention_heads // tcfg.num_key_value_heads,
            "image_token_index": config.image_token_index,
            "embed_tokens_rows": tcfg.vocab_size + 8,
            "special_ids": special_ids(tcfg.vocab_size),
            "rope_inv_freq_regions": regions,
            "rope_inv_freq": inv_freq.tolist(),
        },
        "full_config": full_config(config),
        "prompt_layouts": layouts,
        "images": None if images is None else {
            "files": [["image_b%d_n%d.png" % (b, n) for n in range(len(s))]
                      for b, s in enumerate(images)],
            "sizes_wh": [[list(img.size) for img in s] for s in images],
            "processor": "MllamaImageProcessor as in preprocessor_config.json (tile = "
                         "image_size), fed the PNG images as RGB PIL images",
            **img_info,
        },
        "files": {f: sha256_file(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir))
                  if f.endswith((".safetensors", ".json")) and f != "meta.json"},
        "tensors": tensor_table(ref),
    }
    write_json(os.path.join(out_dir, "meta.json"), meta)
    log("%s: logits max|bf16-f32| %.3g, sdpa-eager %.3g, decode-recompute %.3g, greedy %s"
        % (name, meta["reference"]["checks"]["max_abs_diff_bf16_vs_f32_logits"], sdpa_diff,
           recompute_diff, tokens[0, :8].tolist()))
    return name


def gen_models():
    import torch

    torch.set_num_threads(1)
    reset_dir(MODELS_DIR)
    ver = versions()
    names = [gen_model(case, ver) for case in MODEL_CASES + FP8_CASES]
    write_json(os.path.join(MODELS_DIR, "index.json"), {
        "generator": "tests/golden/gen_fixtures.py --only models",
        "models": names,
    })


FP8_QUANT_PATH = os.path.join(FIXTURES_DIR, "fp8_quant.safetensors")


def gen_fp8_quant():
    """compressed-tensors' quantization of one bf16 weight, row by row: rows of ordinary
    values across four decades, one of zeros (the eps scale), one that reaches e4m3
    subnormals, one of negative zeros and a single large value (the zero point's +0)."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(1717)
    w = torch.randn(12, 96, generator=g) * torch.logspace(-3, 1, 12).unsqueeze(1)
    w[3] = 0
    w[5] = torch.randn(96, generator=g) * 1e-4
    w[5, 0] = 0.3
    w[7] = -0.0
    w[7, 11] = 3e4
    w = w.to(torch.bfloat16)
    layer = torch.nn.Sequential(torch.nn.Linear(96, 12, bias=False)).to(torch.bfloat16)
    with torch.no_grad():
        layer[0].weight.copy_(w)
    state, _, _ = fp8_compress(layer)
    save_file({"weight": w.contiguous(), "quantized": state["0.weight"].contiguous(),
               "scale": state["0.weight_scale"].contiguous()},
              FP8_QUANT_PATH, metadata={"generator": "tests/golden/gen_fixtures.py --only fp8"})
    log("wrote %s" % os.path.relpath(FP8_QUANT_PATH, REPO_ROOT))


def gen_fp8():
    """The FP8 cases alone, added to (or replaced in) the model index and the reference-mode
    index, leaving every other fixture as it is; and the quantization golden."""
    import torch

    torch.set_num_threads(1)
    gen_fp8_quant()
    ver = versions()
    index_path = os.path.join(MODELS_DIR, "index.json")
    ref_index_path = os.path.join(REFERENCE_MODELS_DIR, "index.json")
    with open(index_path, encoding="utf-8") as f:
        index = json.load(f)
    with open(ref_index_path, encoding="utf-8") as f:
        ref_index = json.load(f)
    for case in FP8_CASES:
        name = gen_model(case, ver)
        if name not in index["models"]:
            index["models"].append(name)
        kind, _ = gen_reference_model(name, ver)
        for k in ("models", "unchanged"):
            if name in ref_index[k]:
                ref_index[k].remove(name)
        ref_index[kind].append(name)
    write_json(index_path, index)
    write_json(ref_index_path, ref_index)


# ======================================================================================
# C) Tokenizer (other generator)
# ======================================================================================

def gen_tokenizer(required):
    if not os.path.exists(TOKENIZER_REFS):
        msg = "tokenizer fixtures skipped: %s does not exist" % os.path.relpath(
            TOKENIZER_REFS, REPO_ROOT)
        if required:
            raise SystemExit(msg)
        log(msg)
        return
    spec = importlib.util.spec_from_file_location("tokenizer_refs", TOKENIZER_REFS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for path in module.generate(REPO_ROOT):
        log("wrote %s" % os.path.relpath(path, REPO_ROOT))


# ======================================================================================
# D) LoRA adapters (PEFT) on a tiny model
# ======================================================================================

LORA_DIR = os.path.join(FIXTURES_DIR, "lora")
# The base model: m3's configuration (two interleaved images, GQA, consecutive cross
# layers, vocab 700) with its own weights.
LORA_BASE_CASE = "m3_two_images_interleaved"
LORA_SEED = 809
LORA_STEPS = 16
# Random A and B are scaled so each adapted Linear moves its output by about this
# fraction of the base output (B·A·x·scale ~ LORA_DELTA · W·x): large enough that every
# adapted module shows in the logits, small enough to keep the outputs O(1).
LORA_DELTA = 0.5
# Greedy tokens are compared exactly: the smallest top-1/top-2 margin must dwarf the
# float32 reordering error (~1e-5).
LORA_MIN_MARGIN = 1e-2
LORA_CASES = [
    {
        "name": "a1_all_r8",
        "exercises": [
            "every kind of adaptable Linear: vision q/k/v/o/fc1/fc2 of local and global "
            "layers, multi_modal_projector, text self_attn and cross_attn q/k/v/o, MLP "
            "gate/up/down, lm_head",
            "target_modules as a list (PEFT suffix matching)",
            "r=8, lora_alpha=16 (scale 2); weights saved as BF16",
            "touches images: vision tower, projector and cross k/v change the resident "
            "image state",
        ],
        "config": {"r": 8, "lora_alpha": 16, "use_rslora": False,
                   "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj", "fc1", "fc2",
                                      "multi_modal_projector", "lm_head"]},
        "dtype": "bfloat16",
    },
    {
        "name": "a2_text_rslora_r4",
        "exercises": [
            "target_modules as a regular expression (re.fullmatch) restricted to the text "
            "decoder: self_attn q/v, cross_attn q/o, MLP gate/down",
            "use_rslora: scale = lora_alpha / sqrt(r) = 12 / 2 = 6 (not a power of two)",
            "r=4; weights saved as F32 (values rounded to bf16)",
            "leaves images alone: its requests share the base model's image states",
        ],
        "config": {"r": 4, "lora_alpha": 12, "use_rslora": True,
                   "target_modules": r".*language_model.*self_attn\.(q_proj|v_proj)"
                                     r"|.*cross_attn\.(q_proj|o_proj)"
                                     r"|.*mlp\.(gate_proj|down_proj)"},
        "dtype": "float32",
    },
]


def lora_scale(cfg):
    return cfg["lora_alpha"] / (math.sqrt(cfg["r"]) if cfg["use_rslora"] else cfg["r"])


def randomize_lora(peft_model, case):
    """Overwrite every lora_A / lora_B (PEFT starts B at zero) with bf16-exact values
    in the case's dtype. Returns {state-dict key as saved: float32 tensor}."""
    import torch

    cfg = case["config"]
    scale = lora_scale(cfg)
    dtype = getattr(torch, case["dtype"])
    values = {}
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if ".lora_A." not in name and ".lora_B." not in name:
                continue
            rng = param_rng(LORA_SEED, case["name"] + "/" + name)
            out_f, in_f = param.shape
            if ".lora_A." in name:
                value = rng.standard_normal((out_f, in_f)) / math.sqrt(in_f)
            else:
                value = rng.standard_normal((out_f, in_f)) * LORA_DELTA / (
                    scale * math.sqrt(cfg["r"]))
            exact = torch.from_numpy(value.astype(np.float32)).to(torch.bfloat16).float()
            param.data = exact.to(dtype)
            values[name.replace(".default", "")] = exact
    return values


def vision_output(model, inputs):
    """The vision tower's output for inputs (a forward hook on vision_model)."""
    vm = model.get_base_model().vision_model if hasattr(model, "get_base_model") \
        else model.vision_model
    got = {}
    handle = vm.register_forward_hook(lambda _m, _i, o: got.update(out=o[0]))
    try:
        forward(model, inputs)
    finally:
        handle.remove()
    return got["out"]


def lora_reference(model, inputs, pad_id, min_margin=LORA_MIN_MARGIN):
    """Prompt logits, LORA_STEPS greedy tokens (checked against a full recompute) and
    the smallest top-1/top-2 margin of their steps (at least min_margin)."""
    logits = forward(model, inputs).logits
    tokens, step_logits = greedy(model, inputs, pad_id, LORA_STEPS)
    recompute = check_against_recompute(model, inputs, tokens, step_logits, LORA_STEPS)
    top2 = step_logits.topk(2, dim=-1).values
    margin = float((top2[..., 0] - top2[..., 1]).min())
    if margin < min_margin:
        raise RuntimeError("greedy margin %g below %g; pick another seed" % (margin, min_margin))
    if len(set(tokens[0].tolist())) < MIN_DISTINCT_GREEDY // 2:
        raise RuntimeError("degenerate greedy output %s" % tokens[0].tolist())
    ref = {"logits": logits.contiguous(), "greedy_tokens": tokens.contiguous()}
    return ref, {"min_top1_top2_step_logit_margin": margin,
                 "max_abs_diff_cached_decode_vs_full_recompute": recompute}


def gen_lora():
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import MllamaConfig, MllamaForConditionalGeneration

    import peft

    torch.set_num_threads(1)
    reset_dir(LORA_DIR)
    ver = dict(versions(), peft=peft.__version__)
    base_case = dict(next(c for c in MODEL_CASES if c["name"] == LORA_BASE_CASE),
                     name="lora_base", seed=LORA_SEED)
    config = MllamaConfig(vision_config=base_case["vision"], text_config=base_case["text"],
                          image_token_index=base_case["text"]["vocab_size"])
    model_dir = os.path.join(LORA_DIR, "model")
    torch.manual_seed(LORA_SEED)
    model = MllamaForConditionalGeneration(config)
    randomize(model, LORA_SEED)
    model.to(torch.bfloat16).save_pretrained(model_dir, safe_serialization=True)
    del model
    inputs, _, layouts, img_info = build_inputs(base_case, config,
                                                np.random.default_rng(LORA_SEED))
    # Only the real tiles of pixel_values are stored: the processor pads with zeros.
    real = inputs["aspect_ratio_mask"].bool()                     # (1, N, T)
    if torch.any(inputs["pixel_values"][~real] != 0):
        raise RuntimeError("padding tiles of pixel_values are not zeros")
    stored = {k: v.contiguous() for k, v in inputs.items()
              if k not in ("attention_mask", "pixel_values")}
    stored["pixel_values_real_tiles"] = inputs["pixel_values"][real].contiguous()
    save_file(stored, os.path.join(LORA_DIR, "inputs.safetensors"))
    pad_id = config.text_config.pad_token_id

    base = load_model(model_dir, torch.float32, "eager")
    base_ref, base_checks = lora_reference(base, inputs, pad_id)
    base_vision = vision_output(base, inputs)
    del base
    os.makedirs(os.path.join(LORA_DIR, "base"))
    save_file(base_ref, os.path.join(LORA_DIR, "base", "reference.safetensors"))
    cases = {"base": {"checks": base_checks,
                      "greedy_tokens": base_ref["greedy_tokens"][0].tolist()}}

    for case in LORA_CASES:
        name, cfg = case["name"], case["config"]
        out_dir = os.path.join(LORA_DIR, name)
        # Made on the bf16 model as a fine-tune would leave it; the frozen lm_head copy
        # PEFT would add (save_embedding_layers) is left out to keep the fixture small.
        bf16 = load_model(model_dir, torch.bfloat16, "eager")
        peft_model = get_peft_model(bf16, LoraConfig(lora_dropout=0.0, bias="none", **cfg))
        values = randomize_lora(peft_model, case)
        # Relative, so the fixture names no path of the machine that made it.
        peft_model.peft_config["default"].base_model_name_or_path = "../model"
        peft_model.save_pretrained(out_dir, save_embedding_layers=False)
        os.remove(os.path.join(out_dir, "README.md"))  # PEFT's model card template
        # PEFT keeps a target list as a set, written in hash order: sort it so the file
        # is reproducible, and write it as PEFT does (PeftConfigMixin.save_pretrained).
        config_path = os.path.join(out_dir, "adapter_config.json")
        with open(config_path, encoding="utf-8") as f:
            written = json.load(f)
        if isinstance(written["target_modules"], list):
            written["target_modules"] = sorted(written["target_modules"])
        with open(config_path, "w", encoding="utf-8") as f:
            f.write(json.dumps(written, indent=2, sort_keys=True))
        del peft_model, bf16
        saved = load_file(os.path.join(out_dir, "adapter_model.safetensors"))
        if set(saved) != set(values) or any(
                not torch.equal(saved[k].float(), v) for k, v in values.items()):
            raise RuntimeError("%s: saved adapter differs from the values set" % name)

        # Reference: the saved files loaded the way users load them, float32 eager.
        model = PeftModel.from_pretrained(load_model(model_dir, torch.float32, "eager"),
                                          out_dir)
        model.eval()
        ref, checks = lora_reference(model, inputs, pad_id)
        vision_delta = float((vision_output(model, inputs) - base_vision).abs().max())
        del model
        touches = case["name"] == "a1_all_r8"
        if (vision_delta > 0) != touches:
            raise RuntimeError("%s: vision output moved by %g" % (name, vision_delta))
        save_file(ref, os.path.join(out_dir, "reference.safetensors"))
        modules = sorted({k.split(".lora_")[0][len("base_model.model."):] for k in saved})
        checks.update({
            "max_abs_diff_vision_output_vs_base": vision_delta,
            "max_abs_diff_logits_vs_base": float((ref["logits"] - base_ref["logits"])
                                                 .abs().max()),
        })
        cases[name] = {
            "exercises": case["exercises"],
            "lora_config": cfg,
            "scale": lora_scale(cfg),
            "saved_dtype": case["dtype"],
            "adapted_modules": modules,
            "n_adapted_modules": len(modules),
            "touches_images": touches,
            "checks": checks,
            "greedy_tokens": ref["greedy_tokens"][0].tolist(),
        }
        log("%s: %d modules, logits moved %.3g, greedy %s" % (
            name, len(modules), checks["max_abs_diff_logits_vs_base"],
            ref["greedy_tokens"][0, :8].tolist()))

    write_json(os.path.join(LORA_DIR, "meta.json"), {
        "generator": "tests/golden/gen_fixtures.py --only lora",
        "versions": ver,
        "model": {"config_of": LORA_BASE_CASE, "seed": LORA_SEED,
                  "full_config": full_config(config)},
        "inputs": {"prompt_layout": layouts[0], "images": img_info,
                   "tensors": "inputs.safetensors: input_ids, aspect_ratio_ids, "
                              "aspect_ratio_mask, cross_attention_mask, and "
                              "pixel_values_real_tiles: pixel_values[aspect_ratio_mask == 1] "
                              "(real tiles in image, tile order; the other slots are zeros)"},
        "reference": {
            "dtype": "float32 forward of the bf16 base weights and the adapter",
            "attn_implementation": "eager",
            "adapter_load": "PeftModel.from_pretrained(base float32, adapter dir)",
            "logits": "forward(use_cache=False) logits of every prompt position (1, S, V)",
            "generation": "generate(do_sample=False, max_new_tokens=%d, eos_token_id=None)"
                          % LORA_STEPS,
        },
        "cases": cases,
        "files": {os.path.relpath(os.path.join(d, f), LORA_DIR):
                  sha256_file(os.path.join(d, f))
                  for d, _, fs in sorted(os.walk(LORA_DIR)) for f in sorted(fs)
                  if f.endswith((".safetensors", ".json"))},
    })

# ======================================================================================
# E) Reference semantics: Meta's cross-attention row mask
# ======================================================================================
#
# Meta's CrossAttentionTransformerBlock (and vLLM's and SGLang's cross-attention layers)
# multiply the cross-attention output by the full-text-row mask before the gated
# residual, and the MLP output again; transformers 4.47.1 masks only the MLP output. A
# text row that sees no tile (one before the first <|image|>) therefore passes through the
# layer unchanged in the reference, while transformers adds its uniform attention over
# every image key. The fixtures below are transformers with that one difference patched
# in; the layer check proves the patch equals the reference block.

REFERENCE_DIR = os.path.join(FIXTURES_DIR, "reference_mode")
REFERENCE_MODELS_DIR = os.path.join(REFERENCE_DIR, "models")
REFERENCE_LORA_DIR = os.path.join(REFERENCE_DIR, "lora")
# The text-side tensors that the row mask changes; inputs, vision and projector outputs
# are those of fixtures/models/<name>/reference.safetensors.
REFERENCE_TENSORS = ("text_hidden_states", "logits", "greedy_tokens", "step_logits")
# Layer check: patched transformers and the re-implementation agree to float32 rounding
# (relative to the output's largest magnitude); the unpatched layer must move every row
# that sees no tile by far more than that, and no other row.
LAYER_CHECK_SEED = 1313
LAYER_CHECK_TOL = 1e-5
LAYER_CHECK_MIN_DIFF = 1e-2
LAYER_CHECK_MODEL = "m3_two_images_interleaved"
# The LoRA fixture's weights and seed are fixed by its transformers-mode files, so its
# reference-mode greedy path cannot be re-seeded: its margin (a1: 0.009) is held to this
# bound instead, still 500x the float32 reordering error (~1e-5) the tests allow for.
REFERENCE_LORA_MIN_MARGIN = 5e-3
# What reference_row_mask() changes, as the fixtures' JSON records it.
REFERENCE_PATCH_DOC = (
    "transformers 4.47.1 MllamaCrossAttentionDecoderLayer.forward, unchanged except that the "
    "cross_attn output is multiplied by full_text_row_masked_out_mask[:, 0] before the gated "
    "residual (a forward hook on layer.cross_attn for the duration of the call); the MLP "
    "output keeps its mask. This is Meta's CrossAttentionTransformerBlock, vLLM's and "
    "SGLang's MllamaCrossAttentionDecoderLayer.")


def check_transformers_version():
    """Refuse a transformers whose Mllama differs from what the fixtures record."""
    import transformers
    from packaging.version import Version

    low, high = TRANSFORMERS_RANGE
    have = Version(transformers.__version__)
    if not Version(low) <= have < Version(high):
        raise SystemExit(
            "transformers %s is outside [%s, %s): from 4.54 on, Mllama's vision encoder takes "
            "intermediate_layers_indices one layer late (the encoder input is no longer "
            "hidden_states[0]), so the fixtures it made would not match what the engine "
            "computes. Install the versions of tests/golden/requirements.txt (transformers "
            "4.47.1), see tests/golden/README.md." % (have, low, high))


def _reference_layer_forward(transformers_forward):
    """transformers_forward with the cross-attention output row-masked (REFERENCE_PATCH_DOC)."""
    signature = inspect.signature(transformers_forward)

    def forward(self, *args, **kwargs):
        mask = signature.bind(self, *args, **kwargs).arguments.get(
            "full_text_row_masked_out_mask")
        if mask is None:
            return transformers_forward(self, *args, **kwargs)

        def zero_rows(_module, _inputs, output):
            return (mask[:, 0] * output[0],) + tuple(output[1:])

        handle = self.cross_attn.register_forward_hook(zero_rows)
        try:
            return transformers_forward(self, *args, **kwargs)
        finally:
            handle.remove()

    return forward


@contextlib.contextmanager
def reference_row_mask():
    """Every MllamaCrossAttentionDecoderLayer computes the reference semantics while inside."""
    from transformers.models.mllama import modeling_mllama

    cls = modeling_mllama.MllamaCrossAttentionDecoderLayer
    original = cls.forward
    cls.forward = _reference_layer_forward(original)
    try:
        yield
    finally:
        cls.forward = original


def meta_cross_attention_block(layer, x, vision, allowed, eps):
    """Meta's CrossAttentionTransformerBlock computed from its definition with the weights of
    an HF cross-attention decoder layer (no HF module is called):

        r    = 1 if the row may see any key, else 0
        a    = RMSNorm(x);  q = RMSNorm_head(Wq a);  k = RMSNorm_head(Wk c);  v = Wv c
        attn = softmax(q kᵀ / √d + bias) v  (bias -inf on keys the row may not see; a row
               that may see none attends uniformly, and r zeroes it)
        h    = x + tanh(g_attn) · r · Wo attn
        out  = h + tanh(g_mlp) · r · W2 (silu(W1 n) ⊙ W3 n),  n = RMSNorm(h)

    x (B, S, D) text rows, vision (B, K, D) projected vision tokens, allowed (B, S, K) bool."""
    import torch

    def rms(t, weight):
        return weight * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps))

    att = layer.cross_attn
    heads, kv_heads = att.num_heads, att.num_key_value_heads
    b, s, _ = x.shape
    hd = att.head_dim
    row = allowed.any(-1).to(x.dtype)[..., None]                          # (B, S, 1)
    q = rms((rms(x, layer.input_layernorm.weight) @ att.q_proj.weight.T)
            .view(b, s, heads, hd), att.q_norm.weight)
    k = rms((vision @ att.k_proj.weight.T).view(b, -1, kv_heads, hd), att.k_norm.weight)
    v = (vision @ att.v_proj.weight.T).view(b, -1, kv_heads, hd)
    group = heads // kv_heads              # query head h reads kv head h // group
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bshd,bkhd->bhsk", q, k) / math.sqrt(hd)
    sees = allowed | ~allowed.any(-1, keepdim=True)                      # rows with no key: all
    scores = scores.masked_fill(~sees[:, None], float("-inf"))
    attn = torch.einsum("bhsk,bkhd->bshd", scores.softmax(-1), v).reshape(b, s, heads * hd)
    h = x + torch.tanh(layer.cross_attn_attn_gate) * row * (attn @ att.o_proj.weight.T)
    n = rms(h, layer.post_attention_layernorm.weight)
    mlp = layer.mlp
    ffn = (torch.nn.functional.silu(n @ mlp.gate_proj.weight.T) * (n @ mlp.up_proj.weight.T)) \
        @ mlp.down_proj.weight.T
    return h + torch.tanh(layer.cross_attn_mlp_gate) * row * ffn


def check_reference_layer():
    """The patched transformers layer against meta_cross_attention_block on random inputs
    (rows that see no tile included), and the unpatched layer differing on exactly those
    rows. Returns the measured differences."""
    import torch
    from transformers.models.mllama.modeling_mllama import _prepare_cross_attention_mask

    model = load_model(os.path.join(MODELS_DIR, LAYER_CHECK_MODEL), torch.float32, "eager")
    tcfg = model.config.text_config
    index = tcfg.cross_attention_layers[0]
    layer = model.language_model.model.layers[index]
    rng = np.random.default_rng(LAYER_CHECK_SEED)
    batch, rows, images, tokens = 2, 9, 2, 3
    d = tcfg.hidden_size
    # Per (row, image, tile): may the row see it? Sample 0's first three rows and sample
    # 1's rows 0 and 5 see nothing; every other row sees at least one tile.
    tiles = rng.random((batch, rows, images, MAX_TILES)) < 0.5
    blind = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 5)]
    for b in range(batch):
        for r in range(rows):
            if (b, r) in blind:
                tiles[b, r] = False
            elif not tiles[b, r].any():
                tiles[b, r, rng.integers(images), rng.integers(MAX_TILES)] = True
    mask = torch.from_numpy(tiles.astype(np.int64))                      # (B, S, N, T)
    x = torch.from_numpy(rng.standard_normal((batch, rows, d)).astype(np.float32))
    vision = torch.from_numpy(rng.standard_normal(
        (batch, images * MAX_TILES * tokens, d)).astype(np.float32))
    hf_mask, row_mask = _prepare_cross_attention_mask(mask, tokens, torch.float32)
    allowed = mask.bool().repeat_interleave(tokens, dim=-1).reshape(batch, rows, -1)

    def run_hf():
        with torch.no_grad():
            return layer(x, cross_attention_states=vision, cross_attention_mask=hf_mask,
                         attention_mask=None, full_text_row_masked_out_mask=row_mask)[0]

    with torch.no_grad():
        want = meta_cross_attention_block(layer, x, vision, allowed, tcfg.rms_norm_eps)
    with reference_row_mask():
        patched = run_hf()
    unpatched = run_hf()
    scale = float(want.abs().max())
    patched_diff = float((patched - want).abs().max()) / scale
    if patched_diff > LAYER_CHECK_TOL:
        raise RuntimeError("patched layer differs from the reference block by %g" % patched_diff)
    is_blind = ~allowed.any(-1)                                           # (B, S)
    if sorted(map(tuple, is_blind.nonzero().tolist())) != blind:
        raise RuntimeError("the layer check's blind rows are not the planned ones")
    if not torch.equal(patched[is_blind], x[is_blind]):
        raise RuntimeError("patched layer changes a row that sees no tile")
    per_row = (unpatched - want).abs().amax(-1) / scale                   # (B, S)
    if per_row[is_blind].min() < LAYER_CHECK_MIN_DIFF or per_row[~is_blind].max() > LAYER_CHECK_TOL:
        raise RuntimeError("unpatched layer: blind rows moved by >= %g, others by <= %g"
                           % (float(per_row[is_blind].min()), float(per_row[~is_blind].max())))
    result = {
        "model": LAYER_CHECK_MODEL, "layer": index, "seed": LAYER_CHECK_SEED,
        "shape": {"batch": batch, "rows": rows, "images": images, "tiles": MAX_TILES,
                  "tokens_per_tile": tokens, "hidden": d},
        "rows_without_a_tile": [list(r) for r in blind],
        "max_abs_diff_patched_vs_reimplementation_rel": patched_diff,
        "patched_rows_without_a_tile_unchanged_bitwise": True,
        "min_abs_diff_unpatched_vs_reimplementation_rows_without_a_tile_rel":
            float(per_row[is_blind].min()),
        "max_abs_diff_unpatched_vs_reimplementation_other_rows_rel":
            float(per_row[~is_blind].max()),
    }
    log("layer check: patched vs re-implementation %.3g; unpatched moves blind rows by >= %.3g, "
        "others by <= %.3g" % (patched_diff, result[
            "min_abs_diff_unpatched_vs_reimplementation_rows_without_a_tile_rel"],
            result["max_abs_diff_unpatched_vs_reimplementation_other_rows_rel"]))
    return result


def greedy_agreement(a, b):
    """Per batch row: how many of the greedy tokens agree position by position, and the
    first step where they differ (None when all agree)."""
    out = []
    for ra, rb in zip(a.tolist(), b.tolist()):
        same = [x == y for x, y in zip(ra, rb)]
        out.append({"steps": len(same), "agree": sum(same),
                    "first_divergence": same.index(False) if False in same else None})
    return out


def mode_difference(transformers_logits, reference_logits, row_mask, t_tokens, r_tokens):
    """How far transformers' prompt logits and greedy tokens are from the reference's.
    row_mask (B, S): 1 where the row sees a tile."""
    diff = (transformers_logits - reference_logits).abs()                 # (B, S, V)
    span = float(reference_logits.max() - reference_logits.min())
    blind = row_mask == 0
    per_row = diff.amax(-1)
    return {
        "max_abs_logit_diff": float(diff.max()),
        "reference_logit_range": span,
        "max_abs_logit_diff_rel_range": float(diff.max()) / span,
        "max_abs_logit_diff_rows_without_a_tile": float(per_row[blind].max()),
        "max_abs_logit_diff_rows_with_a_tile": float(per_row[~blind].max()),
        "rows_without_a_tile": int(blind.sum()),
        "prompt_argmax_agreement": float((transformers_logits.argmax(-1)
                                          == reference_logits.argmax(-1)).double().mean()),
        "greedy": greedy_agreement(t_tokens, r_tokens),
    }


def stored_inputs(ref):
    """The forward inputs a model fixture's reference.safetensors holds."""
    import torch

    inputs = {k: ref[k] for k in ("input_ids", "pixel_values", "aspect_ratio_ids",
                                  "aspect_ratio_mask", "cross_attention_mask") if k in ref}
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    return inputs


def gen_reference_model(name, ver):
    """Model `name` under the reference row mask. Returns (kind, summary): kind is
    'models' when some row sees no tile (own fixture written) or 'unchanged' (both modes
    agree bit for bit, checked; the transformers fixture serves both)."""
    import torch
    from safetensors.torch import load_file, save_file

    src = os.path.join(MODELS_DIR, name)
    stored = load_file(os.path.join(src, "reference.safetensors"))
    inputs = stored_inputs(stored)
    has_images = "pixel_values" in stored
    model = load_model(src, torch.float32, "eager")
    pad_id = model.config.text_config.pad_token_id
    # transformers' own run, here and now: the comparison is between two runs on one machine.
    t_logits = forward(model, inputs).logits
    t_tokens, _ = greedy(model, inputs, pad_id)
    if not torch.equal(t_tokens, stored["greedy_tokens"]):
        raise RuntimeError("%s: transformers' greedy tokens differ from the fixture's" % name)
    replay_diff = float((t_logits - stored["logits"]).abs().max())
    if replay_diff > RECOMPUTE_TOL:
        raise RuntimeError("%s: transformers' logits moved by %g from the fixture's"
                           % (name, replay_diff))
    with reference_row_mask():
        ref = reference_tensors(model, inputs, has_images)
        check_stage_layout(model, ref)
        tokens, step_logits = greedy(model, inputs, pad_id)
        recompute_diff = check_against_recompute(model, inputs, tokens, step_logits)
        sdpa = load_model(src, torch.float32, "sdpa")
        sdpa_diff = float((forward(sdpa, inputs).logits - ref["logits"]).abs().max())
        del sdpa
    if sdpa_diff > SDPA_TOL:
        raise RuntimeError("%s: sdpa and eager differ by %g under the patch" % (name, sdpa_diff))
    row_mask = stored["full_text_row_mask"] if has_images else None
    if row_mask is None or bool(row_mask.all()):
        if not (torch.equal(ref["logits"], t_logits) and torch.equal(tokens, t_tokens)):
            raise RuntimeError("%s: every row sees a tile, yet the patch moved the logits" % name)
        log("%s: no row without a tile; both modes agree bitwise" % name)
        return "unchanged", None
    for key in ("vision_output", "projector_output"):
        if not torch.equal(ref[key], stored[key]):
            raise RuntimeError("%s: the patch moved %s" % (name, key))
    for row in tokens.tolist():
        if len(set(row)) < MIN_DISTINCT_GREEDY:
            raise RuntimeError("%s: degenerate greedy output %s" % (name, row))
    top2 = step_logits.topk(2, dim=-1).values
    margin = float((top2[..., 0] - top2[..., 1]).min())
    out = {k: v for k, v in dict(ref, greedy_tokens=tokens.contiguous(),
                                 step_logits=step_logits.contiguous()).items()
           if k in REFERENCE_TENSORS}
    out_dir = os.path.join(REFERENCE_MODELS_DIR, name)
    reset_dir(out_dir)
    path = os.path.join(out_dir, "reference.safetensors")
    save_file(out, path, metadata={"generator": "tests/golden/gen_fixtures.py --only reference"})
    log("wrote %s" % os.path.relpath(path, REPO_ROOT))
    difference = mode_difference(t_logits, ref["logits"], row_mask, t_tokens, tokens)
    with open(os.path.join(src, "meta.json"), encoding="utf-8") as f:
        layouts = json.load(f)["prompt_layouts"]
    write_json(os.path.join(out_dir, "meta.json"), {
        "name": name,
        "versions": ver,
        "semantics": "reference (Meta's row mask): " + REFERENCE_PATCH_DOC,
        "model": "fixtures/models/%s (weights, inputs, vision and projector outputs)" % name,
        "prompt_layouts": layouts,
        "reference": {
            "dtype": "float32 forward of the bf16 weights, eager attention, cpu, 1 thread",
            "generation": "generate(do_sample=False, max_new_tokens=%d, eos_token_id=None)"
                          % GREEDY_STEPS,
            "checks": {
                "max_abs_diff_sdpa_vs_eager_logits": sdpa_diff,
                "max_abs_diff_cached_decode_vs_full_recompute": recompute_diff,
                "vision_and_projector_output_equal_transformers_fixture": True,
                "max_abs_diff_transformers_rerun_vs_fixture_logits": replay_diff,
                "min_top1_top2_step_logit_margin": margin,
            },
        },
        "transformers_vs_reference": difference,
        "files": {"reference.safetensors": sha256_file(path)},
        "tensors": tensor_table(out),
    })
    greedy_txt = ", ".join("%d/%d (first divergence %s)" % (g["agree"], g["steps"],
                                                            g["first_divergence"])
                           for g in difference["greedy"])
    log("%s: max|Δlogit| %.3g (%.3g of range), greedy agree %s" % (
        name, difference["max_abs_logit_diff"], difference["max_abs_logit_diff_rel_range"],
        greedy_txt))
    return "models", difference


def lora_inputs():
    """The LoRA fixture's forward inputs, rebuilt from lora/inputs.safetensors."""
    import torch
    from safetensors.torch import load_file

    stored = load_file(os.path.join(LORA_DIR, "inputs.safetensors"))
    real = stored["aspect_ratio_mask"].bool()
    tile = stored["pixel_values_real_tiles"].shape[-1]
    pixels = torch.zeros(tuple(real.shape) + (3, tile, tile), dtype=torch.float32)
    pixels[real] = stored["pixel_values_real_tiles"]
    inputs = {k: stored[k] for k in ("input_ids", "aspect_ratio_ids", "aspect_ratio_mask",
                                     "cross_attention_mask")}
    inputs["pixel_values"] = pixels
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    return inputs


def gen_reference_lora(ver):
    """The LoRA fixture's base model and adapters under the reference row mask."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file, save_file
    from transformers.models.mllama.modeling_mllama import _prepare_cross_attention_mask

    import peft

    reset_dir(REFERENCE_LORA_DIR)
    inputs = lora_inputs()
    model_dir = os.path.join(LORA_DIR, "model")
    cases = {}
    for case in ["base"] + [c["name"] for c in LORA_CASES]:
        model = load_model(model_dir, torch.float32, "eager")
        if case != "base":
            model = PeftModel.from_pretrained(model, os.path.join(LORA_DIR, case))
            model.eval()
        stored = load_file(os.path.join(LORA_DIR, case, "reference.safetensors"))
        pad_id = model.config.text_config.pad_token_id
        t_logits = forward(model, inputs).logits
        t_tokens, _ = greedy(model, inputs, pad_id, LORA_STEPS)
        replay_diff = float((t_logits - stored["logits"]).abs().max())
        if not torch.equal(t_tokens, stored["greedy_tokens"]) or replay_diff > RECOMPUTE_TOL:
            raise RuntimeError("lora %s: transformers' rerun differs from the fixture" % case)
        with reference_row_mask():
            ref, checks = lora_reference(model, inputs, pad_id, REFERENCE_LORA_MIN_MARGIN)
        del model
        out_dir = os.path.join(REFERENCE_LORA_DIR, case)
        os.makedirs(out_dir)
        path = os.path.join(out_dir, "reference.safetensors")
        save_file(ref, path)
        log("wrote %s" % os.path.relpath(path, REPO_ROOT))
        row_mask = _prepare_cross_attention_mask(
            inputs["cross_attention_mask"], 1, torch.float32)[1][:, 0, :, 0]
        checks["max_abs_diff_transformers_rerun_vs_fixture_logits"] = replay_diff
        cases[case] = {
            "checks": checks,
            "greedy_tokens": ref["greedy_tokens"][0].tolist(),
            "transformers_vs_reference": mode_difference(t_logits, ref["logits"], row_mask,
                                                         t_tokens, ref["greedy_tokens"]),
            "files": {"reference.safetensors": sha256_file(path)},
        }
    write_json(os.path.join(REFERENCE_LORA_DIR, "meta.json"), {
        "generator": "tests/golden/gen_fixtures.py --only reference",
        "versions": dict(ver, peft=peft.__version__),
        "semantics": "reference (Meta's row mask): " + REFERENCE_PATCH_DOC,
        "model": "fixtures/lora (model, adapters, inputs); each case's "
                 "reference.safetensors holds logits (1, S, V) and %d greedy tokens, as "
                 "fixtures/lora/<case>/" % LORA_STEPS,
        "cases": cases,
    })
    return {k: v["transformers_vs_reference"] for k, v in cases.items()}


def gen_reference():
    import torch

    torch.set_num_threads(1)
    reset_dir(REFERENCE_DIR)
    os.makedirs(REFERENCE_MODELS_DIR)
    ver = versions()
    layer_check = check_reference_layer()
    with open(os.path.join(MODELS_DIR, "index.json"), encoding="utf-8") as f:
        names = json.load(f)["models"]
    kinds = {"models": [], "unchanged": []}
    summary = {}
    for name in names:
        kind, difference = gen_reference_model(name, ver)
        kinds[kind].append(name)
        if difference is not None:
            summary[name] = difference
    lora = gen_reference_lora(ver)
    write_json(os.path.join(REFERENCE_MODELS_DIR, "index.json"), {
        "generator": "tests/golden/gen_fixtures.py --only reference",
        "semantics": REFERENCE_PATCH_DOC,
        "models": kinds["models"],
        "unchanged": kinds["unchanged"],
        "unchanged_means": "every row of the prompt sees a tile (or there is no image): both "
                           "modes give bit-identical outputs (checked), so "
                           "fixtures/models/<name>/reference.safetensors is also the "
                           "reference-mode answer",
    })
    write_json(os.path.join(REFERENCE_DIR, "summary.json"), {
        "generator": "tests/golden/gen_fixtures.py --only reference",
        "versions": ver,
        "layer_check": layer_check,
        "transformers_vs_reference": {"models": summary, "lora": lora},
    })


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only",
                        choices=["images", "seeds", "masks", "models", "tokenizer", "lora",
                                 "reference", "fp8"],
                        help="generate one group only (default: all)")
    args = parser.parse_args()
    check_transformers_version()
    if args.only in (None, "images"):
        gen_images()
    if args.only in (None, "seeds"):
        gen_png_seeds()
        gen_webp_seeds()
        gen_gif_seeds()
        gen_tiff_seeds()
    if args.only in (None, "masks"):
        gen_masks()
    if args.only in (None, "models"):
        gen_models()
    if args.only in (None, "tokenizer"):
        gen_tokenizer(required=args.only == "tokenizer")
    if args.only in (None, "lora"):
        gen_lora()
    if args.only in (None, "reference"):
        gen_reference()
    if args.only == "fp8":
        gen_fp8()


if __name__ == "__main__":
    main()
