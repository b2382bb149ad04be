/* The CUDA runtime API that kernels/ uses, for the HOST build: devices,
 * memory, copies, function attributes and errors. Streams and graphs are in
 * host_stream.cpp.
 *
 * Devices: MLK_HOST_DEVICES of them (default HOST_DEFAULT_DEVICES, enough for
 * the two-rank tensor-parallel tests), each reported as an sm_90 device of
 * MLK_HOST_DEVICE_MIB MiB (default HOST_DEFAULT_MIB, each device its own) with
 * an H100's limits,
 * so that the backend takes the paths it takes on its target. Device memory
 * is host memory mapped without reserve (only what is touched is used, so
 * a device-sized pool costs nothing), counted against the device's size;
 * the bytes past an allocation's end up to a guard page are poisoned for
 * AddressSanitizer, and the guard page faults. */
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include <sys/mman.h>
#include <unistd.h>

#include <cuda_runtime.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include "host_exec.h"
#include "host_stream.h"
#include "mlk_host.h"

namespace {

constexpr int HOST_DEFAULT_DEVICES = 2;
constexpr size_t HOST_DEFAULT_MIB = 80 << 10; /* an H100's */
constexpr int HOST_CC_MAJOR = 9, HOST_CC_MINOR = 0;
constexpr int HOST_SM_COUNT = 132;
/* Shared memory per block: the default limit, and the opt-in maximum of an
 * H100 (cudaFuncAttributeMaxDynamicSharedMemorySize up to it). */
constexpr size_t SMEM_DEFAULT = 48 << 10;
constexpr size_t SMEM_OPTIN = 227 << 10;
constexpr size_t DEVICE_ALIGN = 256;

thread_local cudaError_t tl_last_error = cudaSuccess;
thread_local int tl_device = 0;

std::mutex g_mu;
constexpr int MAX_DEVICES = 64;
size_t g_used_bytes[MAX_DEVICES];         /* @locks g_mu: per device */
struct device_block {
    size_t bytes;
    size_t mapped; /* bytes mapped, the guard page included */
    int device;
};
std::map<const void *, device_block> g_device; /* @locks g_mu: live cudaMalloc blocks */
std::map<const char *, size_t> g_pinned;  /* @locks g_mu: live cudaHostAlloc blocks and sizes */
std::map<const void *, size_t> g_smem_attr; /* @locks g_mu: MaxDynamicSharedMemorySize set */

int env_int(const char *name, int fallback)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

int device_count()
{
    static const int n = std::min(env_int("MLK_HOST_DEVICES", HOST_DEFAULT_DEVICES), MAX_DEVICES);
    return n;
}

size_t device_bytes()
{
    static const size_t b = (size_t)env_int("MLK_HOST_DEVICE_MIB", (int)HOST_DEFAULT_MIB) << 20;
    return b;
}

cudaError_t fail(cudaError_t rc)
{
    tl_last_error = rc;
    return rc;
}

/* 1 when [p, p + n) lies in one cudaHostAlloc block. */
bool pinned(const void *p, size_t n)
{
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_pinned.upper_bound((const char *)p);
    if (it == g_pinned.begin())
        return false;
    --it;
    return (const char *)p >= it->first && (const char *)p + n <= it->first + it->second;
}

std::atomic<int> g_digest_fd{-1};
std::atomic<unsigned long long> g_digest_index{0};

uint64_t fnv1a64(const void *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return h;
}

/* A device-to-host copy has executed: its digest for the comparing process. */
void digest_download(const void *dst, size_t bytes)
{
    const int fd = g_digest_fd.load(std::memory_order_relaxed);
    if (fd < 0)
        return;
    const mlk_host_digest d = {g_digest_index.fetch_add(1), bytes, fnv1a64(dst, bytes)};
    if (write(fd, &d, sizeof d) != (ssize_t)sizeof d) {
        perror("mlk host: download digest");
        abort();
    }
}

} /* namespace */

extern "C" void mlk_host_digest_downloads(int fd)
{
    g_digest_fd.store(fd, std::memory_order_relaxed);
}

void mlk_host::set_last_error(cudaError_t rc)
{
    tl_last_error = rc;
}

