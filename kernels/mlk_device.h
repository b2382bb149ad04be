/* CUDA device discovery, callable from C without CUDA headers.
 * @locality: any thread. */
#ifndef MLK_DEVICE_H
#define MLK_DEVICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mlk_device_info {
    char name[256];
    int major, minor;        /* compute capability */
    size_t total_bytes;      /* device memory */
    int multiprocessors;
} mlk_device_info;

/* Number of usable CUDA devices; 0 when there is no driver or no device (not
 * an error: the engine then falls back to the CPU backend). */
int mlk_device_count(void);

/* Fill *info for device `index`. Returns 0, or -1 with a message in err. */
int mlk_device_query(int index, mlk_device_info *info, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
