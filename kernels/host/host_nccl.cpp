/* NCCL for the HOST build: the communicators of one ncclCommInitAll are the
 * ranks of one in-process group, each driven by its own thread (as the
 * engine's tensor-parallel workers are). A collective is a rendezvous: the
 * last rank to arrive does the whole of it for every rank, then all return.
 * ncclAllReduce sums every rank's buffer in rank order (a fixed order, so
 * results are reproducible; a device's ring order differs) into every
 * rank's output; ncclAllGather concatenates the ranks' buffers in rank
 * order into every rank's output. Both go through the stream, so a
 * captured graph replays them. */
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

enum class op { reduce, gather };

const char *op_name(op o)
{
    return o == op::reduce ? "ncclAllReduce" : "ncclAllGather";
}

/* The last rank's work: every rank's send and recv are in g. */
void complete(group &g, op o, size_t count)
{
    const size_t ranks = (size_t)g.n_ranks;
    if (o == op::gather) {
        for (size_t dst = 0; dst < ranks; dst++)
            for (size_t r = 0; r < ranks; r++)
                std::copy(g.send[r], g.send[r] + count, g.recv[dst] + r * count);
        return;
    }
    g.sum.assign(count, 0.0f);
    for (size_t r = 0; r < ranks; r++)
        for (size_t i = 0; i < count; i++)
            g.sum[i] += g.send[r][i];
    for (size_t r = 0; r < ranks; r++)
        std::copy(g.sum.begin(), g.sum.end(), g.recv[r]);
}

void collective(group &g, op o, int rank, const float *send, float *recv, size_t count)
{
    std::unique_lock<std::mutex> lock(g.mu);
    if (g.arrived == 0)
        g.count = count;
    else if (g.count != count) {
        fprintf(stderr, "mlk host: %s: rank %d moves %zu elements, its peers %zu\n", op_name(o),
                rank, count, g.count);
        abort();
    }
    g.send[(size_t)rank] = send;
    g.recv[(size_t)rank] = recv;
    const uint64_t gen = g.generation;
    if (++g.arrived == g.n_ranks) {
        complete(g, o, count);
        g.arrived = 0;
        g.generation++;
        g.cv.notify_all();
        return;
    }
    if (!g.cv.wait_for(lock, std::chrono::seconds(PEER_WAIT_SECONDS),
                       [&] { return g.generation != gen; })) {
        fprintf(stderr, "mlk host: %s: rank %d waited %d s for its peers\n", op_name(o), rank,
                PEER_WAIT_SECONDS);
        abort();
    }
}

/* Enqueue collective o of comm's rank on stream. */
ncclResult_t submit(op o, const void *sendbuff, void *recvbuff, size_t count,
                    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                    const void *kind);

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

namespace {

ncclResult_t submit(op o, const void *sendbuff, void *recvbuff, size_t count,
                    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                    const void *kind)
{
    if (!comm || (count && (!sendbuff || !recvbuff)) || datatype != ncclFloat32)
        return ncclInvalidArgument;
    std::shared_ptr<group> g = comm->g;
    const int rank = comm->rank;
    const float *send = (const float *)sendbuff;
    float *recv = (float *)recvbuff;
    const cudaError_t rc = mlk_host_stream_submit(
        stream, [g, o, rank, send, recv, count] { collective(*g, o, rank, send, recv, count); },
        kind);
    return rc == cudaSuccess ? ncclSuccess : ncclInvalidUsage;
}

} /* namespace */

extern "C" ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream)
{
    static const char all_reduce_kind = 0;
    if (op != ncclSum)
        return ncclInvalidArgument;
    return submit(op::reduce, sendbuff, recvbuff, count, datatype, comm, stream,
                  &all_reduce_kind);
}

extern "C" ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                      ncclDataType_t datatype, ncclComm_t comm,
                                      cudaStream_t stream)
{
    static const char all_gather_kind = 0;
    return submit(op::gather, sendbuff, recvbuff, sendcount, datatype, comm, stream,
                  &all_gather_kind);
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
