#include "host_memory.h"

#include <stdio.h>
#include <unistd.h>

/* The cgroup files, v2 first (memory.max holds "max" or bytes), then v1
 * (memory.limit_in_bytes holds bytes; no limit is a page-rounded
 * LONG_MAX, which the physical memory then bounds). */
static const char *const LIMIT_FILES[] = {
    "/sys/fs/cgroup/memory.max",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
};
/* A limit's text: 20 digits and a newline at most. */
#define LIMIT_TEXT_MAX 32

int ml_host_memory_parse_limit(const char *text, size_t len, uint64_t *bytes)
{
    if (len > 0 && text[len - 1] == '\n')
        len--;
    if (len == 0)
        return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        const unsigned d = (unsigned)(text[i] - '0');
        if (d > 9 || v > (UINT64_MAX - d) / 10)
            return 0; /* "max", anything not a digit, or past 64 bits */
        v = v * 10 + d;
    }
    *bytes = v;
    return 1;
}

/* The limit in the first of LIMIT_FILES that holds one; 0 if none. */
static uint64_t cgroup_limit(void)
{
    for (size_t f = 0; f < sizeof LIMIT_FILES / sizeof LIMIT_FILES[0]; f++) {
        FILE *fp = fopen(LIMIT_FILES[f], "r");
        if (!fp)
            continue;
        char text[LIMIT_TEXT_MAX];
        const size_t n = fread(text, 1, sizeof text, fp);
        fclose(fp);
        uint64_t bytes;
        if (ml_host_memory_parse_limit(text, n, &bytes))
            return bytes;
    }
    return 0;
}

uint64_t ml_host_memory(ml_host_memory_source *source)
{
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const uint64_t physical = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    const uint64_t limit = cgroup_limit();
    ml_host_memory_source src = physical ? ML_HOST_MEMORY_PHYSICAL : ML_HOST_MEMORY_UNKNOWN;
    uint64_t bytes = physical;
    if (limit > 0 && (physical == 0 || limit < physical)) {
        src = ML_HOST_MEMORY_CGROUP;
        bytes = limit;
    }
    if (source)
        *source = src;
    return bytes;
}

const char *ml_host_memory_source_name(ml_host_memory_source source)
{
    switch (source) {
    case ML_HOST_MEMORY_PHYSICAL: return "physical memory";
    case ML_HOST_MEMORY_CGROUP: return "cgroup limit";
    case ML_HOST_MEMORY_UNKNOWN: break;
    }
    return "unknown";
}
