/* Image URLs fetched on the gateway's loop (gw_fetch.h): the policy's pure
 * checks, then libcurl's multi interface driven by libevent (a socket
 * callback that keeps one event per socket, a timer callback that keeps one
 * timer, and curl_multi_socket_action from both).
 * @locality: the gateway's thread. */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gateway/gw_fetch.h"
#include "util.h"

/* Connections to one host at once, all fetches together; more wait in
 * libcurl's queue (within their timeouts), so a flood of requests naming
 * one server does not become a flood against it from the gateway. */
#define HOST_CONNECTIONS 16
/* The first allocation of a body of unknown length; it doubles from there,
 * up to the policy's max_bytes. */
#define BODY_FIRST_BYTES (64 * 1024)
#define HTTP_OK 200

static const char *const status_names[GW_FETCH_N_STATUS] = {"ok", "refused", "failed",
                                                            "too_large", "busy"};

const char *gw_fetch_status_name(gw_fetch_status s)
{
    return s < GW_FETCH_N_STATUS ? status_names[s] : "unknown";
}

/* ---- the policy ------------------------------------------------------------------- */

/* Whether host is on the comma-separated list: an entry equal to it, or an
 * entry ".d" of which it is a subdomain. Case-insensitive, a trailing dot
 * of the host (the fully qualified form) ignored. */
static bool host_listed(const char *list, const char *host)
{
    size_t hlen = strlen(host);
    if (hlen > 0 && host[hlen - 1] == '.')
        hlen--;
    for (const char *e = list; *e;) {
        e += strspn(e, " ,");
        size_t n = strcspn(e, ",");
        while (n > 0 && e[n - 1] == ' ')
            n--;
        if (n > 0) {
            bool suffix = e[0] == '.';
            if (suffix ? hlen > n && !strncasecmp(host + hlen - n, e, n)
                       : hlen == n && !strncasecmp(host, e, n))
                return true;
        }
        e += strcspn(e, ",");
    }
    return false;
}

bool gw_fetch_url_allowed(const gw_fetch_policy *p, const char *url, char *why, size_t whylen)
{
    CURLU *u = curl_url();
    char *scheme = NULL, *host = NULL;
    bool ok = false;
    if (!u) {
        snprintf(why, whylen, "out of memory");
        return false;
    }
    if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK || !host[0])
        snprintf(why, whylen, "not a URL with a host");
    else if (strcmp(scheme, "https") && !(p->allow_http && !strcmp(scheme, "http")))
        snprintf(why, whylen, "scheme %s is not fetched (%s)", scheme,
                 p->allow_http ? "https and http only" : "https only");
    else if (p->hosts[0] && !host_listed(p->hosts, host))
        snprintf(why, whylen, "host %s is not on this gateway's list of image hosts", host);
    else
        ok = true;
    curl_free(scheme);
    curl_free(host);
    curl_url_cleanup(u);
    return ok;
}

/* IPv4 blocks that are not public unicast (RFC 6890's special-purpose
 * registry, the ones not globally reachable), host byte order. */
static const struct {
    uint32_t net, mask;
} v4_blocked[] = {
    {0x00000000u, 0xff000000u}, /* 0/8: this network */
    {0x0a000000u, 0xff000000u}, /* 10/8: private */
    {0x64400000u, 0xffc00000u}, /* 100.64/10: carrier-grade NAT */
    {0x7f000000u, 0xff000000u}, /* 127/8: loopback */
    {0xa9fe0000u, 0xffff0000u}, /* 169.254/16: link-local, the clouds' metadata services */
    {0xac100000u, 0xfff00000u}, /* 172.16/12: private */
    {0xc0000000u, 0xffffff00u}, /* 192.0.0/24: IETF protocol assignments */
    {0xc0000200u, 0xffffff00u}, /* 192.0.2/24: documentation */
    {0xc0586300u, 0xffffff00u}, /* 192.88.99/24: 6to4 relays */
    {0xc0a80000u, 0xffff0000u}, /* 192.168/16: private */
    {0xc6120000u, 0xfffe0000u}, /* 198.18/15: benchmarking */
    {0xc6336400u, 0xffffff00u}, /* 198.51.100/24: documentation */
    {0xcb007100u, 0xffffff00u}, /* 203.0.113/24: documentation */
    {0xe0000000u, 0xe0000000u}, /* 224/3: multicast, reserved, broadcast */
};

static bool v4_public(const uint8_t b[4])
{
    uint32_t a = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
    for (size_t i = 0; i < sizeof v4_blocked / sizeof v4_blocked[0]; i++)
        if ((a & v4_blocked[i].mask) == v4_blocked[i].net)
            return false;
    return true;
}

/* Public IPv6 unicast is 2000::/3 less its special blocks; an address that
 * carries an IPv4 one (mapped, NAT64, 6to4) is as public as that one,
 * since that is where the packets go. */
