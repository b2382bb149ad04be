/* Images a chat request names by http(s) URL, fetched by the gateway so
 * that workers only ever see data: URLs (a worker's partition never waits
 * on someone else's web server). libcurl's multi interface runs on the
 * gateway's libevent loop: no thread per fetch, no lock, and a client that
 * leaves cancels its fetches.
 *
 * The URL is a client's, so the fetch is an SSRF vector: the policy
 * (gw_fetch_policy) refuses any scheme but https (http on request), any
 * host outside the allow-list when one is set, and, unless allowed, any
 * connection to an address that is not public unicast (loopback, private,
 * link-local with the cloud metadata services, CGNAT, multicast, reserved,
 * and their IPv4-in-IPv6 forms). The address is checked on the socket
 * libcurl is about to connect (CURLOPT_OPENSOCKETFUNCTION), after name
 * resolution, so a name that resolves to a private address is refused as
 * surely as an IP literal, and a second resolution cannot change the answer
 * (DNS rebinding). Redirects are followed here, not by libcurl, so that each
 * target passes the same URL check. No proxy (the environment's is
 * ignored: the address check has to see the server's own address), no
 * content decoding (the byte limit is the bytes held), bodies over the
 * limit are cut off while they arrive.
 * @locality: the gateway's thread (the pure checks: any thread). */
#ifndef GW_FETCH_H
#define GW_FETCH_H

#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

typedef struct gw_fetch_policy {
    bool allow_http;         /* http:// too (https:// always) */
    bool allow_private;      /* any address: only where the network holds nothing to protect */
    const char *hosts;       /* "": any host; else "a.example,.b.example": exact names, or
                                with a leading dot the subdomains of one; borrowed */
    const char *ca_file;     /* "": the system's trust store; borrowed */
    int timeout_ms;          /* one fetch, its redirects included */
    int max_redirects;
    size_t max_bytes;        /* one image's bytes */
    size_t max_held_bytes;   /* every body as it arrives, and what gw_fetcher_hold counts */
} gw_fetch_policy;

typedef enum gw_fetch_status {
    GW_FETCH_OK,
    GW_FETCH_REFUSED,   /* the policy: scheme, host, address, too many redirects */
    GW_FETCH_FAILED,    /* the network, TLS, a status other than 200, the timeout */
    GW_FETCH_TOO_LARGE, /* more than max_bytes */
    GW_FETCH_BUSY,      /* the fetcher's memory (max_held_bytes) is full */
    GW_FETCH_N_STATUS
} gw_fetch_status;

/* The lower-case name of a status, for logs and metric labels. */
const char *gw_fetch_status_name(gw_fetch_status s);

/* Whether url is one gw_fetch_start would start: http(s) as the policy
 * allows, a host, the host on the allow-list. Else false with why. */
bool gw_fetch_url_allowed(const gw_fetch_policy *p, const char *url, char *why, size_t whylen);

/* Whether the policy lets a connection go to sa (AF_INET or AF_INET6):
 * with allow_private any address, else public unicast only. */
bool gw_fetch_address_allowed(const gw_fetch_policy *p, const struct sockaddr *sa);

typedef struct gw_fetcher gw_fetcher;
typedef struct gw_fetch gw_fetch;

/* A fetch's end, on the loop, never from within gw_fetch_start or
 * gw_fetch_cancel: data (len bytes) when GW_FETCH_OK, valid during the call
 * only; why, a sentence naming the cause otherwise. The fetch is freed
 * after the call returns. */
typedef void (*gw_fetch_done)(void *arg, gw_fetch_status st, const uint8_t *data, size_t len,
                              const char *why);

/* A fetcher on base with a copy of the policy's numbers (its strings stay
 * borrowed: the gateway's configuration outlives it). Returns 0, or -1 with
 * err. */
int gw_fetcher_create(struct event_base *base, const gw_fetch_policy *p, gw_fetcher **out,
                      char *err, size_t errlen);
/* The policy it fetches under. */
const gw_fetch_policy *gw_fetcher_policy(const gw_fetcher *f);
/* Cancel whatever runs (no callbacks) and free. NULL is a no-op. */
void gw_fetcher_destroy(gw_fetcher *f);

/* Count delta bytes (negative: release) as held beside the bodies, under
 * the same max_held_bytes: what the caller keeps of fetched images. */
void gw_fetcher_hold(gw_fetcher *f, long long delta);

/* Fetch url (which passed gw_fetch_url_allowed) within timeout_ms (> 0),
 * at most the policy's: done(arg, ...) later. NULL when out of memory. */
gw_fetch *gw_fetch_start(gw_fetcher *f, const char *url, int timeout_ms, gw_fetch_done done,
                         void *arg);
/* Stop a fetch whose callback has not run; it never will. */
void gw_fetch_cancel(gw_fetch *x);

#endif
