/* Hand-made progressive JPEGs for the decoder's hostile-input tests
 * (tests/engine/test_image.c, tests/service/test_worker_bad_input.c).
 * Header-only, test code only. */
#ifndef ML_TEST_JPEG_CRAFT_H
#define ML_TEST_JPEG_CRAFT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JPEG_CRAFT_BLOCK 8

static inline uint8_t *jpeg_craft_put(uint8_t *p, const void *bytes, size_t n)
{
    memcpy(p, bytes, n);
    return p + n;
}

/* A progressive greyscale JPEG of w x h with `scans` copies of one DC
 * first scan: every quantizer 1, one Huffman code (a one-bit '0' for DC
 * difference 0). With all_blocks each scan codes every 8x8 block (a valid
 * image of mid grey, ceil(blocks / 8) entropy bytes a scan); without, it
 * codes one block, which is the whole image up to 8x8 and a file that only
 * its header describes beyond. One scan is a valid image; many are the CPU
 * bomb of libjpeg-turbo issue #284 (libjpeg only warns about the repeated
 * scans). Returns the length (malloc'd into *out; exits without memory). */
static inline size_t jpeg_craft_progressive(uint16_t w, uint16_t h, int scans, int all_blocks,
                                            uint8_t **out)
{
    static const uint8_t soi[] = {0xFF, 0xD8};
    static const uint8_t dqt_head[] = {0xFF, 0xDB, 0x00, 0x43, 0x00};
    /* DC table 0: one code of length 1 (16 counts), for the symbol 0. */
    static const uint8_t dht[] = {0xFF, 0xC4, 0x00, 0x14, 0x00,
                                  1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                  0x00};
    /* One component, DC first scan (Ss 0, Se 0, Ah 0, Al 0). */
    static const uint8_t sos[] = {0xFF, 0xDA, 0x00, 0x08, 0x01, 0x01, 0x00, 0x00, 0x00, 0x00};
    static const uint8_t eoi[] = {0xFF, 0xD9};
    const uint8_t sof2[] = {0xFF, 0xC2, 0x00, 0x0B, 0x08, (uint8_t)(h >> 8), (uint8_t)h,
                            (uint8_t)(w >> 8), (uint8_t)w, 0x01, 0x01, 0x11, 0x00};
    uint8_t quant[64];
    memset(quant, 1, sizeof quant);
    size_t blocks = all_blocks ? (size_t)((w + JPEG_CRAFT_BLOCK - 1) / JPEG_CRAFT_BLOCK) *
                                     ((h + JPEG_CRAFT_BLOCK - 1) / JPEG_CRAFT_BLOCK)
                               : 1;
    /* One '0' bit per block, the last byte padded with 1 bits. */
    size_t entropy = (blocks + 7) / 8;
    unsigned used = (unsigned)(blocks - 8 * (entropy - 1));
    size_t n = sizeof soi + sizeof dqt_head + sizeof quant + sizeof sof2 + sizeof dht +
               (size_t)scans * (sizeof sos + entropy) + sizeof eoi;
    uint8_t *p = malloc(n);
    if (!p) {
        fprintf(stderr, "jpeg_craft_progressive: out of memory\n");
        exit(1);
    }
    *out = p;
    p = jpeg_craft_put(p, soi, sizeof soi);
    p = jpeg_craft_put(p, dqt_head, sizeof dqt_head);
    p = jpeg_craft_put(p, quant, sizeof quant);
    p = jpeg_craft_put(p, sof2, sizeof sof2);
    p = jpeg_craft_put(p, dht, sizeof dht);
    for (int i = 0; i < scans; i++) {
        p = jpeg_craft_put(p, sos, sizeof sos);
        memset(p, 0, entropy);
        p[entropy - 1] = (uint8_t)((1u << (8 - used)) - 1);
        p += entropy;
    }
    jpeg_craft_put(p, eoi, sizeof eoi);
    return n;
}

#endif
