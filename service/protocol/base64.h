/* Strict base64 (RFC 4648 §4) and base64 data: URLs (RFC 2397), for images
 * sent inline in requests.
 *
 * Strict means one spelling per byte string: the standard alphabet
 * (A-Z a-z 0-9 + /), padding with '=' to a multiple of 4 characters, no
 * whitespace or line breaks (data URLs inside JSON strings have none), and
 * zero bits in the unused low bits of the last symbol. Anything else is
 * rejected with the offset of the first offending character, so a damaged
 * image is reported as such instead of decoding to different bytes.
 *
 * @locality any thread: no state. */
#ifndef SVC_BASE64_H
#define SVC_BASE64_H

#include <stddef.h>
#include <stdint.h>

typedef enum svc_base64_status {
    SVC_BASE64_OK = 0,
    SVC_BASE64_INVALID,   /* not strict base64 (or not a base64 data: URL) */
    SVC_BASE64_TOO_LARGE, /* the decoded size is over the caller's cap */
} svc_base64_status;

/* The exact decoded size of the n-character text `src`, from its length and
 * padding alone (no decoding), checked against `max_bytes`.
 * Returns OK and *out_len; INVALID when n is not a multiple of 4 or the
 * padding is malformed; TOO_LARGE when the size exceeds max_bytes (*out_len
 * is still set). The characters themselves are checked by
 * svc_base64_decode. */
svc_base64_status svc_base64_decoded_len(const char *src, size_t n, size_t max_bytes,
                                         size_t *out_len, char *err, size_t errlen);

/* Decode the n characters of `src` into dst (capacity dst_cap) and set
 * *out_len. The size is checked first (as svc_base64_decoded_len, with
 * dst_cap as the cap), so an oversized input is rejected before any byte is
 * written. On INVALID, dst holds garbage and err names the offset. */
svc_base64_status svc_base64_decode(const char *src, size_t n, uint8_t *dst, size_t dst_cap,
                                    size_t *out_len, char *err, size_t errlen);

/* Characters svc_base64_encode writes for n bytes (without a NUL); SIZE_MAX
 * when that does not fit in a size_t. */
size_t svc_base64_encoded_len(size_t n);

/* Encode n bytes into dst, which holds svc_base64_encoded_len(n) + 1 bytes;
 * the result is NUL-terminated and padded. */
void svc_base64_encode(const uint8_t *src, size_t n, char *dst);

/* Characters of "data:<media_type>;base64," and n bytes encoded (without a
 * NUL); SIZE_MAX when that does not fit in a size_t. */
size_t svc_data_url_len(const char *media_type, size_t n);

/* Write that data: URL of n bytes into dst, which holds
 * svc_data_url_len(media_type, n) + 1 bytes; NUL-terminated. */
void svc_data_url_write(const char *media_type, const uint8_t *src, size_t n, char *dst);

/* A data: URL split into its parts; pointers are borrowed from the URL. */
typedef struct svc_data_url {
    const char *mime; /* "image/jpeg" (not NUL-terminated, as written) */
    size_t mime_len;
    const char *data; /* the base64 text after the comma */
    size_t data_len;
} svc_data_url;

/* Split `data:<type>/<subtype>[;attr=value]*;base64,<data>`. The scheme,
 * media type and the base64 marker are matched case-insensitively;
 * parameters are skipped. A URL without ";base64" (percent-encoded data) or
 * without a media type is INVALID. The data part is not checked here. */
svc_base64_status svc_data_url_parse(const char *url, size_t len, svc_data_url *out, char *err,
                                     size_t errlen);

#endif