static bool v6_public(const uint8_t b[16])
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    static const uint8_t nat64[12] = {0, 0x64, 0xff, 0x9b};
    if (!memcmp(b, mapped, sizeof mapped) || !memcmp(b, nat64, sizeof nat64))
        return v4_public(b + 12);
    if (b[0] == 0x20 && b[1] == 0x02) /* 2002::/16: 6to4 */
        return v4_public(b + 2);
    if ((b[0] & 0xe0) != 0x20)
        return false; /* loopback, unspecified, ULA fc00::/7, link-local, multicast, ... */
    if (b[0] == 0x20 && b[1] == 0x01 && b[2] < 0x02)
        return false; /* 2001::/23: IETF protocol assignments, Teredo among them */
    if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0d && b[3] == 0xb8)
        return false; /* 2001:db8::/32: documentation */
    if (b[0] == 0x3f && b[1] == 0xff && b[2] < 0x10)
        return false; /* 3fff::/20: documentation */
    return true;
}

bool gw_fetch_address_allowed(const gw_fetch_policy *p, const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        return p->allow_private || v4_public((const uint8_t *)&in->sin_addr.s_addr);
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        return p->allow_private || v6_public(in6->sin6_addr.s6_addr);
    }
    return false;
}

/* ---- fetches ---------------------------------------------------------------------- */

struct gw_fetcher {
    struct event_base *base; /* borrowed */
    CURLM *multi;            /* owned */
    struct event *timer;     /* owned: libcurl's one timeout */
    gw_fetch_policy p;       /* strings borrowed */
    gw_fetch *running;       /* owned list */
    size_t held;             /* the bodies' allocations and gw_fetcher_hold's bytes */
};

struct gw_fetch {
    gw_fetcher *f;
    CURL *easy;              /* owned */
    gw_fetch_done done;
    void *arg;
    uint8_t *data;           /* owned: the body so far */
    size_t len, cap;
    long long deadline_ms;   /* svc_now_ms by which the last hop must end */
    int redirects;
    bool too_large;          /* the body passed max_bytes: cut off */
    bool busy;               /* the fetcher's max_held_bytes would have been passed: cut off */
    bool not_ok;             /* a status other than 200: its body was not read */
    bool address_refused;    /* the policy refused an address libcurl was to connect */
    char errbuf[CURL_ERROR_SIZE];
    gw_fetch *prev, *next;
};

static void unlink_fetch(gw_fetch *x)
{
    if (x->prev)
        x->prev->next = x->next;
    else
        x->f->running = x->next;
    if (x->next)
        x->next->prev = x->prev;
}

static void free_body(gw_fetch *x)
{
    x->f->held -= x->cap;
    free(x->data);
}

static void free_fetch(gw_fetch *x)
{
    curl_multi_remove_handle(x->f->multi, x->easy);
    curl_easy_cleanup(x->easy);
    unlink_fetch(x);
    free_body(x);
    free(x);
}

void gw_fetcher_hold(gw_fetcher *f, long long delta)
{
    f->held += (size_t)delta;
}

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *arg)
{
    gw_fetch *x = arg;
    size_t n = size * nmemb;
    long status = 0;
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status != HTTP_OK) {
        x->not_ok = true;
        return 0; /* an error page or a redirect's body is not wanted: stop here */
    }
    size_t max = x->f->p.max_bytes;
    if (n > max - x->len) {
        x->too_large = true;
        return 0;
    }
    if (x->len + n > x->cap) {
        size_t cap = x->cap ? 2 * x->cap : BODY_FIRST_BYTES;
        if (cap < x->len + n)
            cap = x->len + n;
        if (cap > max)
            cap = max;
        size_t budget = x->f->p.max_held_bytes;
        if (x->f->held > budget || cap - x->cap > budget - x->f->held) {
            x->busy = true;
            return 0;
        }
        uint8_t *d = realloc(x->data, cap);
        if (!d) {
            x->busy = true;
            return 0;
        }
        x->f->held += cap - x->cap;
        x->data = d;
        x->cap = cap;
    }
    memcpy(x->data + x->len, ptr, n);
    x->len += n;
    return n;
}

/* libcurl's socket for each address it tries: refused unless the policy
 * allows the address (the check that sees through names and redirects). */
