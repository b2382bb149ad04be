/* A tool call as it is generated: the answer's text, fed as it streams,
 * split into what OpenAI's replies carry, prose `content` or one call's
 * function name and `arguments` (service/protocol/README.md, "Tools").
 *
 * The model writes a call the Llama 3.1 way, {"name": N, "parameters": P},
 * the whole answer; the worker's grammar makes it so (request_tools.c), so
 * the scanner here only finds where the name and P are, byte by byte, with
 * whitespace anywhere JSON allows it. Fed anything else it never reads out
 * of bounds and simply finds no call (fuzz_tool_stream). An answer that may
 * be prose (tool_choice "auto") is prose exactly when its first byte that
 * is not whitespace is not '{', the runtime's own rule
 * (ml_sampling_params.grammar_on_brace); leading whitespace is held back
 * until that byte comes, then given as content (prose) or dropped (a
 * call).
 *
 * @locality any thread; one stream belongs to one answer and one thread at
 * a time. */
#ifndef SVC_PROTOCOL_TOOL_STREAM_H
#define SVC_PROTOCOL_TOOL_STREAM_H

#include <stdbool.h>
#include <stddef.h>

#include "protocol/protocol.h"

/* "call_" and 24 hex digits, OpenAI's length. */
#define SVC_TOOL_CALL_ID_LEN 29
/* Leading whitespace held back before an answer's first byte: the
 * grammar's own bound on a run of it (ML_JSON_MAX_WHITESPACE) is lower, so
 * more is never held (and is given as prose). */
#define SVC_TOOL_LEAD_MAX 128

typedef enum svc_tool_phase {
    SVC_TOOL_PHASE_UNDECIDED, /* only whitespace so far (auto) */
    SVC_TOOL_PHASE_PROSE,     /* a text answer */
    SVC_TOOL_PHASE_CALL,      /* a call: its head or its arguments */
} svc_tool_phase;

typedef struct svc_tool_stream {
    svc_tool_phase phase;
    int state;                 /* where in the call (tool_stream.c) */
    bool in_string, escape;    /* inside a JSON string of the call, after a backslash */
    int depth;                 /* brackets open inside the arguments */
    char key[16];              /* the member key being read (longer keys are cut: none matters) */
    size_t key_len;
    char name[SVC_OPENAI_NAME_MAX + 1];
    size_t name_len;
    bool named, named_told, complete;
    bool args_done;            /* the parameters' value ended: a repeated key is not passed on */
    char lead[SVC_TOOL_LEAD_MAX];
    size_t lead_len;
    svc_buf prose;             /* the first prose fragment after held whitespace */
} svc_tool_stream;

/* What one fragment of the answer adds. Pointers borrow the fragment or
 * the stream, until the next call on the stream. */
typedef struct svc_tool_delta {
    const char *content;   /* prose: the fragment, held whitespace first */
    size_t content_len;
    bool call_begins;      /* the call's name is known now (svc_tool_stream_name) */
    const char *arguments; /* the call's arguments: bytes of P in this fragment */
    size_t arguments_len;
} svc_tool_delta;

/* A stream at the start of an answer: `call`: the answer is a call
 * (tool_choice required or a named function); else it may be prose (auto).
 * ts may hold anything (a stream used before is deinit'ed first). */
void svc_tool_stream_init(svc_tool_stream *ts, bool call);

/* Frees what the stream holds; init again to reuse it. */
void svc_tool_stream_deinit(svc_tool_stream *ts);

/* Feed the next len bytes of the answer. Out of memory for held
 * whitespace (at most SVC_TOOL_LEAD_MAX bytes), that whitespace is
 * dropped. */
svc_tool_delta svc_tool_stream_feed(svc_tool_stream *ts, const char *s, size_t len);

/* The end of the answer: whitespace still held back, as prose (an answer
 * of nothing but whitespace). */
svc_tool_delta svc_tool_stream_end(svc_tool_stream *ts);

/* The call's function name (NUL-terminated) once call_begins was told,
 * else NULL. */
const char *svc_tool_stream_name(const svc_tool_stream *ts);

/* True when the answer is a call whose document is complete: its finish
 * reason is "tool_calls" (a call cut short keeps "length"). */
bool svc_tool_stream_called(const svc_tool_stream *ts);

/* The id of call `index` of request `request_id`'s answer: "call_" and the
 * first 24 hex digits of sha256(request id, NUL, index), so a new attempt
 * after a crash writes the same bytes (the gateway's continuation compares
 * them). out gets SVC_TOOL_CALL_ID_LEN + 1 bytes. */
void svc_tool_call_id(const char *request_id, unsigned index, char out[SVC_TOOL_CALL_ID_LEN + 1]);

#endif
