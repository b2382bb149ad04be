/* The chat page's files (service/gateway/www/), compiled into the binary so
 * the gateway serves `/` with nothing to install beside it. The table is
 * generated at build time by service/CMakeLists.txt (gw_assets_table.c, one
 * byte array per file, its content type from the file's extension); editing a
 * file under www/ rebuilds it.
 * @locality: any thread; everything here is constant. */
#ifndef GW_ASSETS_H
#define GW_ASSETS_H

#include <stddef.h>

typedef struct gw_asset {
    const char *path;                /* static: "/index.html", "/chat.js", ... */
    const char *content_type;        /* static: "text/html; charset=utf-8", ... */
    const unsigned char *data;       /* static: the file's bytes (NUL after the last) */
    size_t len;                      /* bytes in data, without that NUL */
} gw_asset;

/* Every file of www/, in name order (generated). */
extern const gw_asset gw_assets[];
extern const size_t gw_n_assets;

/* The asset a request path names, or NULL. "/" is "/index.html". A query or
 * fragment ("?v=2", "#top") is ignored; the path is compared as it is, so
 * "/../x" or "/CHAT.JS" name nothing. Returns a borrowed, static entry. */
const gw_asset *gw_asset_find(const char *path);

#endif
