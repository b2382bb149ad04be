#include "backend_select.h"

#include <string.h>

#include "protocol.h"

#ifdef MLLAMA_HAVE_CUDA
#include "mlk_backend.h"
#include "mlk_device.h"
#endif

ml_backend *svc_backend_create(const char *name, int threads, size_t pool_bytes,
                               const char **chosen, char *err, size_t errlen)
{
    int want_cuda = !strcmp(name, "cuda");
    if (!want_cuda && strcmp(name, "auto") && strcmp(name, "cpu")) {
        svc_errf(err, errlen, "backend '%s': expected auto, cpu or cuda", name);
        return NULL;
    }
#ifdef MLLAMA_HAVE_CUDA
    if (want_cuda || (!strcmp(name, "auto") && mlk_device_count() > 0)) {
        *chosen = "cuda";
        return ml_backend_cuda_create(0, pool_bytes, err, errlen);
    }
#else
    (void)pool_bytes;
    if (want_cuda) {
        svc_errf(err, errlen, "backend 'cuda': this build has no CUDA backend (nvcc was not found)");
        return NULL;
    }
#endif
    *chosen = "cpu";
    return ml_backend_cpu_create(threads, err, errlen);
}
