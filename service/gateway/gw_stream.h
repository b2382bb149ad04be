/* One request's reply records turned into what its HTTP client gets: the
 * SSE events of a stream, or the single chat.completion of a stream: false
 * request. A pure state machine: no I/O, no clock, no globals.
 *
 * The gateway always asks the worker to stream, feeds every reply record of
 * the request here (gw_stream_feed) and writes the events that appear
 * (gw_stream_n_events, gw_stream_event) to whoever reads the stream,
 * resumed readers included; a stream: false request waits for
 * gw_stream_done and answers with gw_stream_completion.
 *
 * Which records count (service/protocol/README.md, "Delivery contract for
 * frontends"):
 *   - the stream follows one attempt at a time; a record of another attempt
 *     is ignored, except a seq 0 of an attempt not seen before, which is
 *     followed from then on (a worker died and the request runs again);
 *   - a record at or below the last seq taken of the followed attempt is a
 *     duplicate and is ignored; a gap in its seqs means that attempt failed:
 *     its records are ignored until a new attempt's seq 0 arrives;
 *   - crash transparency: when a new attempt takes over after events were
 *     sent and the worker says it is `reproducible`, its records are
 *     compared choice by choice (a request of n choices: the choices'
 *     records interleave as the worker samples them, which a new attempt
 *     need not repeat, while each choice's own records it does): a record
 *     of a choice below the number that choice already sent is rewritten as
 *     it would be sent and compared byte for byte (its data, not its SSE id)
 *     with that choice's record sent, then skipped; the first record past
 *     them continues that choice. A mismatch, a final record before every
 *     choice gave again what it sent, or a new attempt that is not
 *     reproducible, ends the stream with a `stream_diverged` error: the
 *     text of two attempts is never spliced;
 *   - the final record (it may carry content too) ends the stream; one with
 *     an "error" object ends it with that error. With n > 1 choices it
 *     carries no choice ("choices":[]) and gives no chunk event of its own.
 *
 * What the client gets: every event is "id: <n>\ndata: <json>\n\n", n = 0,
 * 1, ... (the SSE id a reader resumes after); the last one's data is
 * "[DONE]". A record (of one choice, its "index" as the worker wrote it,
 * OpenAI's shape for n > 1) becomes an OpenAI chat.completion.chunk with the
 * gateway's id, created and model, the worker's "choices" as they were
 * written (bytes, escapes and numbers untouched, whitespace outside strings
 * dropped so that the data stays on one line), and no seq, attempt, timings,
 * usage or error. With include_usage, as OpenAI does, every chunk carries
 * "usage":null and one more chunk with "choices":[] and the usage comes
 * before [DONE]. An error after the 200 is the event
 * {"error":{"message","type","param":null,"code"}} before [DONE].
 * "usage" is the worker's usage object (prompt_tokens, prompt_tokens_cached,
 * completion_tokens, total_tokens, images, images_cached) with OpenAI's
 * "prompt_tokens_details":{"cached_tokens":<prompt_tokens_cached>} added.
 *
 * Records are checked as strict JSON (json_span.h); a followed record that
 * is not a chunk ends the stream with an `internal` error.
 *
 * Memory: every event stays until gw_stream_destroy (resumes replay them);
 * gw_stream_bytes says how much the stream holds, for the gateway's
 * retained-bytes budget. Nothing here bounds it: the worker's max_tokens
 * bounds the records, the gateway's budget the streams.
 *
 * Interface notes, beyond the first design of this file: gw_stream_params
 * has completion_only, gw_feed has GW_FEED_CONTINUED, and gw_error_type_of
 * and gw_error_body build the OpenAI error object for the gateway's own
 * HTTP errors too (one writer for both).
 *
 * @locality the gateway's event-loop thread; a stream is used by one thread
 * at a time. cJSON keeps its parse error in a process global: see
 * protocol.h, svc_request_parse.
 */
#ifndef SVC_GW_STREAM_H
#define SVC_GW_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef struct gw_stream gw_stream;

typedef struct gw_stream_params {
    const char *id;       /* borrowed for the call: the public and Kafka request id */
    const char *model;    /* borrowed for the call: the name the client asked for, echoed
                             in every chunk (bytes that are not valid UTF-8 as U+FFFD) */
    int64_t created;      /* unix seconds */
    bool include_usage;   /* stream_options.include_usage */
    /* stream: false: nothing is sent before the end, so a new attempt
     * restarts the answer instead of being compared with what was sent
     * (never stream_diverged): its events follow the old ones, and the
     * answer is made of its own. */
    bool completion_only;
} gw_stream_params;

