/* The gateway's image URL fetcher (service/gateway/gw_fetch.h):
 * - the URL policy: https only unless http is allowed, a host required,
 *   the allow-list's exact names and subdomain entries;
 * - the address policy on a table of IPv4 and IPv6 addresses: public
 *   unicast passes, loopback, private, link-local (the metadata service),
 *   CGNAT, multicast, reserved, documentation blocks and the IPv4-in-IPv6
 *   forms of those are refused; allow_private passes them all;
 * - fetches on a libevent loop from img_server.h's server: the image's
 *   bytes, a redirect followed, a 404, a redirect loop cut at the limit, a
 *   redirect to a host off the allow-list, a body over the byte limit by
 *   its Content-Length and by its bytes, the fetcher's memory budget, a
 *   server that never answers (the timeout), a cancelled fetch (no
 *   callback), and the fetcher destroyed with a fetch running;
 * - without allow_private, 127.0.0.1 and localhost (a name that resolves to
 *   loopback) are refused on the socket, before any byte is sent;
 * - https against `openssl s_server` with a certificate made for the test:
 *   fetched with it as gateway.image_fetch_ca_file, refused without.
 * The sanitizer build proves no leak on any of these paths. */
#include <arpa/inet.h>
#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gateway/gw_fetch.h"
#include "harness.h"
#include "img_server.h"
#include "proc_util.h"
#include "util.h"

#define IMAGE ML_SOURCE_DIR "/tests/golden/fixtures/images/ex_640x480.jpg"
#define TIMEOUT_MS 5000       /* a fetch that should end well before */
#define SLOW_TIMEOUT_MS 300   /* the fetch of /slow, which never ends by itself */
#define WAIT_MS 20000         /* the test's own bound on any one fetch */
#define SMALL_BUDGET 1024     /* max_held_bytes below one body's first allocation */
#define HTTPS_START_MS 10000

/* ---- the pure policy ---------------------------------------------------------------- */

static gw_fetch_policy policy(void)
{
    return (gw_fetch_policy){.hosts = "", .ca_file = "", .timeout_ms = TIMEOUT_MS,
                             .max_redirects = 3, .max_bytes = 1 << 20,
                             .max_held_bytes = 64 << 20};
}

static void expect_url(const gw_fetch_policy *p, const char *url, bool want, const char *frag)
{
    char why[256] = "";
    bool got = gw_fetch_url_allowed(p, url, why, sizeof why);
    check(got == want, "%s: %s (%s)", url, got ? "allowed" : "refused", why);
    if (!want && frag)
        check(strstr(why, frag) != NULL, "%s: the reason names '%s': %s", url, frag, why);
}

static void test_urls(void)
{
    gw_fetch_policy p = policy();
    expect_url(&p, "https://images.example.com/a.jpg", true, NULL);
    expect_url(&p, "HTTPS://images.example.com/a.jpg", true, NULL);
    expect_url(&p, "http://images.example.com/a.jpg", false, "https only");
    expect_url(&p, "ftp://images.example.com/a.jpg", false, "scheme ftp");
    expect_url(&p, "file:///etc/passwd", false, "host");
    expect_url(&p, "https://", false, "host");
    expect_url(&p, "not a url", false, "host");
    p.allow_http = true;
    expect_url(&p, "http://images.example.com/a.jpg", true, NULL);
    expect_url(&p, "gopher://images.example.com/", false, "https and http only");
    p.hosts = "cdn.example.org, .images.example.com";
    expect_url(&p, "https://cdn.example.org/a.png", true, NULL);
    expect_url(&p, "https://CDN.Example.ORG./a.png", true, NULL);
    expect_url(&p, "https://a.images.example.com/x", true, NULL);
    expect_url(&p, "https://images.example.com/x", false, "not on this gateway's list");
    expect_url(&p, "https://evilcdn.example.org/x", false, "not on this gateway's list");
    expect_url(&p, "https://cdn.example.org.evil.net/x", false, "not on this gateway's list");
    expect_url(&p, "https://user@cdn.example.org/a.png", true, NULL);
}

