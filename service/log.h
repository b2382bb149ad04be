/* Structured logs: one JSON object per line,
 *     {"ts":"2025-01-31T12:00:00.123Z","level":"info","event":"kafka.assign","msg":"..."}
 * on stdout by default, as container log collectors expect
 * (service/README.md §8). `event` is a short stable dotted name to filter
 * on; `msg` is free text, JSON-escaped here. Never log prompts, image bytes
 * or base64: callers pass identifiers (request id, topic, partition, offset).
 *
 * @locality any thread: each line is formatted privately and written with
 *           one locked stdio call, so lines from different threads never
 *           interleave. */
#ifndef SVC_LOG_H
#define SVC_LOG_H

#include <stdio.h>

typedef enum svc_log_level {
    SVC_LOG_DEBUG = 0,
    SVC_LOG_INFO,
    SVC_LOG_WARN,
    SVC_LOG_ERROR,
} svc_log_level;

/* Write one line if `level` is at or above the threshold (default INFO).
 * `event` must be a plain identifier (it is not escaped); the formatted
 * message is escaped and truncated to a few KiB. */
void svc_log(svc_log_level level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Lines below `level` are dropped. @locality any; takes effect at once. */
void svc_log_set_level(svc_log_level level);

/* Send lines to `f` (borrowed; must outlive all logging) instead of stdout;
 * NULL restores stdout. For commands whose stdout is a data channel
 * (`mllama mock-kafka` prints its bootstrap servers there).
 * @locality main thread, before other threads log. */
void svc_log_set_output(FILE *f);

/* Parse "debug", "info", "warn" or "error". Returns 0 and sets *level, or -1
 * for anything else (level unchanged). */
int svc_log_level_parse(const char *name, svc_log_level *level);

#endif
