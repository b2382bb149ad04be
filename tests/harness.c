/* The check counters of harness.h, one pair per test executable. */
#include "harness.h"

int ml_test_failures;
int ml_test_checks;