static bool allowed(const gw_fetch_policy *p, const char *addr)
{
    struct sockaddr_storage ss = {0};
    if (strchr(addr, ':')) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
        in6->sin6_family = AF_INET6;
        if (inet_pton(AF_INET6, addr, &in6->sin6_addr) != 1)
            pu_die(addr);
    } else {
        struct sockaddr_in *in = (struct sockaddr_in *)&ss;
        in->sin_family = AF_INET;
        if (inet_pton(AF_INET, addr, &in->sin_addr) != 1)
            pu_die(addr);
    }
    return gw_fetch_address_allowed(p, (struct sockaddr *)&ss);
}

static void test_addresses(void)
{
    static const char *const public_ones[] = {
        "8.8.8.8", "1.1.1.1", "172.32.0.1", "172.15.255.255", "100.128.0.1", "192.169.0.1",
        "223.255.255.254", "2606:4700:4700::1111", "2a00:1450:4001:80b::200e",
        "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1", "2001:200::1",
    };
    static const char *const refused[] = {
        "0.0.0.0", "10.1.2.3", "100.64.0.1", "100.127.255.255", "127.0.0.1", "127.255.0.9",
        "169.254.169.254", "172.16.0.1", "172.31.255.255", "192.0.0.8", "192.0.2.1",
        "192.88.99.1", "192.168.1.1", "198.18.0.1", "198.19.255.255", "198.51.100.7",
        "203.0.113.9", "224.0.0.1", "239.255.255.250", "240.0.0.1", "255.255.255.255",
        "::", "::1", "fe80::1", "fc00::1", "fd12:3456::1", "ff02::1", "fec0::1",
        "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::ffff:10.0.0.1", "::10.0.0.1",
        "64:ff9b::a00:1", "64:ff9b::7f00:1", "2002:a00:1::1", "2002:7f00:1::",
        "2001::1", "2001:1ff::1", "2001:db8::1", "3fff::1", "100::1",
    };
    gw_fetch_policy p = policy();
    for (size_t i = 0; i < sizeof public_ones / sizeof public_ones[0]; i++)
        check(allowed(&p, public_ones[i]), "%s is public", public_ones[i]);
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        check(!allowed(&p, refused[i]), "%s is refused", refused[i]);
    p.allow_private = true;
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        check(allowed(&p, refused[i]), "allow_private: %s passes", refused[i]);
    struct sockaddr unix_sa = {.sa_family = AF_UNIX};
    check(!gw_fetch_address_allowed(&p, &unix_sa), "neither IPv4 nor IPv6: refused");
}

/* ---- fetches ------------------------------------------------------------------------ */

typedef struct result {
    bool done;
    gw_fetch_status st;
    uint8_t *data;
    size_t len;
    char why[512];
} result;

static void on_done(void *arg, gw_fetch_status st, const uint8_t *data, size_t len,
                    const char *why)
{
    result *r = arg;
    r->done = true;
    r->st = st;
    r->len = len;
    r->data = st == GW_FETCH_OK ? malloc(len ? len : 1) : NULL;
    if (r->data)
        memcpy(r->data, data, len);
    snprintf(r->why, sizeof r->why, "%s", why);
}

static struct event_base *base;

/* Fetch url with a fetcher of policy p; the loop runs until the callback. */
static result fetch(const gw_fetch_policy *p, const char *url, int timeout_ms)
{
    result r = {0};
    gw_fetcher *f;
    char err[256];
    if (gw_fetcher_create(base, p, &f, err, sizeof err))
        pu_die(err);
    check(gw_fetch_start(f, url, timeout_ms, on_done, &r) != NULL, "%s started", url);
    check(!r.done, "%s: no callback from within gw_fetch_start", url);
    long long end = svc_now_ms() + WAIT_MS;
    while (!r.done && svc_now_ms() < end)
        event_base_loop(base, EVLOOP_ONCE);
    check(r.done, "%s ended within %d ms", url, WAIT_MS);
    gw_fetcher_destroy(f);
    return r;
}