size_t mlk_host::max_dynamic_smem(const void *func)
{
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_smem_attr.find(func);
    return it == g_smem_attr.end() ? SMEM_DEFAULT : it->second;
}

/* ---- errors ------------------------------------------------------------------------- */

extern "C" cudaError_t cudaGetLastError(void)
{
    const cudaError_t rc = tl_last_error;
    tl_last_error = cudaSuccess;
    return rc;
}

extern "C" cudaError_t cudaPeekAtLastError(void)
{
    return tl_last_error;
}

#define MLK_HOST_ERRORS(X)                                                                       \
    X(cudaSuccess, "no error")                                                                   \
    X(cudaErrorInvalidValue, "invalid argument")                                                 \
    X(cudaErrorMemoryAllocation, "out of memory")                                                \
    X(cudaErrorInvalidConfiguration, "invalid configuration argument")                           \
    X(cudaErrorInvalidDevicePointer, "invalid device pointer")                                   \
    X(cudaErrorInvalidDevice, "invalid device ordinal")                                          \
    X(cudaErrorInvalidResourceHandle, "invalid resource handle")                                 \
    X(cudaErrorNoDevice, "no CUDA-capable device is detected")                                   \
    X(cudaErrorIllegalState, "operation not permitted in the current state")                     \
    X(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing")     \
    X(cudaErrorStreamCaptureInvalidated,                                                         \
      "operation failed due to a previous error during capture")                                 \
    X(cudaErrorStreamCaptureWrongThread, "attempt to terminate a thread-local capture sequence "   \
                                         "from another thread")                                   \
    X(cudaErrorStreamCaptureImplicit, "operation would make the legacy stream depend on a "        \
                                      "capturing blocking stream")                               \
    X(cudaErrorGraphExecUpdateFailure, "the graph update was not performed because it included "   \
                                       "changes which violated constraints specific to "          \
                                       "instantiated graph update")

extern "C" const char *cudaGetErrorString(cudaError_t rc)
{
    switch (rc) {
#define X(code, text) \
    case code:        \
        return text;
        MLK_HOST_ERRORS(X)
#undef X
    default:
        return "unknown error";
    }
}

extern "C" const char *cudaGetErrorName(cudaError_t rc)
{
    switch (rc) {
#define X(code, text) \
    case code:        \
        return #code;
        MLK_HOST_ERRORS(X)
#undef X
    default:
        return "cudaErrorUnknown";
    }
}

/* ---- devices ---------------------------------------------------------------------------- */

extern "C" cudaError_t cudaGetDeviceCount(int *n)
{
    if (!n)
        return fail(cudaErrorInvalidValue);
    *n = device_count();
    return *n > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}

extern "C" cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= device_count())
        return fail(cudaErrorInvalidDevice);
    tl_device = device;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return fail(cudaErrorInvalidValue);
    *device = tl_device;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device)
{
    if (!prop)
        return fail(cudaErrorInvalidValue);
    if (device < 0 || device >= device_count())
        return fail(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "host emulation %d (mllama MLLAMA_CUDA=HOST)", device);
    prop->major = HOST_CC_MAJOR;
    prop->minor = HOST_CC_MINOR;
    prop->totalGlobalMem = device_bytes();
    prop->multiProcessorCount = HOST_SM_COUNT;
    prop->warpSize = MLK_HOST_WARP;
    prop->maxThreadsPerBlock = 1024;
    prop->sharedMemPerBlock = SMEM_DEFAULT;
    prop->sharedMemPerBlockOptin = SMEM_OPTIN;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = INT32_MAX;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    if (!free_bytes || !total_bytes)
        return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lock(g_mu);
    *total_bytes = device_bytes();
    *free_bytes = device_bytes() - g_used_bytes[tl_device];
    return cudaSuccess;
}

/* ---- memory -------------------------------------------------------------------------------- */

