/* Strict base64 and data: URLs (service/base64.c): RFC 4648 vectors, round
 * trips, every rejection class with its offset, the size cap applied
 * before anything is decoded, and a data: URL written then parsed back. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "protocol/base64.h"

static svc_base64_status decode_str(const char *s, uint8_t *dst, size_t cap, size_t *n,
                                    char *err, size_t errlen)
{
    return svc_base64_decode(s, strlen(s), dst, cap, n, err, errlen);
}

static void test_vectors(void)
{
    /* RFC 4648 §10 */
    static const char *plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *coded[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        char enc[16];
        size_t len = strlen(plain[i]);
        check(svc_base64_encoded_len(len) == strlen(coded[i]), "encoded_len(%zu)", len);
        svc_base64_encode((const uint8_t *)plain[i], len, enc);
        check(!strcmp(enc, coded[i]), "encode(%s) = %s, want %s", plain[i], enc, coded[i]);
        uint8_t dec[16];
        size_t n = 99;
        check(decode_str(coded[i], dec, sizeof dec, &n, NULL, 0) == SVC_BASE64_OK,
              "decode(%s)", coded[i]);
        check(n == len && !memcmp(dec, plain[i], len), "decode(%s) bytes", coded[i]);
    }
}

static void test_round_trip(void)
{
    enum { MAX_LEN = 300 };
    uint8_t src[MAX_LEN], dec[MAX_LEN];
    char enc[MAX_LEN * 2];
    uint32_t x = 12345;
    int bad = 0;
    for (size_t len = 0; len < MAX_LEN; len++) {
        for (size_t i = 0; i < len; i++) {
            x = x * 1664525u + 1013904223u;
            src[i] = (uint8_t)(x >> 24);
        }
        svc_base64_encode(src, len, enc);
        size_t n;
        if (decode_str(enc, dec, len, &n, NULL, 0) != SVC_BASE64_OK || n != len ||
            memcmp(dec, src, len) != 0)
            bad++;
    }
    check(bad == 0, "round trip failed for %d lengths", bad);
    check(svc_base64_encoded_len(SIZE_MAX) == SIZE_MAX, "encoded_len overflow");
}

static void expect_invalid(const char *s, const char *msg_part)
{
    uint8_t dst[64];
    size_t n = 7;
    char err[128] = "";
    svc_base64_status st = decode_str(s, dst, sizeof dst, &n, err, sizeof err);
    check(st == SVC_BASE64_INVALID, "'%s' rejected (got %d)", s, st);
    check(n == 0, "'%s': out_len 0 on failure", s);
    check(strstr(err, msg_part) != NULL, "'%s': error '%s' mentions '%s'", s, err, msg_part);
}

static void test_rejections(void)
{
    expect_invalid("Zm9", "not a multiple of 4");
    expect_invalid("Zm9vY", "not a multiple of 4");
    expect_invalid("Zm9v\nYmFy", "not a multiple of 4");
    expect_invalid("Zm9 vYmF", "0x20 at offset 3");
    expect_invalid("Zm9vYmF\n", "0x0a at offset 7");
    expect_invalid("Zm-v", "0x2d at offset 2");  /* URL-safe alphabet */
    expect_invalid("Zm_v", "0x5f at offset 2");
    expect_invalid("Zm=v", "misplaced '=' at offset 2");
    expect_invalid("Z===", "misplaced '=' at offset 1");
    expect_invalid("====", "misplaced '=' at offset 1");
    expect_invalid("Zg==Zg==", "misplaced '=' at offset 2");
    expect_invalid("Zh==", "non-zero padding bits");  /* "f" is Zg== */
    expect_invalid("Zm9=", "non-zero padding bits");  /* "fo" is Zm8= */
    expect_invalid("Zm9v\x80ZmF", "0x80 at offset 4");
}

static void test_size_cap(void)
{
    /* 8 characters with one '=' decode to 5 bytes. */
    size_t n;
    char err[128] = "";
    check(svc_base64_decoded_len("Zm9vYmE=", 8, 5, &n, err, sizeof err) == SVC_BASE64_OK && n == 5,
          "decoded_len at the cap");
    check(svc_base64_decoded_len("Zm9vYmE=", 8, 4, &n, err, sizeof err) == SVC_BASE64_TOO_LARGE &&
              n == 5,
          "decoded_len over the cap");
    check(strstr(err, "5 bytes exceeds the limit of 4") != NULL, "cap message: %s", err);

    /* The cap is checked before decoding: an oversized input full of
     * invalid characters is TOO_LARGE and leaves dst untouched. */
    enum { BIG = 4096 };
    char *big = malloc(BIG);
    check(big != NULL, "malloc");
    if (!big)
        return;
    memset(big, '!', BIG);
    uint8_t dst[16];
    memset(dst, 0xa5, sizeof dst);
    check(svc_base64_decode(big, BIG, dst, sizeof dst, &n, NULL, 0) == SVC_BASE64_TOO_LARGE,
          "oversized invalid input is TOO_LARGE");
    int touched = 0;
    for (size_t i = 0; i < sizeof dst; i++)
        touched |= dst[i] != 0xa5;
    check(!touched, "dst untouched when over the cap");
    free(big);
}

