#include "mlk_device.h"

#include <cstdio>
#include <cstring>

#include <cuda_runtime.h>

extern "C" int mlk_device_count(void)
{
    int n = 0;
    /* Without a driver cudaGetDeviceCount fails (cudaErrorNoDevice or
     * cudaErrorInsufficientDriver); both simply mean "no GPU here". */
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int mlk_device_query(int index, mlk_device_info *info, char *err, size_t errlen)
{
    cudaDeviceProp prop;
    cudaError_t rc = cudaGetDeviceProperties(&prop, index);
    if (rc != cudaSuccess) {
        snprintf(err, errlen, "cuda device %d: %s", index, cudaGetErrorString(rc));
        return -1;
    }
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    info->major = prop.major;
    info->minor = prop.minor;
    info->total_bytes = prop.totalGlobalMem;
    info->multiprocessors = prop.multiProcessorCount;
    return 0;
}
