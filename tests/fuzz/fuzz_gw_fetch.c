/* Fuzz target: bytes -> the image fetcher's policy checks
 * (service/gateway/gw_fetch.c). The input is "<hosts list>\n<url>", its
 * first byte's low bit allowing http; its first 16 bytes are also an IPv6
 * address and its first 4 an IPv4 one. Properties, aborting when one breaks:
 *   a URL allowed  =>  its scheme is https, or http when allowed;
 *   a URL allowed with a hosts list  =>  allowed with none (a list narrows);
 *   an IPv6 address passed  =>  in 2000::/3, or carrying an IPv4 address
 *                                (mapped, NAT64);
 *   ::ffff:a.b.c.d  =>  the same answer as a.b.c.d;
 *   with allow_private every IPv4 and IPv6 address passes. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gateway/gw_fetch.h"

#define TEXT_MAX 4096

static void require(bool ok)
{
    if (!ok)
        abort();
}

static bool v4(const gw_fetch_policy *p, const uint8_t b[4])
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    memcpy(&a.sin_addr, b, 4);
    return gw_fetch_address_allowed(p, (struct sockaddr *)&a);
}

static bool v6(const gw_fetch_policy *p, const uint8_t b[16])
{
    struct sockaddr_in6 a = {.sin6_family = AF_INET6};
    memcpy(&a.sin6_addr, b, 16);
    return gw_fetch_address_allowed(p, (struct sockaddr *)&a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char text[TEXT_MAX + 1];
    size_t n = size < TEXT_MAX ? size : TEXT_MAX;
    memcpy(text, data, n);
    text[n] = 0;
    char *nl = strchr(text, '\n');
    const char *hosts = nl ? text : "", *url = nl ? nl + 1 : text;
    if (nl)
        *nl = 0;
    gw_fetch_policy p = {.allow_http = n > 0 && (data[0] & 1), .hosts = hosts, .ca_file = ""};
    char why[256];
    if (gw_fetch_url_allowed(&p, url, why, sizeof why)) {
        require(!strncasecmp(url, "https:", 6) || (p.allow_http && !strncasecmp(url, "http:", 5)));
        gw_fetch_policy any = p;
        any.hosts = "";
        require(gw_fetch_url_allowed(&any, url, why, sizeof why));
    } else {
        require(why[0] != 0);
    }

    uint8_t b[16] = {0};
    memcpy(b, data, size < sizeof b ? size : sizeof b);
    gw_fetch_policy strict = {.hosts = "", .ca_file = ""}, open = strict;
    open.allow_private = true;
    static const uint8_t nat64[12] = {0, 0x64, 0xff, 0x9b};
    static const uint8_t mapped_prefix[12] = {[10] = 0xff, [11] = 0xff};
    bool carries_v4 = !memcmp(b, nat64, sizeof nat64) || !memcmp(b, mapped_prefix, 12);
    if (v6(&strict, b))
        require((b[0] & 0xe0) == 0x20 || carries_v4);
    uint8_t mapped[16] = {[10] = 0xff, [11] = 0xff};
    memcpy(mapped + 12, b, 4);
    require(v6(&strict, mapped) == v4(&strict, b));
    require(v4(&open, b) && v6(&open, b));
    return 0;
}