static void expect_url(const char *url, svc_base64_status want, const char *mime,
                       const char *data)
{
    svc_data_url du;
    char err[128] = "";
    svc_base64_status st = svc_data_url_parse(url, strlen(url), &du, err, sizeof err);
    check(st == want, "data URL '%s': status %d, want %d (%s)", url, st, want, err);
    if (st != SVC_BASE64_OK || want != SVC_BASE64_OK)
        return;
    check(du.mime_len == strlen(mime) && !memcmp(du.mime, mime, du.mime_len),
          "'%s': mime '%.*s'", url, (int)du.mime_len, du.mime);
    check(du.data_len == strlen(data) && !memcmp(du.data, data, du.data_len), "'%s': data", url);
}

static void test_data_urls(void)
{
    expect_url("data:image/jpeg;base64,Zm9v", SVC_BASE64_OK, "image/jpeg", "Zm9v");
    expect_url("DATA:Image/JPEG;BASE64,Zm9v", SVC_BASE64_OK, "Image/JPEG", "Zm9v");
    expect_url("data:image/jpeg;name=cat.jpg;base64,", SVC_BASE64_OK, "image/jpeg", "");
    expect_url("data:image/png;base64,iVBO", SVC_BASE64_OK, "image/png", "iVBO");
    expect_url("data:image/jpeg;base64,a,b", SVC_BASE64_OK, "image/jpeg", "a,b");
    expect_url("data:image/jpeg,Zm9v", SVC_BASE64_INVALID, NULL, NULL);
    expect_url("data:image/jpeg;base64", SVC_BASE64_INVALID, NULL, NULL);
    expect_url("data:;base64,Zm9v", SVC_BASE64_INVALID, NULL, NULL);
    expect_url("data:image;base64,Zm9v", SVC_BASE64_INVALID, NULL, NULL);
    expect_url("data:image/;base64,Zm9v", SVC_BASE64_INVALID, NULL, NULL);
    expect_url("data:image/jpeg;base64;x=y,Zm9v", SVC_BASE64_INVALID, NULL, NULL);
    expect_url("data:image/jpeg;x;base64,Zm9v", SVC_BASE64_INVALID, NULL, NULL);
    expect_url("data:image/jpeg ;base64,Zm9v", SVC_BASE64_INVALID, NULL, NULL);
    expect_url("https://example.com/cat.jpg", SVC_BASE64_INVALID, NULL, NULL);
    expect_url("data", SVC_BASE64_INVALID, NULL, NULL);
    expect_url("", SVC_BASE64_INVALID, NULL, NULL);

    char err[128] = "";
    svc_data_url du;
    svc_data_url_parse("http://x", 8, &du, err, sizeof err);
    check(strstr(err, "not a data: URL") != NULL, "message: %s", err);
    /* Not NUL-terminated: the length bounds the scan. */
    const char url[] = "data:image/jpeg;base64,Zm9vXXXX";
    check(svc_data_url_parse(url, 27, &du, NULL, 0) == SVC_BASE64_OK && du.data_len == 4,
          "length-bounded data URL");

    /* Written, then parsed back: the type, and the bytes after decoding. */
    static const uint8_t bytes[] = {0xff, 0xd8, 0xff, 0xe0, 0x00};
    size_t n = svc_data_url_len("image/tiff", sizeof bytes);
    char written[64];
    check(n == strlen("data:image/tiff;base64,") + 8 && n < sizeof written, "data URL length %zu",
          n);
    svc_data_url_write("image/tiff", bytes, sizeof bytes, written);
    check(strlen(written) == n && !strcmp(written, "data:image/tiff;base64,/9j/4AA="),
          "written: %s", written);
    expect_url(written, SVC_BASE64_OK, "image/tiff", "/9j/4AA=");
}

int main(void)
{
    test_vectors();
    test_round_trip();
    test_rejections();
    test_size_cap();
    test_data_urls();
    return check_done();
}
