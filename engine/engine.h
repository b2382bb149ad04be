/* The engine's public surface: everything service/ may use (README.md "Contributing",
 * "Layout": service includes only this header). */
#ifndef ML_ENGINE_H
#define ML_ENGINE_H

#include "backend.h"
#include "dtype.h"
#include "image/image.h"
#include "image/prepare.h"
#include "model/config.h"
#include "model/mllama.h"
#include "model/mkmodel.h"
#include "runtime/runtime.h"
#include "runtime/sampler.h"
#include "runtime/stop.h"
#include "sha256.h"
#include "status.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

#endif
