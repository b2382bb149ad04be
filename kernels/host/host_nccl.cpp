/* NCCL for the HOST build: the communicators of one ncclCommInitAll are the
 * ranks of one in-process group, each driven by its own thread (as the
 * engine's tensor-parallel workers are). ncclAllReduce is a rendezvous: the
 * last rank to arrive sums every rank's buffer in rank order (a fixed order,
 * so results are reproducible; a device's ring order differs) and writes the
 * sum to every rank's output, then all return. It goes through the stream,
 * so a captured graph replays it. */
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include <nccl.h>

#include "host_stream.h"

namespace {

/* A rank that waits this long for its peers reports the hang and aborts (on
 * a device the collective would hang for ever). */
constexpr int PEER_WAIT_SECONDS = 300;

struct group {
    std::mutex mu;
    std::condition_variable cv;
    int n_ranks = 0;
    int arrived = 0;         /* @locks mu */
    uint64_t generation = 0; /* @locks mu: completed all-reduces */
    size_t count = 0;        /* @locks mu: of the all-reduce in progress */
    std::vector<const float *> send; /* @locks mu: borrowed, per rank */
    std::vector<float *> recv;       /* @locks mu: borrowed, per rank */
    std::vector<float> sum;
};

void all_reduce(group &g, int rank, const float *send, float *recv, size_t count)
{
    std::unique_lock<std::mutex> lock(g.mu);
    if (g.arrived == 0)
        g.count = count;
    else if (g.count != count) {
        fprintf(stderr, "mlk host: ncclAllReduce: rank %d reduces %zu elements, its peers %zu\n",
                rank, count, g.count);
        abort();
    }
    g.send[(size_t)rank] = send;
    g.recv[(size_t)rank] = recv;
    const uint64_t gen = g.generation;
    if (++g.arrived == g.n_ranks) {
        g.sum.assign(count, 0.0f);
        for (int r = 0; r < g.n_ranks; r++)
            for (size_t i = 0; i < count; i++)
                g.sum[i] += g.send[(size_t)r][i];
        for (int r = 0; r < g.n_ranks; r++)
            std::copy(g.sum.begin(), g.sum.end(), g.recv[(size_t)r]);
        g.arrived = 0;
        g.generation++;
        g.cv.notify_all();
        return;
    }
    if (!g.cv.wait_for(lock, std::chrono::seconds(PEER_WAIT_SECONDS),
                       [&] { return g.generation != gen; })) {
        fprintf(stderr, "mlk host: ncclAllReduce: rank %d waited %d s for its peers\n", rank,
                PEER_WAIT_SECONDS);
        abort();
    }
}

} /* namespace */

struct ncclComm {
    std::shared_ptr<group> g;
    int rank;
};

extern "C" ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    if (!comms || ndev < 1)
        return ncclInvalidArgument;
    auto g = std::make_shared<group>();
    g->n_ranks = ndev;
    g->send.resize((size_t)ndev);
    g->recv.resize((size_t)ndev);
    for (int i = 0; i < ndev; i++)
        comms[i] = new ncclComm{g, i};
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    delete comm;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream)
{
    static const char all_reduce_kind = 0;
    if (!comm || (count && (!sendbuff || !recvbuff)))
        return ncclInvalidArgument;
    if (datatype != ncclFloat32 || op != ncclSum)
        return ncclInvalidArgument;
    std::shared_ptr<group> g = comm->g;
    const int rank = comm->rank;
    const float *send = (const float *)sendbuff;
    float *recv = (float *)recvbuff;
    const cudaError_t rc = mlk_host_stream_submit(
        stream, [g, rank, send, recv, count] { all_reduce(*g, rank, send, recv, count); },
        &all_reduce_kind);
    return rc == cudaSuccess ? ncclSuccess : ncclInvalidUsage;
}

extern "C" const char *ncclGetErrorString(ncclResult_t rc)
{
    switch (rc) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    default: return "unknown result code";
    }
}
