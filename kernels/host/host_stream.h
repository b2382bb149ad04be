/* Streams of the HOST build: the one entry point the host cuBLASLt (and
 * every other asynchronous call) queues its work through. Defined by the
 * execution layer (host streams and graph capture); a unit test of a
 * client may define it to run the work at once. */
#ifndef MLK_HOST_STREAM_H
#define MLK_HOST_STREAM_H

#include <functional>

#include <driver_types.h>

/* Run `work` now, or, while s is capturing, record it to run at each launch
 * of the graph instantiated from the capture. `work` owns copies of what it
 * reads at execution, so recorded work replays what was captured. */
void mlk_host_stream_enqueue(cudaStream_t s, std::function<void()> work);

#endif
