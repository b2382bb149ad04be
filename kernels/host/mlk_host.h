/* What tests need of the HOST build (MLLAMA_CUDA=HOST, MLLAMA_CUDA_HOST
 * defined for every target that links mlk_cuda): the schedule order of the
 * emulated threads, and digests of what comes back from the device to
 * compare runs under different orders. Callable from C.
 * @locality: any thread; takes effect at the next grid launched. */
#ifndef MLK_HOST_H
#define MLK_HOST_H

#ifdef __cplusplus
extern "C" {
#endif

/* Within each barrier phase of a block, the threads that may run do so in
 * thread-index order, the reverse, or a shuffle drawn from the seed; the
 * blocks of a grid run in the same order. The default is read once from the
 * environment: MLK_HOST_SCHEDULE=forward|reverse|shuffle[:seed] (forward when
 * unset). */
enum {
    MLK_HOST_SCHEDULE_FORWARD = 0,
    MLK_HOST_SCHEDULE_REVERSE = 1,
    MLK_HOST_SCHEDULE_SHUFFLE = 2
};
void mlk_host_schedule_set(int order, unsigned long long seed);

/* From now on every device-to-host copy, when it executes, writes one
 * mlk_host_digest record to fd (a pipe to a process comparing runs under
 * different schedule orders); fd < 0 stops. Whole records, in copy order. */
typedef struct mlk_host_digest {
    unsigned long long index; /* device-to-host copies before this one */
    unsigned long long bytes;
    unsigned long long hash;  /* FNV-1a 64 of the bytes */
} mlk_host_digest;
void mlk_host_digest_downloads(int fd);

#ifdef __cplusplus
}
#endif

#endif
