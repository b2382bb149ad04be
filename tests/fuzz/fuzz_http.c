/* Fuzz target: the HTTP request router (svc_http_parse_request). Properties:
 *   the route is one of the enum's values;
 *   SVC_HTTP_HEADER_MAX bytes or more never route to SVC_HTTP_INCOMPLETE;
 *   once a prefix routes to something other than SVC_HTTP_INCOMPLETE, every
 *   longer prefix routes the same (the server answers as soon as it can and
 *   more bytes could not have changed the answer).
 * Each prefix is copied into a buffer of exactly its length, so ASan catches
 * a read past what has been received. Aborts when a property breaks. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

static void require(bool ok)
{
    if (!ok)
        abort();
}

static svc_http_route route_prefix(const uint8_t *data, size_t n)
{
    char *copy = malloc(n ? n : 1);
    require(copy != NULL);
    memcpy(copy, data, n);
    svc_http_route r = svc_http_parse_request(copy, n);
    free(copy);
    require(r >= SVC_HTTP_INCOMPLETE && r <= SVC_HTTP_NOT_FOUND);
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    svc_http_route full = route_prefix(data, size);
    require(size < SVC_HTTP_HEADER_MAX || full != SVC_HTTP_INCOMPLETE);
    bool routed = false;
    for (size_t n = 0; n <= size && n <= SVC_HTTP_HEADER_MAX; n++) {
        svc_http_route r = route_prefix(data, n);
        if (routed)
            require(r == full);
        else if (r != SVC_HTTP_INCOMPLETE)
            require((routed = true) && r == full);
    }
    return 0;
}
