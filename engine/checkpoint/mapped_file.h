/* A whole file mapped read-only into memory: the one way the engine reads
 * files (config.json, safetensors shards, the shard index).
 *
 * The mapping is MAP_PRIVATE and PROT_READ: pages are read lazily from the
 * page cache, so a 5 GB shard costs address space, not memory, until a
 * tensor is touched. An empty file maps to data == NULL, size == 0. */
#ifndef ML_CHECKPOINT_MAPPED_FILE_H
#define ML_CHECKPOINT_MAPPED_FILE_H

#include <stddef.h>

#include "status.h"

typedef struct ml_mapped_file {
    const unsigned char *data; /* owned mapping; NULL when size == 0 */
    size_t size;
} ml_mapped_file;

/* Map the regular file at path. max_size > 0 rejects larger files with
 * ML_ERR_TOO_LARGE before mapping. Errors: ML_ERR_NOT_FOUND (no such file),
 * ML_ERR_IO (open/fstat/mmap failed, or not a regular file); the message
 * starts with the path. On error *mf is zeroed, so ml_mapped_file_deinit is
 * always safe. */
ml_status ml_mapped_file_init(ml_mapped_file *mf, const char *path, size_t max_size, char *err,
                              size_t errlen);

/* Unmap; mf is zeroed. Accepts a zeroed or already deinitialised struct. */
void ml_mapped_file_deinit(ml_mapped_file *mf);

/* Give the whole pages inside [p, p + bytes) back to the system
 * (MADV_DONTNEED): for bytes the process will not read again, such as a
 * tensor a backend has copied. In a file mapping they stop counting in
 * the process's memory and a later read would fault them in from the
 * file again; in anonymous memory (a converted copy) it would read zeros,
 * so only for bytes never read again. Partial pages at either end are
 * kept: they may hold a neighbour's bytes. */
void ml_pages_release(const void *p, size_t bytes);

#endif