extern "C" cudaError_t cudaMalloc(void **p, size_t bytes)
{
    if (!p)
        return fail(cudaErrorInvalidValue);
    *p = nullptr;
    const cudaError_t cap = mlk_host_capture_forbids_unsafe();
    if (cap != cudaSuccess)
        return fail(cap);
    std::lock_guard<std::mutex> lock(g_mu);
    if (bytes > device_bytes() - g_used_bytes[tl_device])
        return fail(cudaErrorMemoryAllocation);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t data = (bytes + page - 1) / page * page;
    void *m = mmap(nullptr, data + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return fail(cudaErrorMemoryAllocation);
    mprotect((char *)m + data, page, PROT_NONE);
#if defined(__SANITIZE_ADDRESS__)
    ASAN_POISON_MEMORY_REGION((char *)m + bytes, data - bytes);
#endif
    *p = m;
    g_device[*p] = device_block{bytes, data + page, tl_device};
    g_used_bytes[tl_device] += bytes;
    return cudaSuccess;
}

extern "C" cudaError_t cudaFree(void *p)
{
    if (!p)
        return cudaSuccess;
    const cudaError_t cap = mlk_host_capture_forbids_unsafe();
    if (cap != cudaSuccess)
        return fail(cap);
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_device.find(p);
    if (it == g_device.end())
        return fail(cudaErrorInvalidDevicePointer);
    g_used_bytes[it->second.device] -= it->second.bytes;
#if defined(__SANITIZE_ADDRESS__)
    ASAN_UNPOISON_MEMORY_REGION(p, it->second.mapped);
#endif
    munmap(p, it->second.mapped);
    g_device.erase(it);
    return cudaSuccess;
}

extern "C" cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags)
{
    if (!p)
        return fail(cudaErrorInvalidValue);
    *p = nullptr;
    const cudaError_t cap = mlk_host_capture_forbids_unsafe();
    if (cap != cudaSuccess)
        return fail(cap);
    if (posix_memalign(p, DEVICE_ALIGN, bytes ? bytes : 1) != 0) {
        *p = nullptr;
        return fail(cudaErrorMemoryAllocation);
    }
    std::lock_guard<std::mutex> lock(g_mu);
    g_pinned[(const char *)*p] = bytes;
    return cudaSuccess;
}

extern "C" cudaError_t cudaFreeHost(void *p)
{
    if (!p)
        return cudaSuccess;
    const cudaError_t cap = mlk_host_capture_forbids_unsafe();
    if (cap != cudaSuccess)
        return fail(cap);
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_pinned.erase((const char *)p))
        return fail(cudaErrorInvalidValue);
    free(p);
    return cudaSuccess;
}

/* The host side of a copy must be pinned to be captured into a graph (a
 * pageable copy is synchronous, which a capture cannot record). */
extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes,
                                       cudaMemcpyKind kind, cudaStream_t s)
{
    static const char copy_kind = 0;
    if (bytes && (!dst || !src))
        return fail(cudaErrorInvalidValue);
    if (mlk_host_stream_capturing(s)) {
        const bool host_ok = kind == cudaMemcpyHostToDevice   ? pinned(src, bytes)
                             : kind == cudaMemcpyDeviceToHost ? pinned(dst, bytes)
                                                              : true;
        if (!host_ok) {
            mlk_host_stream_invalidate(s);
            return fail(cudaErrorStreamCaptureUnsupported);
        }
    }
    const bool to_host = kind == cudaMemcpyDeviceToHost;
    const cudaError_t rc = mlk_host_stream_submit(
        s,
        [dst, src, bytes, to_host] {
            memmove(dst, src, bytes);
            if (to_host)
                digest_download(dst, bytes);
        },
        &copy_kind);
    return rc == cudaSuccess ? rc : fail(rc);
}

extern "C" cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s)
{
    static const char set_kind = 0;
    if (bytes && !dst)
        return fail(cudaErrorInvalidValue);
    const cudaError_t rc = mlk_host_stream_submit(
        s, [dst, value, bytes] { memset(dst, value, bytes); }, &set_kind);
    return rc == cudaSuccess ? rc : fail(rc);
}

/* ---- kernels' attributes ------------------------------------------------------------------ */

extern "C" cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value)
{
    if (!func || attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
        return fail(cudaErrorInvalidValue);
    if (value < 0 || (size_t)value > SMEM_OPTIN)
        return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lock(g_mu);
    g_smem_attr[func] = (size_t)value;
    return cudaSuccess;
}
