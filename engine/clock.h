/* The engine's clock for durations and deadlines measured in one process.
 * @locality any thread. */
#ifndef ML_CLOCK_H
#define ML_CLOCK_H

#include <time.h>

/* Monotonic milliseconds, with sub-millisecond precision (timings). */
static inline double ml_clock_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

#endif
