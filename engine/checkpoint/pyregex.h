/* Python `re` patterns, as configuration files write them (PEFT's
 * target_modules, compressed-tensors' "re:" ignore entries), compiled to
 * POSIX EREs with the same match set, for the subset of the syntax where the
 * two agree; anything outside it is refused rather than matched differently.
 * @locality: any thread. */
#ifndef ML_CHECKPOINT_PYREGEX_H
#define ML_CHECKPOINT_PYREGEX_H

#include <regex.h>
#include <stddef.h>

#include "status.h"

typedef enum ml_pyregex_mode {
    ML_PYREGEX_FULLMATCH, /* re.fullmatch: the whole name */
    ML_PYREGEX_MATCH,     /* re.match: a prefix of the name */
} ml_pyregex_mode;

/* Compile the Python pattern pat into *re (REG_EXTENDED | REG_NOSUB) so that
 * regexec(re, name, 0, NULL, 0) == 0 exactly when Python's re.fullmatch or
 * re.match (mode) finds a match in name. field names the pattern in
 * messages. Returns ML_OK (the caller then owns *re: regfree), or, with
 * nothing to free: ML_ERR_UNSUPPORTED (valid Python outside the subset: other
 * escapes, (?...) constructs but (?:, {m,n}, non-ASCII), ML_ERR_FORMAT (not a
 * valid expression), ML_ERR_NOMEM. */
ml_status ml_pyregex_compile(regex_t *re, const char *pat, ml_pyregex_mode mode,
                             const char *field, char *err, size_t errlen);

#endif
