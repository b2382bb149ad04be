/* Helpers shared by the parts of test_request (one executable):
 * test_request.c (fields, precedence, rejections, topics),
 * test_request_schema.c (response_format json_schema),
 * test_request_bias.c (logit_bias) and test_request_tools.c (tools). */
#ifndef TEST_REQUEST_H
#define TEST_REQUEST_H

#include <stdbool.h>
#include <stddef.h>

#include "protocol/protocol.h"

#define TOPIC "llm.replies"

/* The limits every parse runs under (svc_limits_default, set by main). */
extern svc_limits limits;

/* Parse json as a record's value without headers or key (from an exact-size
 * copy, so ASan catches a read past the record). */
svc_error parse(const char *json, svc_request **req, char *err, size_t errlen);

/* Expect failure with `code`, a message containing `msg_part`, and the
 * given answerability. */
void expect_error(const char *json, svc_error code, const char *msg_part, bool answerable);

/* A valid request around one user message `content` (a JSON value), with
 * extra top-level members `extra` (leading comma included, or ""); NULL when
 * out of memory. The caller frees it. */
char *wrap(const char *content, const char *extra);

void test_json_schema(void);
void test_json_schema_bound(void);
void test_logit_bias(void);
void test_tools(void);

#endif
