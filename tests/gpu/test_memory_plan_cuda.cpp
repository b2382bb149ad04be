// The memory plan's restatement of the CUDA backend's constants
// (engine/model/memory_plan.h, which includes no CUDA header) against the
// backend's own (kernels/mlk_internal.cuh): a compile-time check, built
// wherever the CUDA backend is (ON and HOST builds).
// The HOST build compiles the backend as C++ with MLK_HOST (kernels/
// CMakeLists.txt) and tells consumers MLLAMA_CUDA_HOST; the header needs
// the former to parse as C++. The ON build compiles this file with nvcc.
#if defined(MLLAMA_CUDA_HOST) && !defined(MLK_HOST)
#define MLK_HOST 1
#endif
#include "mlk_internal.cuh"

extern "C" {
#include "model/memory_plan.h"
}

static_assert(ML_PLAN_CUDA_WORKSPACE_BYTES == MLK_WORKSPACE_BYTES,
              "memory_plan.h restates kernels/mlk_internal.cuh MLK_WORKSPACE_BYTES");

int main() { return 0; }
