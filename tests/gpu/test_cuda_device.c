/* The CUDA runtime links and sees the device; skipped (77) without one. */
#include "harness.h"
#include "mlk_device.h"

int main(void)
{
    int n = mlk_device_count();
    if (n == 0)
        ml_test_skip("no CUDA device");
    for (int i = 0; i < n; i++) {
        mlk_device_info info;
        char err[256];
        check(mlk_device_query(i, &info, err, sizeof err) == 0, "query device %d: %s", i, err);
        fprintf(stderr, "device %d: %s sm_%d%d %zu MiB\n", i, info.name, info.major, info.minor,
                info.total_bytes >> 20);
        check(info.major >= 8, "device %d: compute capability %d.%d below sm_80", i, info.major,
              info.minor);
    }
    return check_done();
}
