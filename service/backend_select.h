/* Choosing the engine's backends by name, for the CLI and the worker: one
 * backend, or the members of a tensor-parallel group that one model is
 * split over (engine/model/README.md §11, ml_model_load_tp).
 * @locality: the thread that loads the model. */
#ifndef SVC_BACKEND_SELECT_H
#define SVC_BACKEND_SELECT_H

#include <stddef.h>

#include "engine.h"

/* Largest tensor-parallel world (the CPU group's limit). */
#define SVC_TP_MAX ML_CPU_GROUP_MAX

/* The backends one model runs on. */
typedef struct svc_backends {
    ml_backend *be[SVC_TP_MAX]; /* owned: be[0 .. world) */
    int world;
    const char *name;           /* "cpu" or "cuda" (static) */
} svc_backends;

/* Create `world` backends of kind `name`: "cpu", "cuda", or "auto" (CUDA
 * when this build has the CUDA backend and a device is present, else the
 * CPU). World 1 is one backend: the CPU's with `threads` threads (0 = every
 * core), or CUDA on the first listed device (device 0 when none is).
 * World > 1 is a group whose members all-reduce among themselves: on the
 * CPU, world backends sharing `threads` evenly (threads / world each, at
 * least one; 0 = the cores shared evenly); on CUDA, one backend per listed
 * device joined by NCCL. devices is a list such as "0,1,2,3" of exactly
 * world CUDA devices, or NULL / "" for devices 0 .. world-1 (the CPU
 * ignores it once checked). pool_bytes sizes each CUDA device pool (0 =
 * most of the free memory). Returns 0, or -1 with the reason in err and b
 * zeroed (nothing left allocated). */
int svc_backends_init(svc_backends *b, const char *name, int world, const char *devices,
                      int threads, size_t pool_bytes, char *err, size_t errlen);

/* Destroy the backends; call after the model on them is destroyed. A zeroed
 * b is a no-op. */
void svc_backends_deinit(svc_backends *b);

/* Parse a device list: comma-separated device numbers in [0, 1023], none
 * twice, at most max of them; NULL or "" is the empty list. Returns the
 * count with the numbers in out, or -1 with the reason in err. */
int svc_parse_devices(const char *list, int *out, int max, char *err, size_t errlen);

#endif
