/* What the gateway tests share: `mllama gateway` started over a pu_stack
 * (mock Kafka, redis-server, workers), and a small HTTP/1.1 client over a
 * plain socket that sees the bytes as they come (chunk framing decoded, SSE
 * events parsed strictly), so a test can disconnect mid-stream, trickle a
 * request or hold connections open.
 *
 * Every read has a deadline; nothing here blocks longer than it is told.
 * @locality: the test's main thread. */
#ifndef ML_TEST_GW_CLIENT_H
#define ML_TEST_GW_CLIENT_H

#include <poll.h>

#include "proc_util.h"

/* The gateway's reply topic for the implicit tenant with gateway.instance
 * GWT_INSTANCE: the tests create it in the mock cluster. */
#define GWT_INSTANCE "test"
#define GWT_REPLY_TOPIC PU_REPLIES ".gw-" GWT_INSTANCE
#define GWT_TOPICS PU_REQUESTS ":4," PU_REPLIES ":4," PU_DLT ":1," PU_CANCEL ":1," GWT_REPLY_TOPIC ":4"

typedef struct gwt_gateway {
    pu_proc proc;
    int port, ops_port;
} gwt_gateway;

/* Start `mllama gateway` named `name` (log <dir>/<name>.log) over env (its
 * Kafka, its Redis for the adapter names) with the test defaults, then `extra` (--set overrides, NULL-terminated, may be
 * NULL). Waits for its port file. */
bool gwt_start(gwt_gateway *g, const pu_worker_env *env, const char *name,
               const char *const *extra);

/* A connected socket to 127.0.0.1:port (receive timeout timeout_ms), or -1. */
int gwt_connect(int port, int timeout_ms);

/* The whole of buf on fd; false when the peer is gone. */
bool gwt_send(int fd, const void *buf, size_t len);

/* "POST path" (or any method) with an optional body and extra header lines
 * ("Authorization: Bearer x\r\n"), sent on a new connection. Returns the fd
 * (-1 on failure). */
int gwt_send_request(int port, const char *method, const char *path, const char *extra_headers,
                     const char *body, int timeout_ms);

/* A response read from a connection, bytes as they arrive. */
typedef struct gwt_response {
    int status;        /* 0 until the status line is in */
    char *head;        /* owned: the status line and headers, NUL-terminated */
    char *body;        /* owned: the body, chunk framing removed, NUL-terminated */
    size_t body_len;
    bool complete;     /* the last chunk (or Content-Length, or the close) arrived */
    bool closed;       /* the peer closed the connection */
    /* raw bytes not yet decoded */
    char *raw;
    size_t raw_len, raw_cap;
} gwt_response;

/* Read from fd into r until `until` (NULL: the whole response) occurs in the
 * body, the response is complete, the peer closes, or timeout_ms passes.
 * Returns whether the condition was met (a NULL `until`: complete). */
bool gwt_read(int fd, gwt_response *r, const char *until, int timeout_ms);

void gwt_response_free(gwt_response *r);

/* A header's value (case-insensitive name) copied into out; false when absent. */
bool gwt_header(const gwt_response *r, const char *name, char *out, size_t cap);

/* One request, its whole response (Connection: close), in r. */
bool gwt_call(int port, const char *method, const char *path, const char *extra_headers,
              const char *body, gwt_response *r, int timeout_ms);

/* The SSE events of a body, checked strictly: every event is exactly
 * "id: <n>\ndata: <text>\n\n" (keep-alive comments ": ...\n\n" skipped), the
 * ids run first_id, first_id+1, ... Returns the number of events, or -1 with
 * a check failure naming the first violation. datas (may be NULL) gets a
 * malloc'd array of the events' data, owned strings (gwt_events_free). */
int gwt_events(const char *body, long first_id, char ***datas);
void gwt_events_free(char **datas, int n);

/* The concatenated choices[0].delta.content of chunk events (malloc'd). */
char *gwt_stream_text(char **datas, int n);

/* A chat body: one user message (an image part when image_part is non-NULL,
 * then text) and `extra` members ("\"max_tokens\":8,..." or ""). Malloc'd. */
char *gwt_chat_body(const char *text, const char *image_part, const char *extra);

#endif
