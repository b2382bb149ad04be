/* Backend selection (backend_select.h). */
#include "backend_select.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/protocol.h"

#ifdef MLLAMA_HAVE_CUDA
#include "mlk_backend.h"
#include "mlk_device.h"
#endif

/* Largest device number a list may name. */
#define DEVICE_MAX 1023

int svc_parse_devices(const char *list, int *out, int max, char *err, size_t errlen)
{
    int n = 0;
    for (const char *p = list ? list : ""; *p;) {
        char *end;
        errno = 0;
        long d = strtol(p, &end, 10);
        if (errno || end == p || d < 0 || d > DEVICE_MAX || (*end && *end != ',') ||
            (*end == ',' && !end[1])) {
            svc_errf(err, errlen, "device list '%s': expected device numbers in [0, %d] "
                     "separated by commas", list, DEVICE_MAX);
            return -1;
        }
        for (int i = 0; i < n; i++)
            if (out[i] == (int)d) {
                svc_errf(err, errlen, "device list '%s': device %ld is listed twice", list, d);
                return -1;
            }
        if (n == max) {
            svc_errf(err, errlen, "device list '%s': more than %d devices", list, max);
            return -1;
        }
        out[n++] = (int)d;
        p = *end ? end + 1 : end;
    }
    return n;
}

static int cpu_init(svc_backends *b, int world, int threads, char *err, size_t errlen)
{
    b->name = "cpu";
    if (world == 1) {
        b->be[0] = ml_backend_cpu_create(threads, err, errlen);
    } else {
        int each = threads == 0 ? 0 : threads / world > 0 ? threads / world : 1;
        if (ml_backend_cpu_create_group(world, each, b->be, err, errlen) != ML_OK)
            return -1;
    }
    return b->be[0] ? 0 : -1;
}

#ifdef MLLAMA_HAVE_CUDA
static int cuda_init(svc_backends *b, int world, const int *devices, size_t pool_bytes,
                     char *err, size_t errlen)
{
    b->name = "cuda";
    if (world == 1)
        b->be[0] = ml_backend_cuda_create(devices[0], pool_bytes, err, errlen);
    else if (ml_backend_cuda_create_group(world, devices, pool_bytes, b->be, err, errlen) != ML_OK)
        return -1;
    return b->be[0] ? 0 : -1;
}
#endif

int svc_backends_init(svc_backends *b, const char *name, int world, const char *devices,
                      int threads, size_t pool_bytes, char *err, size_t errlen)
{
    memset(b, 0, sizeof *b);
    int want_cuda = !strcmp(name, "cuda");
    if (!want_cuda && strcmp(name, "auto") && strcmp(name, "cpu")) {
        svc_errf(err, errlen, "backend '%s': expected auto, cpu or cuda", name);
        return -1;
    }
    if (world < 1 || world > SVC_TP_MAX) {
        svc_errf(err, errlen, "tensor parallel world %d: expected 1 to %d", world, SVC_TP_MAX);
        return -1;
    }
    int ids[SVC_TP_MAX];
    int n = svc_parse_devices(devices, ids, SVC_TP_MAX, err, errlen);
    if (n < 0)
        return -1;
    if (n != 0 && n != world) {
        svc_errf(err, errlen, "%d devices listed ('%s') for a tensor-parallel world of %d", n,
                 devices, world);
        return -1;
    }
    for (int i = n; i < world; i++)
        ids[i] = i;
    int rc;
#ifdef MLLAMA_HAVE_CUDA
    if (want_cuda || (!strcmp(name, "auto") && mlk_device_count() > 0))
        rc = cuda_init(b, world, ids, pool_bytes, err, errlen);
    else
        rc = cpu_init(b, world, threads, err, errlen);
#else
    (void)pool_bytes;
    if (want_cuda) {
        svc_errf(err, errlen, "backend 'cuda': this build has no CUDA backend (nvcc was not found)");
        return -1;
    }
    rc = cpu_init(b, world, threads, err, errlen);
#endif
    if (rc != 0) {
        memset(b, 0, sizeof *b);
        return -1;
    }
    b->world = world;
    return 0;
}

void svc_backends_deinit(svc_backends *b)
{
    for (int r = 0; r < b->world; r++)
        b->be[r]->ops->destroy(b->be[r]);
    memset(b, 0, sizeof *b);
}
