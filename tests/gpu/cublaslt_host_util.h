/* What the host cuBLASLt's tests share (test_cublaslt_host.cpp: results;
 * test_cublaslt_host_api.cpp: the API's contract): the stream entry point
 * the host cuBLASLt queues its work with, defined here for the test (run at
 * once, or recorded as a graph capture would), aligned device-like buffers
 * and the f32 error bound. Defines globals: one test file per executable. */
#ifndef ML_TEST_CUBLASLT_HOST_UTIL_H
#define ML_TEST_CUBLASLT_HOST_UTIL_H

#include <cublasLt.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <vector>

extern "C" {
#include "harness.h"
#include "test_rand.h"
}

#include "host/host_stream.h"

/* ---- the stream: run at once, or record (as a capture would) ---------------- */

namespace {
/* g_defer: record instead of running; every call counted, its stream kept. */
bool g_defer = false;
int g_enqueued = 0;
cudaStream_t g_last_stream = nullptr;
std::vector<std::function<void()>> g_recorded;
} // namespace

void mlk_host_stream_enqueue(cudaStream_t s, std::function<void()> work, const void *)
{
    g_enqueued++;
    g_last_stream = s;
    if (g_defer)
        g_recorded.push_back(std::move(work));
    else
        work();
}

namespace {

constexpr double F32_U = 1.0 / (1 << 24); /* f32 unit roundoff */
constexpr double BF16_U = 1.0 / (1 << 8); /* bf16 unit roundoff */
constexpr size_t BUF_ALIGN = 256;         /* cudaMalloc's alignment */
cudaStream_t const TEST_STREAM = reinterpret_cast<cudaStream_t>(0x5000);

inline double gamma_n(int n)
{
    return n * F32_U / (1 - n * F32_U);
}

/* Device-like memory: 256-byte aligned, owned. */
struct Buf {
    void *p = nullptr;
    size_t bytes = 0;
    explicit Buf(size_t n) : bytes(n)
    {
        p = std::aligned_alloc(BUF_ALIGN, (n + BUF_ALIGN - 1) / BUF_ALIGN * BUF_ALIGN);
        check(p != nullptr, "aligned_alloc %zu", n);
    }
    ~Buf() { std::free(p); }
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;
};

/* The handle every test uses (main creates it). */
cublasLtHandle_t g_lt;

} // namespace

#endif
