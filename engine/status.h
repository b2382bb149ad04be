/* Status codes shared by every engine module.
 *
 * Fallible functions return an ml_status and write human detail into a
 * caller-supplied buffer (`char *err, size_t errlen`), librdkafka style.
 * The buffer may be NULL (errlen then 0); detail is always NUL-terminated and
 * truncated to fit. */
#ifndef ML_STATUS_H
#define ML_STATUS_H

#include <stddef.h>

typedef enum ml_status {
    ML_OK = 0,
    ML_ERR_INVALID_ARG,  /* a caller bug or an out-of-range option */
    ML_ERR_IO,           /* open/read/mmap failed; errno detail in err */
    ML_ERR_FORMAT,       /* a file or payload is malformed or inconsistent */
    ML_ERR_UNSUPPORTED,  /* well-formed but outside what this build handles */
    ML_ERR_NOMEM,        /* an allocation or a memory budget was exhausted */
    ML_ERR_NOT_FOUND,    /* a named thing (tensor, token, file) is absent */
    ML_ERR_TOO_LARGE,    /* input exceeds a configured limit */
} ml_status;

/* Stable lower-case name of a status ("format", "io", ...). Never NULL. */
const char *ml_status_name(ml_status st);

/* printf into err (if non-NULL) and return st, so error paths are one line:
 *     return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: bad header", path); */
ml_status ml_fail(char *err, size_t errlen, ml_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