static curl_socket_t on_open_socket(void *arg, curlsocktype purpose, struct curl_sockaddr *a)
{
    gw_fetch *x = arg;
    (void)purpose;
    if (!gw_fetch_address_allowed(&x->f->p, &a->addr)) {
        x->address_refused = true;
        return CURL_SOCKET_BAD;
    }
    return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

/* (Re)start x's easy handle on url with what is left of its deadline. */
static bool start_hop(gw_fetch *x, const char *url)
{
    long long left = x->deadline_ms - svc_now_ms();
    x->len = 0;
    x->not_ok = x->too_large = x->busy = x->address_refused = false;
    x->errbuf[0] = 0;
    return left > 0 && curl_easy_setopt(x->easy, CURLOPT_URL, url) == CURLE_OK &&
           curl_easy_setopt(x->easy, CURLOPT_TIMEOUT_MS, (long)left) == CURLE_OK &&
           curl_multi_add_handle(x->f->multi, x->easy) == CURLM_OK;
}

static bool is_redirect(long status)
{
    return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

/* A hop ended with rc: follow a redirect the policy allows (a new hop,
 * false), or decide the fetch's status and reason (true). */
static bool hop_ended(gw_fetch *x, CURLcode rc, gw_fetch_status *st, char *why, size_t n)
{
    const gw_fetch_policy *p = &x->f->p;
    long status = 0;
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &status);
    bool answered = rc == CURLE_OK || x->not_ok;
    *st = GW_FETCH_FAILED;
    if (x->busy) {
        *st = GW_FETCH_BUSY;
        snprintf(why, n, "the gateway holds as many fetched image bytes as it may");
    } else if (x->too_large || rc == CURLE_FILESIZE_EXCEEDED) {
        *st = GW_FETCH_TOO_LARGE;
        snprintf(why, n, "the image is larger than %zu bytes", p->max_bytes);
    } else if (x->address_refused && !answered) {
        *st = GW_FETCH_REFUSED;
        snprintf(why, n, "its host resolves to an address that is not public (loopback, "
                         "private, link-local or reserved): not fetched");
    } else if (answered && is_redirect(status)) {
        char *loc = NULL;
        curl_easy_getinfo(x->easy, CURLINFO_REDIRECT_URL, &loc);
        char reason[256];
        if (!loc) {
            snprintf(why, n, "HTTP %ld without a Location", status);
        } else if (++x->redirects > p->max_redirects) {
            *st = GW_FETCH_REFUSED;
            snprintf(why, n, "more than %d redirects", p->max_redirects);
        } else if (!gw_fetch_url_allowed(p, loc, reason, sizeof reason)) {
            *st = GW_FETCH_REFUSED;
            snprintf(why, n, "redirected to a URL that is not fetched: %s", reason);
        } else {
            char *next = strdup(loc); /* loc is the handle's, reset by the next hop */
            curl_multi_remove_handle(x->f->multi, x->easy);
            bool started = next && start_hop(x, next);
            free(next);
            if (started)
                return false;
            snprintf(why, n, "no image within %d ms", p->timeout_ms);
        }
    } else if (answered && status != HTTP_OK) {
        snprintf(why, n, "the server answered HTTP %ld", status);
    } else if (rc == CURLE_OK) {
        *st = GW_FETCH_OK;
        why[0] = 0;
    } else if (rc == CURLE_OPERATION_TIMEDOUT) {
        snprintf(why, n, "no image within %d ms", p->timeout_ms);
    } else {
        snprintf(why, n, "%s", x->errbuf[0] ? x->errbuf : curl_easy_strerror(rc));
    }
    return true;
}

/* Every transfer libcurl says is done: its next hop, or its callback. */
static void drain_done(gw_fetcher *f)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(f->multi, &left))) {
        if (m->msg != CURLMSG_DONE)
            continue;
        gw_fetch *x = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
        CURLcode rc = m->data.result;
        gw_fetch_status st;
        char why[512];
        if (!hop_ended(x, rc, &st, why, sizeof why))
            continue;
        /* Off the list first: done may cancel the fetches it started beside x. */
        curl_multi_remove_handle(f->multi, x->easy);
        unlink_fetch(x);
        x->done(x->arg, st, x->data, x->len, why);
        curl_easy_cleanup(x->easy);
        free_body(x);
        free(x);
    }
}

