#include "checkpoint/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

ml_status ml_mapped_file_init(ml_mapped_file *mf, const char *path, size_t max_size, char *err,
                              size_t errlen)
{
    mf->data = NULL;
    mf->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return ml_fail(err, errlen, e == ENOENT ? ML_ERR_NOT_FOUND : ML_ERR_IO, "%s: %s", path,
                       strerror(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return ml_fail(err, errlen, ML_ERR_IO, "%s: fstat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return ml_fail(err, errlen, ML_ERR_IO, "%s: not a regular file", path);
    }
    if (max_size > 0 && (unsigned long long)sb.st_size > max_size) {
        close(fd);
        return ml_fail(err, errlen, ML_ERR_TOO_LARGE, "%s: %lld bytes exceeds the limit of %zu",
                       path, (long long)sb.st_size, max_size);
    }
    if (sb.st_size == 0) {
        close(fd);
        return ML_OK;
    }
    if ((unsigned long long)sb.st_size > SIZE_MAX) {
        close(fd);
        return ml_fail(err, errlen, ML_ERR_TOO_LARGE, "%s: does not fit the address space", path);
    }
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    /* The mapping keeps its own reference to the file. */
    close(fd);
    if (p == MAP_FAILED)
        return ml_fail(err, errlen, ML_ERR_IO, "%s: mmap: %s", path, strerror(e));
    mf->data = p;
    mf->size = (size_t)sb.st_size;
    return ML_OK;
}

void ml_mapped_file_deinit(ml_mapped_file *mf)
{
    if (mf->data)
        munmap((void *)mf->data, mf->size);
    mf->data = NULL;
    mf->size = 0;
}

void ml_pages_release(const void *p, size_t bytes)
{
    const long page = sysconf(_SC_PAGESIZE);
    if (!p || page <= 0)
        return;
    const uintptr_t lo = ((uintptr_t)p + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    const uintptr_t hi = ((uintptr_t)p + bytes) / (uintptr_t)page * (uintptr_t)page;
    /* Advice only: a failure leaves the pages resident, nothing else. */
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}
