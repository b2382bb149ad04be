#include "tokenizer/unicode.h"

int ml_unicode_is_py_space(uint32_t cp)
{
    size_t lo = 0, hi = ml_unicode_py_space_len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ml_unicode_py_space[mid] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < ml_unicode_py_space_len && ml_unicode_py_space[lo] == cp;
}