static void on_socket_event(evutil_socket_t fd, short what, void *arg)
{
    gw_fetcher *f = arg;
    int flags = (what & EV_READ ? CURL_CSELECT_IN : 0) | (what & EV_WRITE ? CURL_CSELECT_OUT : 0);
    int running;
    curl_multi_socket_action(f->multi, fd, flags, &running);
    drain_done(f);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    gw_fetcher *f = arg;
    int running;
    curl_multi_socket_action(f->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    drain_done(f);
}

/* libcurl wants socket s watched for `what`: one persistent event per
 * socket, kept as the socket's libcurl-assigned pointer. */
static int on_curl_socket(CURL *easy, curl_socket_t s, int what, void *arg, void *sockp)
{
    (void)easy;
    gw_fetcher *f = arg;
    struct event *ev = sockp;
    if (what == CURL_POLL_REMOVE) {
        if (ev) {
            event_free(ev);
            curl_multi_assign(f->multi, s, NULL);
        }
        return 0;
    }
    short kind = (short)((what & CURL_POLL_IN ? EV_READ : 0) |
                         (what & CURL_POLL_OUT ? EV_WRITE : 0) | EV_PERSIST);
    if (ev) {
        event_del(ev);
        event_assign(ev, f->base, s, kind, on_socket_event, f);
    } else {
        ev = event_new(f->base, s, kind, on_socket_event, f);
        if (!ev || curl_multi_assign(f->multi, s, ev) != CURLM_OK) {
            if (ev)
                event_free(ev);
            return -1;
        }
    }
    return event_add(ev, NULL);
}

/* libcurl's one timeout: -1 none, else in timeout_ms (0: at the loop's
 * next turn; curl_multi_socket_action must not be called from here). */
static int on_curl_timer(CURLM *multi, long timeout_ms, void *arg)
{
    (void)multi;
    gw_fetcher *f = arg;
    if (timeout_ms < 0)
        return event_del(f->timer);
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    return evtimer_add(f->timer, &tv);
}

int gw_fetcher_create(struct event_base *base, const gw_fetch_policy *p, gw_fetcher **out,
                      char *err, size_t errlen)
{
    *out = NULL;
    /* Thread-safe since libcurl 7.84 (Debian 12 has 7.88), reference-counted. */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        snprintf(err, errlen, "libcurl did not initialize");
        return -1;
    }
    gw_fetcher *f = calloc(1, sizeof *f);
    if (f) {
        f->base = base;
        f->p = *p;
        f->multi = curl_multi_init();
        f->timer = evtimer_new(base, on_timer, f);
    }
    if (!f || !f->multi || !f->timer ||
        curl_multi_setopt(f->multi, CURLMOPT_SOCKETFUNCTION, on_curl_socket) != CURLM_OK ||
        curl_multi_setopt(f->multi, CURLMOPT_SOCKETDATA, f) != CURLM_OK ||
        curl_multi_setopt(f->multi, CURLMOPT_TIMERFUNCTION, on_curl_timer) != CURLM_OK ||
        curl_multi_setopt(f->multi, CURLMOPT_TIMERDATA, f) != CURLM_OK ||
        curl_multi_setopt(f->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)HOST_CONNECTIONS) !=
            CURLM_OK) {
        if (f)
            gw_fetcher_destroy(f);
        else
            curl_global_cleanup();
        snprintf(err, errlen, "out of memory for the image fetcher");
        return -1;
    }
    *out = f;
    return 0;
}

const gw_fetch_policy *gw_fetcher_policy(const gw_fetcher *f)
{
    return &f->p;
}

void gw_fetcher_destroy(gw_fetcher *f)
{
    if (!f)
        return;
    while (f->running)
        free_fetch(f->running);
    if (f->multi)
        curl_multi_cleanup(f->multi); /* closes the cached connections, their events too */
    if (f->timer)
        event_free(f->timer);
    free(f);
    curl_global_cleanup();
}

gw_fetch *gw_fetch_start(gw_fetcher *f, const char *url, int timeout_ms, gw_fetch_done done,
                         void *arg)
{
    const gw_fetch_policy *p = &f->p;
    gw_fetch *x = calloc(1, sizeof *x);
    if (!x)
        return NULL;
    x->f = f;
    x->done = done;
    x->arg = arg;
    x->deadline_ms = svc_now_ms() + (timeout_ms < p->timeout_ms ? timeout_ms : p->timeout_ms);
    x->easy = curl_easy_init();
    CURL *e = x->easy;
    bool ok = e &&
        curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)x) == CURLE_OK &&
        curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->errbuf) == CURLE_OK &&
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write) == CURLE_OK &&
        curl_easy_setopt(e, CURLOPT_WRITEDATA, x) == CURLE_OK &&
        curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, on_open_socket) == CURLE_OK &&
        curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, x) == CURLE_OK &&
        curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, p->allow_http ? "http,https" : "https") ==
            CURLE_OK &&
        curl_easy_setopt(e, CURLOPT_PROXY, "") == CURLE_OK &&
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L) == CURLE_OK &&
        curl_easy_setopt(e, CURLOPT_USERAGENT, "mllama-gateway") == CURLE_OK &&
        curl_easy_setopt(e, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)p->max_bytes) == CURLE_OK &&
        (!p->ca_file[0] || curl_easy_setopt(e, CURLOPT_CAINFO, p->ca_file) == CURLE_OK);
    if (!ok) {
        if (e)
            curl_easy_cleanup(e);
        free(x);
        return NULL;
    }
    x->next = f->running;
    if (f->running)
        f->running->prev = x;
    f->running = x;
    if (!start_hop(x, url)) {
        free_fetch(x);
        return NULL;
    }
    return x;
}

void gw_fetch_cancel(gw_fetch *x)
{
    free_fetch(x);
}