static void expect(const gw_fetch_policy *p, const char *url, gw_fetch_status want,
                   const char *frag)
{
    result r = fetch(p, url, TIMEOUT_MS);
    check(r.st == want, "%s: %s, want %s (%s)", url, gw_fetch_status_name(r.st),
          gw_fetch_status_name(want), r.why);
    if (frag)
        check(strstr(r.why, frag) != NULL, "%s: the reason names '%s': %s", url, frag, r.why);
    free(r.data);
}

static void expect_image(const gw_fetch_policy *p, const char *url, const uint8_t *img,
                         size_t len)
{
    result r = fetch(p, url, TIMEOUT_MS);
    check(r.st == GW_FETCH_OK, "%s fetched: %s", url, r.why);
    check(r.len == len && r.data && !memcmp(r.data, img, len), "%s: the image's %zu bytes (%zu)",
          url, len, r.len);
    free(r.data);
}

static void test_fetches(const img_server *srv, const uint8_t *img, size_t len)
{
    gw_fetch_policy p = policy();
    p.allow_http = true;
    p.allow_private = true;
    char url[256];
#define URL(path) (snprintf(url, sizeof url, "http://127.0.0.1:%d%s", srv->port, path), url)
    expect_image(&p, URL("/img"), img, len);
    expect_image(&p, URL("/redirect"), img, len);
    expect(&p, URL("/missing"), GW_FETCH_FAILED, "HTTP 404");
    expect(&p, URL("/loop"), GW_FETCH_REFUSED, "more than 3 redirects");
    p.max_redirects = 0;
    expect(&p, URL("/redirect"), GW_FETCH_REFUSED, "more than 0 redirects");
    p.max_redirects = 3;
    p.hosts = "127.0.0.1";
    expect_image(&p, URL("/redirect"), img, len);
    expect(&p, URL("/to-localhost"), GW_FETCH_REFUSED, "not on this gateway's list");
    p.hosts = "";
    expect_image(&p, URL("/to-localhost"), img, len);
    expect(&p, URL("/big"), GW_FETCH_TOO_LARGE, "larger than");
    expect(&p, URL("/endless"), GW_FETCH_TOO_LARGE, "larger than 1048576 bytes");
    p.max_bytes = len - 1;
    expect(&p, URL("/img"), GW_FETCH_TOO_LARGE, NULL);
    p.max_bytes = 1 << 20;
    p.max_held_bytes = SMALL_BUDGET;
    expect(&p, URL("/img"), GW_FETCH_BUSY, "fetched image bytes");
    p.max_held_bytes = 64 << 20;
    result r = fetch(&p, URL("/slow"), SLOW_TIMEOUT_MS);
    check(r.st == GW_FETCH_FAILED && strstr(r.why, "no image within"),
          "/slow: the timeout: %s %s", gw_fetch_status_name(r.st), r.why);
    p.allow_http = false;
    expect(&p, URL("/img"), GW_FETCH_FAILED, NULL); /* libcurl's own protocol list refuses */

    /* The address check on the socket: nothing reaches the server. */
    p.allow_http = true;
    p.allow_private = false;
    int before = srv->served;
    expect(&p, URL("/img"), GW_FETCH_REFUSED, "not public");
    snprintf(url, sizeof url, "http://localhost:%d/img", srv->port);
    expect(&p, url, GW_FETCH_REFUSED, "not public");
    check(srv->served == before, "no request reached the server (%d)", srv->served - before);
#undef URL
}

/* A cancelled fetch never calls back; a fetcher destroyed with fetches
 * running frees them (the sanitizer build sees any leak). */
