/* Streams of the HOST build: every asynchronous operation (kernel launch,
 * memcpy/memset async, cuBLASLt matmul, NCCL all-reduce) goes through
 * mlk_host_stream_enqueue, which runs it at once, in the caller's thread,
 * or, while the stream is being captured, records it as a graph node that
 * runs at each cudaGraphLaunch. A stream therefore never has work pending:
 * synchronize only checks that it is legal (not during a capture).
 *
 * The work is a closure over copies of its arguments, taken at enqueue: a
 * replayed graph sees the values of capture time, as on a device.
 * @locality: any thread; one stream is used by one thread at a time (as the
 * backend does). */
#ifndef MLK_HOST_STREAM_H
#define MLK_HOST_STREAM_H

#include <functional>

#include <cuda_runtime_api.h>

/* Run or record `work` on `s`. node_kind identifies the operation for
 * cudaGraphExecUpdate's topology check (the kernel's address, or one of the
 * kinds below; NULL: other host work). An operation on a stream whose
 * capture has been invalidated is dropped and records
 * cudaErrorStreamCaptureInvalidated for cudaGetLastError. */
void mlk_host_stream_enqueue(cudaStream_t s, std::function<void()> work,
                             const void *node_kind = nullptr);

/* As mlk_host_stream_enqueue, returning the error instead of recording it
 * (for the runtime calls that return their own error). */
cudaError_t mlk_host_stream_submit(cudaStream_t s, std::function<void()> work,
                                   const void *node_kind);

/* cudaErrorStreamCaptureUnsupported when the calling thread has a capture
 * in progress whose mode forbids "potentially unsafe" calls (allocation,
 * device-wide synchronization, pageable copies): that capture is then
 * invalidated, as on a device. cudaSuccess otherwise. */
cudaError_t mlk_host_capture_forbids_unsafe(void);

/* 1 when `s` is being captured. */
int mlk_host_stream_capturing(cudaStream_t s);

/* Invalidate the capture of `s` (an illegal operation was attempted on it). */
void mlk_host_stream_invalidate(cudaStream_t s);

#endif
