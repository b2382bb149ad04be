/* The memory the process may hold resident on its host: the physical
 * memory, or less where the process's cgroup limits it (a container's
 * memory limit, a systemd unit's MemoryMax), past which the kernel's OOM
 * killer ends the process rather than any allocation failing. The CPU
 * backend's memory plan is made against it (engine.c).
 * @locality: any thread; reads /proc-like files, no state. */
#ifndef ML_HOST_MEMORY_H
#define ML_HOST_MEMORY_H

#include <stddef.h>
#include <stdint.h>

/* Where the bytes of ml_host_memory come from. */
typedef enum ml_host_memory_source {
    ML_HOST_MEMORY_UNKNOWN,  /* neither could be read: 0 bytes */
    ML_HOST_MEMORY_PHYSICAL, /* the host's physical memory */
    ML_HOST_MEMORY_CGROUP,   /* the cgroup's limit, below the physical memory */
} ml_host_memory_source;

/* min(physical memory, the cgroup's limit): cgroup v2's memory.max at
 * /sys/fs/cgroup (the process's own cgroup where the container has its
 * cgroup namespace, as Docker and Kubernetes give it on cgroup v2), else
 * cgroup v1's memory/memory.limit_in_bytes. *source (may be NULL) says
 * which bounds it. */
uint64_t ml_host_memory(ml_host_memory_source *source);

/* "physical memory", "cgroup limit", "unknown": for messages. */
const char *ml_host_memory_source_name(ml_host_memory_source source);

/* The limit a cgroup memory file holds (len bytes of text, not
 * NUL-terminated): a decimal byte count and an optional newline, or "max"
 * (v2: no limit). Returns 1 and sets *bytes for a count that fits 64 bits;
 * 0 for "max" and for anything else (sign, spaces, other characters,
 * overflow), which the caller reads as no limit. */
int ml_host_memory_parse_limit(const char *text, size_t len, uint64_t *bytes);

#endif