/* One reply record, as consumed: the worker's headers and the value. */
typedef struct gw_record {
    uint32_t attempt, seq;
    bool final;
    bool reproducible;    /* header "reproducible" is "true"; absent = false */
    const char *value;    /* borrowed for the call; not NUL-terminated */
    size_t len;
} gw_record;

typedef enum gw_feed {
    GW_FEED_IGNORED,   /* no new event: a duplicate, another attempt's record, a record
                          of a failed attempt, one compared equal, or the stream is done */
    GW_FEED_EVENTS,    /* new events; the stream goes on */
    GW_FEED_DONE,      /* new events, the last one [DONE] (an answer or an error) */
    GW_FEED_DIVERGED,  /* as DONE, ended with stream_diverged (count a divergence) */
    GW_FEED_CONTINUED, /* a new attempt took over a stream that had sent events (count a
                          continuation); its first record brought a new event when
                          completion_only, or when its choice had sent none (n > 1) */
} gw_feed;

/* A stream with no events. Copies what it keeps of p. Returns NULL when
 * out of memory. */
gw_stream *gw_stream_create(const gw_stream_params *p);

/* Free the stream and its events (pointers from gw_stream_event die).
 * NULL is a no-op. */
void gw_stream_destroy(gw_stream *s);

/* Take one reply record of the request (any attempt, any order Kafka gives).
 * Out of memory ends the stream with an `internal` error (GW_FEED_DONE). */
gw_feed gw_stream_feed(gw_stream *s, const gw_record *r);

/* End the stream from the gateway's side (deadline, Kafka failure, cancel,
 * shutdown): an error event with `code` (a gw_http_status_of code) and
 * `message` (borrowed; cut to fit), then [DONE]. No-op once done. */
void gw_stream_fail(gw_stream *s, const char *code, const char *message);

/* The number of events so far; it only grows. */
size_t gw_stream_n_events(const gw_stream *s);

/* Event i < gw_stream_n_events: its SSE bytes, "id: <i>\ndata: ...\n\n".
 * *data is borrowed from the stream; it stays valid and unchanged until
 * gw_stream_destroy. */
void gw_stream_event(const gw_stream *s, size_t i, const char **data, size_t *len);

/* True once the last event ([DONE]) is there; every record after it is
 * ignored. */
bool gw_stream_done(const gw_stream *s);

/* The bytes the stream holds (events, their index, buffers, the stream). */
size_t gw_stream_bytes(const gw_stream *s);

/* Once done: the stream: false answer in `out` (replacing its content) and
 * its HTTP status in *http_status. An answer: 200 and the chat.completion
 * the worker would have written for stream: false (service/protocol/reply.c,
 * svc_reply_completion, svc_reply_completion_n with n choices) with the
 * gateway's id, created and model, per choice (index 0 .. the highest seen)
 * the contents and the logprobs "content" entries of its chunks in order
 * and its last chunk's finish_reason, the usage above, and no seq, attempt
 * or timings ("logprobs" is null for a choice when none of its chunks had
 * any). An error:
 * gw_http_status_of(code) and the OpenAI error object. Returns 0, or -1
 * when out of memory (out is then empty). */
int gw_stream_completion(const gw_stream *s, svc_buf *out, int *http_status);

/* ---- errors --------------------------------------------------------------------- */

/* The HTTP status of an error code: the worker's codes (protocol.h,
 * svc_error_code) and the gateway's own:
 *   400 invalid_json, invalid_request, invalid_image, image_too_large,
 *       context_length_exceeded, reply_too_large
 *   401 invalid_api_key           404 not_found, model_not_found, unknown_adapter
 *   405 method_not_allowed        408 request_timeout
 *   409 cancelled                 413 request_too_large, adapter_too_large
 *   429 rate_limit_exceeded, too_many_streams (the tenant's limits)
 *   503 adapter_unavailable, not_ready, kafka_unavailable, overloaded (the
 *       gateway's stream or retained-bytes limits)
 *   504 deadline_exceeded
 *   500 internal, stream_diverged and any other code. */
int gw_http_status_of(const char *code);

/* OpenAI's error "type" for a status: authentication_error (401),
 * rate_limit_error (429), server_error (5xx), invalid_request_error (the
 * other 4xx). Never NULL. */
const char *gw_error_type_of(int http_status);

/* {"error":{"message":M,"type":gw_error_type_of(gw_http_status_of(code)),
 * "param":null,"code":C}} into `out`, replacing its content; bytes of code
 * or message that are not valid UTF-8 become U+FFFD. Returns 0, or -1 when
 * out of memory (out is then empty). */
int gw_error_body(svc_buf *out, const char *code, const char *message);

#endif
