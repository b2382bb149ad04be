/* Shared by the two files of the test_json_schema executable:
 * test_json_schema.c (documents, masks, digest, main) and
 * test_json_schema_refused.c (refused schemas and compile bounds). */
#ifndef ML_TEST_JSON_SCHEMA_H
#define ML_TEST_JSON_SCHEMA_H

#include "grammar/grammar.h"
#include "status.h"

/* Wall time for one compile in these tests: the default bound, 2 s, is for
 * release builds; sanitizer builds on a loaded machine run several times
 * slower (test_bounds checks the bound itself). */
#define TEST_COMPILE_MS 60000.0

/* ml_grammar_compile_schema of schema under the default limits, with
 * TEST_COMPILE_MS for its wall time: the status, the grammar into *g
 * (owned by the caller; NULL on error) and the message into err. */
ml_status test_compile_schema(const char *schema, ml_grammar **g, char *err, size_t errlen);

/* The schema refused with st, err holding each of the needles (NULL-ended
 * after line). */
#define REFUSED(schema, st, ...) refused_at((schema), (st), __LINE__, __VA_ARGS__, NULL)
void refused_at(const char *schema, ml_status want, int line, ...);

/* test_json_schema_refused.c */
void test_refusals(void);
void test_bounds(void);

#endif
