/* The lookup over the generated table of the chat page's files (gw_assets.h).
 * @locality: any thread. */
#include "gateway/gw_assets.h"

#include <string.h>

static const char gw_index_path[] = "/index.html";

const gw_asset *gw_asset_find(const char *path)
{
    size_t len = strcspn(path, "?#");
    if (len == 1 && path[0] == '/') {
        path = gw_index_path;
        len = sizeof gw_index_path - 1;
    }
    for (size_t i = 0; i < gw_n_assets; i++)
        if (strlen(gw_assets[i].path) == len && memcmp(gw_assets[i].path, path, len) == 0)
            return &gw_assets[i];
    return NULL;
}
