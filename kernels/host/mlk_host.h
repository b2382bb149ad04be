/* What tests need of the HOST build (MLLAMA_CUDA=HOST, MLLAMA_CUDA_HOST
 * defined for every target that links mlk_cuda): the schedule order of the
 * emulated threads. Callable from C.
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

#ifdef __cplusplus
}
#endif

#endif
