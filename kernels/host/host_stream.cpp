/* Streams, stream capture and graphs of the HOST build (contract in
 * host_stream.h). A graph is the list of the closures enqueued during its
 * capture, each tagged with its kind; an executable graph is a copy of that
 * list, run in order at each launch. */
#include "host_stream.h"

#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "host_exec.h"

namespace {

struct graph_node {
    const void *kind;
    std::function<void()> work;
};

} /* namespace */

struct CUgraph_st {
    std::vector<graph_node> nodes;
};

struct CUgraphExec_st {
    std::vector<graph_node> nodes;
};

struct CUstream_st {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::thread::id capture_thread;
    CUgraph_st *graph = nullptr; /* owned while capturing */
};

namespace {

/* Captures begun by this thread in a mode that forbids unsafe calls here
 * (global and thread-local; relaxed forbids nothing). */
thread_local std::vector<cudaStream_t> tl_captures;
/* Global-mode captures of any thread (they forbid unsafe calls everywhere). */
std::mutex g_mu;
std::vector<cudaStream_t> g_global_captures;

void forget_capture(cudaStream_t s)
{
    for (size_t i = 0; i < tl_captures.size(); i++)
        if (tl_captures[i] == s) {
            tl_captures.erase(tl_captures.begin() + (long)i);
            break;
        }
    std::lock_guard<std::mutex> lock(g_mu);
    for (size_t i = 0; i < g_global_captures.size(); i++)
        if (g_global_captures[i] == s) {
            g_global_captures.erase(g_global_captures.begin() + (long)i);
            break;
        }
}

cudaError_t fail(cudaError_t rc)
{
    mlk_host::set_last_error(rc);
    return rc;
}

} /* namespace */

cudaError_t mlk_host_stream_submit(cudaStream_t s, std::function<void()> work,
                                   const void *node_kind)
{
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread) {
        /* The legacy stream synchronizes with every stream: illegal while a
         * capture this thread could see is in progress. */
        if (!tl_captures.empty()) {
            mlk_host_stream_invalidate(tl_captures.back());
            return cudaErrorStreamCaptureImplicit;
        }
        work();
        return cudaSuccess;
    }
    switch (s->capture) {
    case cudaStreamCaptureStatusNone:
        work();
        return cudaSuccess;
    case cudaStreamCaptureStatusActive:
        s->graph->nodes.push_back(graph_node{node_kind, std::move(work)});
        return cudaSuccess;
    default:
        return cudaErrorStreamCaptureInvalidated;
    }
}

void mlk_host_stream_enqueue(cudaStream_t s, std::function<void()> work, const void *node_kind)
{
    const cudaError_t rc = mlk_host_stream_submit(s, std::move(work), node_kind);
    if (rc != cudaSuccess)
        mlk_host::set_last_error(rc);
}

cudaError_t mlk_host_capture_forbids_unsafe(void)
{
    if (!tl_captures.empty()) {
        mlk_host_stream_invalidate(tl_captures.back());
        return cudaErrorStreamCaptureUnsupported;
    }
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_global_captures.empty()) {
        g_global_captures.back()->capture = cudaStreamCaptureStatusInvalidated;
        return cudaErrorStreamCaptureUnsupported;
    }
    return cudaSuccess;
}

int mlk_host_stream_capturing(cudaStream_t s)
{
    return s && s != cudaStreamLegacy && s != cudaStreamPerThread &&
           s->capture != cudaStreamCaptureStatusNone;
}

void mlk_host_stream_invalidate(cudaStream_t s)
{
    if (mlk_host_stream_capturing(s))
        s->capture = cudaStreamCaptureStatusInvalidated;
}

