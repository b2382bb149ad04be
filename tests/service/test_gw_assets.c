/* The chat page as compiled into the binary (service/gateway/gw_assets.h):
 * every file of service/gateway/www/ is in the table byte for byte with its
 * content type, "/" is the index, the files the index links resolve, and
 * paths that name no file (or try to leave the folder) resolve to nothing. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "gateway/gw_assets.h"

#define WWW ML_SOURCE_DIR "/service/gateway/www"

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Each file on disk is found under "/<name>" with the same bytes, a NUL after
 * them, and a content type for its extension. */
static void test_files_match_sources(void)
{
    DIR *d = opendir(WWW);
    check(d != NULL, "open %s", WWW);
    if (!d)
        return;
    size_t n_files = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue; /* ".", "..", and dot files the build leaves out */
        n_files++;
        char path[512], url[300];
        snprintf(path, sizeof path, "%s/%s", WWW, e->d_name);
        snprintf(url, sizeof url, "/%s", e->d_name);
        size_t len = 0;
        char *want = slurp(path, &len);
        const gw_asset *a = gw_asset_find(url);
        check(a != NULL, "%s resolves", url);
        if (a && want) {
            check(a->len == len && memcmp(a->data, want, len) == 0,
                  "%s: %zu bytes embedded, %zu on disk (rebuild after editing www/)", url,
                  a->len, len);
            check(a->data[a->len] == '\0', "%s: NUL after the bytes", url);
            check(!strcmp(a->path, url), "%s: path %s", url, a->path);
        }
        free(want);
    }
    closedir(d);
    check(n_files == gw_n_assets, "%zu files in www/, %zu in the table", n_files, gw_n_assets);
}

static void test_content_types(void)
{
    static const struct { const char *path, *type; } want[] = {
        {"/index.html", "text/html; charset=utf-8"},
        {"/chat.js", "text/javascript; charset=utf-8"},
        {"/chat.css", "text/css; charset=utf-8"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const gw_asset *a = gw_asset_find(want[i].path);
        check(a && !strcmp(a->content_type, want[i].type), "%s is %s, got %s", want[i].path,
              want[i].type, a ? a->content_type : "nothing");
    }
}

static void test_index(void)
{
    const gw_asset *index = gw_asset_find("/index.html");
    check(index != NULL, "/index.html resolves");
    check(gw_asset_find("/") == index, "/ is /index.html");
    check(gw_asset_find("/?q=1") == index, "/?q=1 is /index.html");
    check(gw_asset_find("/chat.js?v=2") == gw_asset_find("/chat.js"), "a query is ignored");
    check(gw_asset_find("/chat.css#top") == gw_asset_find("/chat.css"), "a fragment is ignored");
    if (!index)
        return;
    /* Every src="..." and href="..." of the index names an embedded file
     * (relative, so "x" is "/x"), but for data: URLs (the empty favicon). */
    const char *text = (const char *)index->data;
    size_t n_links = 0;
    static const char *const attrs[] = {"src=\"", "href=\""};
    for (size_t k = 0; k < sizeof attrs / sizeof attrs[0]; k++)
        for (const char *p = strstr(text, attrs[k]); p; p = strstr(p + 1, attrs[k])) {
            const char *v = p + strlen(attrs[k]);
            size_t len = strcspn(v, "\"");
            if (strncmp(v, "data:", 5) == 0)
                continue;
            char url[256];
            snprintf(url, sizeof url, "/%.*s", (int)len, v);
            check(gw_asset_find(url) != NULL, "the index links %s: it resolves", url);
            n_links++;
        }
    check(n_links >= 2, "the index links its script and style sheet (%zu links)", n_links);
}

static void test_unknown(void)
{
    static const char *const bad[] = {
        "",           "/nope",       "/index.htm",     "/index.html.bak", "index.html",
        "//index.html", "/../index.html", "/www/index.html", "/CHAT.JS",   "/chat.js/",
        "?/chat.js",  "/%63hat.js",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        check(gw_asset_find(bad[i]) == NULL, "\"%s\" resolves to nothing", bad[i]);
}

int main(void)
{
    test_files_match_sources();
    test_content_types();
    test_index();
    test_unknown();
    return check_done();
}
