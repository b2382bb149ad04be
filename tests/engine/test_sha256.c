/* engine/sha256: FIPS 180-2 example vectors, the padding boundaries around
 * one and two blocks (digests from Python's hashlib), and streaming in every
 * split equal to one-shot. */
#include <string.h>

#include "harness.h"
#include "sha256.h"

static void check_digest(const void *data, size_t len, const char *want, const char *what)
{
    uint8_t d[ML_SHA256_DIGEST_SIZE];
    char hex[ML_SHA256_HEX_SIZE];
    ml_sha256(data, len, d);
    ml_sha256_hex(d, hex);
    check(!strcmp(hex, want), "%s: got %s want %s", what, hex, want);
}

static void test_vectors(void)
{
    check_digest("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "empty");
    check_digest("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
                 "abc");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    check_digest(m448, strlen(m448),
                 "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1", "448 bits");
    const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
                       "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    check_digest(m896, strlen(m896),
                 "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1", "896 bits");
}

static void test_padding_boundaries(void)
{
    static const struct {
        size_t n;
        const char *hex;
    } cases[] = {
        {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
        {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
        {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
        {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
        {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
        {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
        {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
    };
    char a[128];
    memset(a, 'a', sizeof a);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char what[32];
        snprintf(what, sizeof what, "'a' x %zu", cases[i].n);
        check_digest(a, cases[i].n, cases[i].hex, what);
    }
}

static void test_million_a_streamed(void)
{
    char block[1000];
    memset(block, 'a', sizeof block);
    ml_sha256_ctx ctx;
    ml_sha256_init(&ctx);
    for (int i = 0; i < 1000; i++)
        ml_sha256_update(&ctx, block, sizeof block);
    uint8_t d[ML_SHA256_DIGEST_SIZE];
    char hex[ML_SHA256_HEX_SIZE];
    ml_sha256_final(&ctx, d);
    ml_sha256_hex(d, hex);
    check(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
          "million a: %s", hex);
}

static void test_every_split(void)
{
    uint8_t msg[1000];
    for (size_t i = 0; i < sizeof msg; i++)
        msg[i] = (uint8_t)(i * 7);
    check_digest(msg, sizeof msg, "89f4ff56a25dd1db06a4ce6033603775d705fb96f30f8693733fef602a1ca532",
                 "pattern");
    uint8_t want[ML_SHA256_DIGEST_SIZE];
    ml_sha256(msg, sizeof msg, want);
    int mismatches = 0;
    for (size_t a = 0; a <= sizeof msg; a += 13)
        for (size_t b = a; b <= sizeof msg; b += 29) {
            ml_sha256_ctx ctx;
            uint8_t got[ML_SHA256_DIGEST_SIZE];
            ml_sha256_init(&ctx);
            ml_sha256_update(&ctx, msg, a);
            ml_sha256_update(&ctx, msg + a, b - a);
            ml_sha256_update(&ctx, NULL, 0);
            ml_sha256_update(&ctx, msg + b, sizeof msg - b);
            ml_sha256_final(&ctx, got);
            mismatches += memcmp(got, want, sizeof want) != 0;
        }
    check(mismatches == 0, "streamed digests differ from one-shot in %d splits", mismatches);
}

/* ml_hex_digit over every byte, and back from ml_sha256_hex's spelling. */
static void test_hex_digits(void)
{
    const char *digits = "0123456789abcdef", *upper = "ABCDEF";
    int wrong = 0;
    for (int c = 0; c < 256; c++) {
        const char *at = c ? strchr(digits, c) : NULL;
        const char *up = c ? strchr(upper, c) : NULL;
        int want = at ? (int)(at - digits) : up ? 10 + (int)(up - upper) : -1;
        wrong += ml_hex_digit(c) != want;
    }
    check(wrong == 0, "ml_hex_digit wrong for %d bytes", wrong);
    uint8_t digest[ML_SHA256_DIGEST_SIZE], back[ML_SHA256_DIGEST_SIZE];
    char hex[ML_SHA256_HEX_SIZE];
    ml_sha256("abc", 3, digest);
    ml_sha256_hex(digest, hex);
    for (int i = 0; i < ML_SHA256_DIGEST_SIZE; i++)
        back[i] = (uint8_t)(ml_hex_digit(hex[2 * i]) << 4 | ml_hex_digit(hex[2 * i + 1]));
    check(!memcmp(back, digest, sizeof digest), "hex spelling does not read back");
}

int main(void)
{
    test_vectors();
    test_hex_digits();
    test_padding_boundaries();
    test_million_a_streamed();
    test_every_split();
    return check_done();
}