/* ---- the runtime API: streams ---------------------------------------------------------- */

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    if (!s)
        return fail(cudaErrorInvalidValue);
    *s = new CUstream_st();
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s)
        return fail(cudaErrorInvalidResourceHandle);
    if (mlk_host_stream_capturing(s))
        return fail(cudaErrorStreamCaptureUnsupported);
    delete s;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (mlk_host_stream_capturing(s)) {
        s->capture = cudaStreamCaptureStatusInvalidated;
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (!mlk_host_stream_capturing(s) && (!s || s == cudaStreamLegacy) && !tl_captures.empty()) {
        mlk_host_stream_invalidate(tl_captures.back());
        return fail(cudaErrorStreamCaptureImplicit);
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceSynchronize(void)
{
    const cudaError_t rc = mlk_host_capture_forbids_unsafe();
    return rc == cudaSuccess ? rc : fail(rc);
}

/* ---- capture ------------------------------------------------------------------------------- */

extern "C" cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode)
{
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return fail(cudaErrorStreamCaptureUnsupported);
    if (s->capture != cudaStreamCaptureStatusNone)
        return fail(cudaErrorIllegalState);
    s->capture = cudaStreamCaptureStatusActive;
    s->mode = mode;
    s->capture_thread = std::this_thread::get_id();
    s->graph = new CUgraph_st();
    if (mode == cudaStreamCaptureModeThreadLocal)
        tl_captures.push_back(s);
    else if (mode == cudaStreamCaptureModeGlobal) {
        tl_captures.push_back(s);
        std::lock_guard<std::mutex> lock(g_mu);
        g_global_captures.push_back(s);
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    if (!graph)
        return fail(cudaErrorInvalidValue);
    *graph = nullptr;
    if (!mlk_host_stream_capturing(s))
        return fail(cudaErrorIllegalState);
    if (s->mode != cudaStreamCaptureModeRelaxed &&
        s->capture_thread != std::this_thread::get_id())
        return fail(cudaErrorStreamCaptureWrongThread);
    forget_capture(s);
    const bool valid = s->capture == cudaStreamCaptureStatusActive;
    s->capture = cudaStreamCaptureStatusNone;
    if (!valid) {
        delete s->graph;
        s->graph = nullptr;
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    *graph = s->graph;
    s->graph = nullptr;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status)
{
    if (!status)
        return fail(cudaErrorInvalidValue);
    *status = s && s != cudaStreamLegacy && s != cudaStreamPerThread ? s->capture
                                                                     : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

/* ---- graphs ------------------------------------------------------------------------------- */

extern "C" cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    delete g;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g,
                                            unsigned long long flags)
{
    if (!exec || !g)
        return fail(cudaErrorInvalidValue);
    *exec = new CUgraphExec_st{g->nodes};
    return cudaSuccess;
}

/* Parameters may change, the topology (node count, each node's kind: the
 * kernel it launches, copy or set) may not. */
extern "C" cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t g,
                                           cudaGraphExecUpdateResultInfo *info)
{
    if (!exec || !g)
        return fail(cudaErrorInvalidValue);
    cudaGraphExecUpdateResult result = cudaGraphExecUpdateSuccess;
    if (exec->nodes.size() != g->nodes.size())
        result = cudaGraphExecUpdateErrorTopologyChanged;
    for (size_t i = 0; result == cudaGraphExecUpdateSuccess && i < g->nodes.size(); i++)
        if (exec->nodes[i].kind != g->nodes[i].kind)
            result = cudaGraphExecUpdateErrorNodeTypeChanged;
    if (info) {
        info->result = result;
        info->errorNode = nullptr;
        info->errorFromNode = nullptr;
    }
    if (result != cudaGraphExecUpdateSuccess)
        return fail(cudaErrorGraphExecUpdateFailure);
    exec->nodes = g->nodes;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    delete exec;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    if (!exec)
        return fail(cudaErrorInvalidValue);
    for (const graph_node &n : exec->nodes) {
        const cudaError_t rc = mlk_host_stream_submit(s, n.work, n.kind);
        if (rc != cudaSuccess)
            return fail(rc);
    }
    return cudaSuccess;
}
