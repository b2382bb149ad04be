/* Choosing the engine's backend by name, for the CLI and the worker.
 * @locality: the thread that will drive the backend. */
#ifndef SVC_BACKEND_SELECT_H
#define SVC_BACKEND_SELECT_H

#include <stddef.h>

#include "engine.h"

/* "cpu", "cuda", or "auto" (CUDA when this build has the CUDA backend and a
 * device is present, else the CPU). threads sizes the CPU backend (0 = every
 * core); pool_bytes the CUDA device pool (0 = most of the free memory).
 * *chosen receives "cpu" or "cuda". Returns NULL with the reason in err
 * (e.g. "cuda" asked of a build without CUDA). Owned by the caller. */
ml_backend *svc_backend_create(const char *name, int threads, size_t pool_bytes,
                               const char **chosen, char *err, size_t errlen);

#endif