static void test_cancel(const img_server *srv)
{
    gw_fetch_policy p = policy();
    p.allow_http = p.allow_private = true;
    gw_fetcher *f;
    char err[256], url[128];
    if (gw_fetcher_create(base, &p, &f, err, sizeof err))
        pu_die(err);
    result a = {0}, b = {0};
    snprintf(url, sizeof url, "http://127.0.0.1:%d/slow", srv->port);
    gw_fetch *x = gw_fetch_start(f, url, TIMEOUT_MS, on_done, &a);
    check(gw_fetch_start(f, url, TIMEOUT_MS, on_done, &b) != NULL, "second started");
    for (int i = 0; i < 20; i++)
        event_base_loop(base, EVLOOP_NONBLOCK);
    gw_fetch_cancel(x);
    long long end = svc_now_ms() + 200;
    while (svc_now_ms() < end)
        event_base_loop(base, EVLOOP_NONBLOCK);
    check(!a.done && !b.done, "no callback after a cancel, none yet for the other");
    gw_fetcher_destroy(f);
    check(!b.done, "destroy calls nothing back");
}

static int connect_local(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* ---- https -------------------------------------------------------------------------- */

static void test_https(const uint8_t *img, size_t len)
{
    if (!pu_which("openssl")) {
        fprintf(stderr, "no openssl on PATH: https not tested\n");
        return;
    }
    char dir[] = "/tmp/ml_gw_fetch_XXXXXX";
    if (!mkdtemp(dir))
        pu_die("mkdtemp");
    char cmd[1024], path[256];
    snprintf(cmd, sizeof cmd,
             "cd %s && openssl req -x509 -newkey rsa:2048 -nodes -keyout key.pem -out cert.pem "
             "-days 2 -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1,DNS:localhost "
             ">/dev/null 2>&1", dir);
    check(system(cmd) == 0, "a test certificate");
    snprintf(path, sizeof path, "%s/img.jpg", dir);
    pu_write_file(path, img, len);
    int port = pu_free_port();
    pid_t pid = fork();
    if (pid == 0) {
        char accept[64];
        snprintf(accept, sizeof accept, "127.0.0.1:%d", port);
        if (chdir(dir) == 0)
            execlp("openssl", "openssl", "s_server", "-accept", accept, "-cert", "cert.pem",
                   "-key", "key.pem", "-WWW", "-quiet", (char *)NULL);
        _exit(127);
    }
    bool up = false;
    for (long long end = svc_now_ms() + HTTPS_START_MS; !up && svc_now_ms() < end;) {
        int fd = connect_local(port);
        up = fd >= 0;
        if (fd >= 0)
            close(fd);
        else
            usleep(50 * 1000);
    }
    check(up, "openssl s_server listening on %d", port);
    gw_fetch_policy p = policy();
    p.allow_private = true;
    char url[128], ca[256];
    snprintf(url, sizeof url, "https://127.0.0.1:%d/img.jpg", port);
    snprintf(ca, sizeof ca, "%s/cert.pem", dir);
    expect(&p, url, GW_FETCH_FAILED, "certificate");
    p.ca_file = ca;
    expect_image(&p, url, img, len);
    snprintf(url, sizeof url, "https://localhost:%d/img.jpg", port);
    expect_image(&p, url, img, len);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    check(system(cmd) == 0, "cleaned up");
}

int main(void)
{
    test_urls();
    test_addresses();
    size_t len;
    uint8_t *img = (uint8_t *)pu_slurp(IMAGE, &len);
    if (!img)
        pu_die(IMAGE);
    base = event_base_new();
    img_server srv;
    if (!img_server_start(&srv, img, len))
        pu_die("image server");
    test_fetches(&srv, img, len);
    test_cancel(&srv);
    test_https(img, len);
    img_server_stop(&srv);
    event_base_free(base);
    free(img);
    return check_done();
}
