/* Fuzz target: strict base64 and data: URLs. Properties:
 *   decode(x) succeeds  =>  encode(decode(x)) == x   (one spelling per bytes)
 *   decode(encode(x)) == x
 *   a parsed data: URL points inside its input.
 * Aborts when one breaks. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/base64.h"

static void require(bool ok)
{
    if (!ok)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;

    /* Decode as text; a canonical input re-encodes to itself. */
    size_t cap = size / 4 * 3;
    uint8_t *dec = malloc(cap ? cap : 1);
    char *enc = malloc(svc_base64_encoded_len(size) + 1);
    require(dec && enc);
    size_t n;
    char err[128];
    if (svc_base64_decode(text, size, dec, cap, &n, err, sizeof err) == SVC_BASE64_OK) {
        svc_base64_encode(dec, n, enc);
        require(strlen(enc) == size && memcmp(enc, text, size) == 0);
    }
    /* One byte under the exact size is always too large, never a write. */
    size_t exact;
    if (svc_base64_decoded_len(text, size, SIZE_MAX, &exact, NULL, 0) == SVC_BASE64_OK &&
        exact > 0)
        require(svc_base64_decode(text, size, dec, exact - 1, &n, NULL, 0) ==
                SVC_BASE64_TOO_LARGE);

    /* Encode the bytes; decoding gives them back. */
    svc_base64_encode(data, size, enc);
    size_t elen = strlen(enc);
    require(elen == svc_base64_encoded_len(size));
    uint8_t *back = malloc(size ? size : 1);
    require(back != NULL);
    require(svc_base64_decode(enc, elen, back, size, &n, NULL, 0) == SVC_BASE64_OK);
    require(n == size && memcmp(back, data, size) == 0);

    svc_data_url du;
    if (svc_data_url_parse(text, size, &du, err, sizeof err) == SVC_BASE64_OK) {
        require(du.mime > text && du.mime + du.mime_len <= text + size);
        require(du.data > text && du.data + du.data_len == text + size);
    }
    free(back);
    free(enc);
    free(dec);
    return 0;
}
