#include "status.h"

#include <stdarg.h>
#include <stdio.h>

const char *ml_status_name(ml_status st)
{
    switch (st) {
    case ML_OK: return "ok";
    case ML_ERR_INVALID_ARG: return "invalid_argument";
    case ML_ERR_IO: return "io";
    case ML_ERR_FORMAT: return "format";
    case ML_ERR_UNSUPPORTED: return "unsupported";
    case ML_ERR_NOMEM: return "out_of_memory";
    case ML_ERR_NOT_FOUND: return "not_found";
    case ML_ERR_TOO_LARGE: return "too_large";
    }
    return "unknown";
}

ml_status ml_fail(char *err, size_t errlen, ml_status st, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return st;
}
