/* The request/reply protocol of the worker (README.md here): parsing and
 * validating one request record, and building the reply records and their
 * headers.
 *
 * ---- Request record ----------------------------------------------------
 * Key: the request id (optional, see precedence). Value: one JSON object,
 * not NUL-terminated (parsed with cJSON_ParseWithLengthOpts):
 *
 *   field               type                      default     rule
 *   id                  string                    -           1..max_id_bytes, no control chars
 *   reply_topic         string                    -           a Kafka topic name: [A-Za-z0-9._-]{1,249}
 *   messages            array, required           -           1..max_messages, see below
 *   adapter             string                    base model  [A-Za-z0-9._-]{1,128}, not starting with '.'
 *   max_tokens          integer                   limits      1..max_tokens_limit
 *     (max_completion_tokens is accepted as an alias; giving both is an error)
 *   temperature         number                    1.0         [0, 2]; 0 = greedy
 *   top_p               number                    1.0         (0, 1]
 *   top_k               integer                   0 (off)     >= 0
 *   min_p               number                    0 (off)     [0, 1)
 *   repetition_penalty  number                    1.0 (off)   > 0 and <= 10
 *   presence_penalty    number                    0           [-2, 2]
 *   frequency_penalty   number                    0           [-2, 2]
 *   seed                integer                   none        |seed| <= 2^53 - 1 (exact in JSON)
 *   stop                string | array of string  none        up to max_stop, each 1..max_stop_bytes
 *   logprobs            bool                      false
 *   top_logprobs        integer                   0           0..20; > 0 needs logprobs: true
 *   logit_bias          object {"<id>": number}   none        at most 300 entries; keys token ids
 *                                                             in decimal, each once, below the
 *                                                             model's output vocabulary
 *                                                             (svc_limits.logit_vocab; <|image|>
 *                                                             has no logit); values in
 *                                                             [-100, 100], added to the logits
 *                                                             before sampling (-100 bans, 100
 *                                                             forces)
 *   n                   integer                   1           1..max_n: choices (each samples on
 *                                                             its own; with seed s, choice i as
 *                                                             n = 1 with seed s + i, so
 *                                                             s + n - 1 must stay in the seed's
 *                                                             range); max_n is limits.max_n
 *   deadline_ms         integer                   none        absolute unix ms, > 0
 *   stream              bool                      true        false: one chat.completion record
 *   response_format     {"type": T, ...}          text        T "text", "json_object" (JSON
 *                                                             mode: the answer is one JSON object)
 *                                                             or "json_schema", with
 *     "json_schema": {"name": N, "schema": S, "strict": B, "description": D}: N required,
 *     [A-Za-z0-9_-]{1,64}; S required, an object or a boolean, its compact JSON text at
 *     most max_schema_bytes; B bool, optional (the answer validates either way);
 *     D string, optional. Other members are ignored, as unknown fields are.
 *   date_string         string                    today (UTC) the chat template's "Today Date"
 *                                                             (svc_valid_date_string)
 *   tools               array of tools            none        1..SVC_TOOLS_MAX {"type": "function",
 *                                                             "function": {"name": N, "description": D,
 *                                                             "parameters": P, "strict": B}}: N
 *                                                             svc_valid_openai_name, each once; P a
 *                                                             JSON Schema object; the text counts
 *                                                             against max_text_bytes
 *   tool_choice         "none" | "auto" |         auto with   a named function must be one of the
 *                       "required" | {"type":     tools, else tools; anything but "none" needs
 *                       "function", "function":   none        tools, no image, no stop strings and
 *                       {"name": N}}                          no response_format but text
 *   parallel_tool_calls bool                      true        either way one call per turn
 *
 * JSON null is the same as an absent field (OpenAI clients send nulls).
 * Unknown fields (model, user, stream_options, ...) are ignored so that
 * clients can add fields before workers know them. Known fields that would
 * change the answer and are not supported are refused by name:
 * response_format of another type. Duplicate keys: the
 * first one counts (cJSON lookup order).
 *
 * messages[i]: {"role": "system"|"user"|"assistant"|"tool", "content": C};
 * other keys (name, tool_call_id, ...) are ignored. An assistant message
 * may carry "tool_calls": [one {"type": "function", "function": {"name": N,
 * "arguments": A}}], A a string holding a JSON object (its content is then
 * not read); a tool message's C is a string or an array of text parts,
 * kept as its JSON text. C is a string, or a non-empty array of parts:
 *   {"type":"text","text":"..."}
 *   {"type":"image_url","image_url":{"url":"data:image/jpeg;base64,..."}}
 *   {"type":"image_url","image_url":"data:image/jpeg;base64,..."}
 *   {"type":"image","sha256":"<64 hex>"}   (resident or Redis-held image)
 * Image parts are accepted in user messages only (as in the OpenAI API).
 * Only base64 data: URLs of type image/jpeg, image/png, image/webp, image/gif
 * or image/tiff are accepted; the image format is then told by its bytes, not by the
 * declared type. base64 is strict (base64.h). All kept strings must be valid UTF-8.
 *
 * Precedence of the addressing fields, first present wins:
 *   id:          header request_id > JSON id > record key
 *   reply_topic: header reply_topic > JSON reply_topic
 *   deadline_ms: header deadline_ms > JSON deadline_ms
 *   traceparent: header only (W3C trace-context; a malformed one is dropped)
 * Headers win because they are routing metadata: a gateway can set or
 * rewrite them without parsing and re-serialising a body that may hold
 * megabytes of images. The key comes last because producers may also use it
 * for partitioning. A present but invalid source is an error; it does not
 * fall through to the next one.
 *
 * ---- Reply records -------------------------------------------------------
 * Key: the request id. Headers: request_id, attempt, seq, final and
 * reproducible ("true" or "false", svc_headers_reply). stream: true gives
 * chat.completion.chunk records, seq 0, 1, ...:
 *   {"id":ID,"object":"chat.completion.chunk","created":S,"model":M,
 *    "choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},
 *                "logprobs":null,"finish_reason":null}],"seq":0,"attempt":1}
 * (role only in the record with seq 0). With n > 1 every chunk carries one
 * choice, "index" 0 .. n-1; the first chunk of each choice carries the
 * role, its last its finish_reason; then, once every choice has ended, the
 * final record: "choices":[] with usage (the prompt once, completion
 * tokens summed over the choices) and timings. With n = 1 the final record
 * is the choice's last chunk. A tool call streams as
 *   "delta":{"tool_calls":[{"index":0,"id":"call_..","type":"function",
 *            "function":{"name":N,"arguments":".."}}]}
 * where it begins, then {"index":0,"function":{"arguments":".."}}; a
 * completion's message has "content":null and "tool_calls" with the whole
 * call. The final record has a finish_reason
 * (stop, length, cancelled, error, tool_calls), "usage" {prompt_tokens,
 * prompt_tokens_cached, completion_tokens, total_tokens, images,
 * images_cached}, "timings"
 * {queue_ms, vision_ms, prefill_ms, decode_ms, ttft_ms} and, on failure,
 * "error": {"code","message"}. stream: false gives one record, seq 0:
 *   {"id":ID,"object":"chat.completion","created":S,"model":M,
 *    "choices":[{"index":0,"message":{"role":"assistant","content":"..."},
 *                "logprobs":null,"finish_reason":"stop"}],
 *    "usage":{...},"timings":{...},"seq":0,"attempt":1}
 * (n choices: "index" 0 .. n-1, each with its message, logprobs and
 * finish_reason).
 * Logprobs, when requested, follow OpenAI: {"content":[{"token","logprob",
 * "bytes",[...],"top_logprobs":[{"token","logprob","bytes"}]}]}.
 * Text is emitted as valid UTF-8 JSON: control characters are escaped and
 * invalid UTF-8 bytes become U+FFFD (the exact bytes are in "bytes").
 *
 * Dead-letter records keep the original key, value and headers and add
 * x-error-code, x-error-msg, x-original-topic, x-original-partition,
 * x-original-offset and x-worker; a value cut to fit gets x-truncated, a
 * key and headers dropped to fit get x-dropped (kafka.h).
 *
 * @locality any thread, for every function here: they keep no state
 * between calls (one caveat about cJSON at svc_request_parse). Objects
 * (requests, buffers, header sets) are used by one thread at a time.
 */
#ifndef SVC_PROTOCOL_H
#define SVC_PROTOCOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

/* ---- Errors ------------------------------------------------------------- */

/* Request-level outcomes. The strings (svc_error_code) are a stable wire
 * contract: clients switch on them. */
typedef enum svc_error {
    SVC_ERROR_NONE = 0,
    SVC_ERROR_INVALID_JSON,            /* "invalid_json": not one JSON value */
    SVC_ERROR_INVALID_REQUEST,         /* "invalid_request": a field is missing, mistyped or out of range */
    SVC_ERROR_INVALID_IMAGE,           /* "invalid_image": bad data URL, base64 or image bytes */
    SVC_ERROR_IMAGE_TOO_LARGE,         /* "image_too_large": over max_image_bytes once decoded */
    SVC_ERROR_UNKNOWN_ADAPTER,         /* "unknown_adapter": neither local nor in Redis */
    SVC_ERROR_ADAPTER_TOO_LARGE,       /* "adapter_too_large": over limits.max_adapter_bytes */
    SVC_ERROR_ADAPTER_UNAVAILABLE,     /* "adapter_unavailable": it may exist, but this worker
                                          cannot fetch or store it now (Redis failed, or
                                          model.adapters_dir is not writable) */
    SVC_ERROR_CONTEXT_LENGTH_EXCEEDED, /* "context_length_exceeded" */
    SVC_ERROR_DEADLINE_EXCEEDED,       /* "deadline_exceeded" */
    SVC_ERROR_CANCELLED,               /* "cancelled" */
    SVC_ERROR_REPLY_TOO_LARGE,         /* "reply_too_large": the answer may not fit in one
                                          record of limits.max_reply_bytes (stream: false) */
    SVC_ERROR_INTERNAL,                /* "internal": the worker failed, not the request */
    SVC_ERROR_TOO_MANY_ATTEMPTS,       /* "too_many_attempts": dead-letter only, the
                                          message crashed workers repeatedly */
    SVC_ERROR_REPLY_TOPIC_NOT_ALLOWED, /* "reply_topic_not_allowed": dead-letter only, the
                                          reply topic is outside kafka.reply_topics */
    SVC_ERROR_REPLY_UNDELIVERABLE,     /* "reply_undeliverable": dead-letter only, the reply
                                          topic refused the request's records */
} svc_error;

/* Stable lower-case wire string of an error ("invalid_json", ...); "none"
 * for SVC_ERROR_NONE. Never NULL. @locality any thread. */
const char *svc_error_code(svc_error e);

/* Capacity for the human message of a request error (err buffers). */
#define SVC_ERRMSG_MAX 256


/* ---- Limits ------------------------------------------------------------- */

#define SVC_TOPIC_NAME_MAX 249   /* Kafka's own limit on topic names */
#define SVC_ADAPTER_NAME_MAX 128
#define SVC_SHA256_HEX_LEN 64    /* lower-case hex digits of a sha256 */
#define SVC_TOP_LOGPROBS_MAX 20  /* as in the OpenAI API */
#define SVC_TRACEPARENT_LEN 55   /* "00-<32 hex>-<16 hex>-<2 hex>" */
/* What one token may add to a stream: false completion record, for the
 * bound checked at validation: its text JSON-escaped and, with logprobs,
 * each entry (token, logprob, "bytes" array). Typical tokens need 20 to 100
 * bytes; a completion that still outgrows limits.max_reply_bytes is
 * answered with reply_too_large when it is written. */
#define SVC_REPLY_ENTRY_BYTES 128
/* The rest of a completion record: id, model, usage, timings, framing. */
#define SVC_REPLY_FIXED_BYTES 4096
/* The largest limits.max_n a configuration may set: n choices are n
 * sequences of the batch, and no batch is configured this large. */
#define SVC_MAX_N_LIMIT 128
/* The default limits.max_n. */
#define SVC_MAX_N_DEFAULT 8
/* The default limits.max_tokens, and the largest a configuration may set:
 * Llama 3.2's context. */
#define SVC_MAX_TOKENS_DEFAULT 4096
#define SVC_MAX_TOKENS_LIMIT 131072
/* The longest date_string, in bytes: room for any spelling of a date. */
#define SVC_DATE_STRING_MAX 64
/* The longest request id the parser accepts by default (svc_limits.max_id_bytes);
 * buffers that hold an id (the worker's pending cancels) are sized by it. */
#define SVC_ID_MAX_BYTES 256
/* The longest name of a JSON schema (response_format) or a function
 * (tools), OpenAI's rule for both (svc_valid_openai_name). */
#define SVC_OPENAI_NAME_MAX 64
/* response_format json_schema: the default bound on a schema's text
 * (svc_limits.max_schema_bytes; the engine's own default,
 * ml_schema_limits_default). */
#define SVC_SCHEMA_BYTES_DEFAULT (256u << 10)
/* logit_bias: OpenAI's fixed limits, entries per request and the range of a
 * bias (the engine's ML_SAMPLE_MAX_BIAS and ML_SAMPLE_MAX_ABS_BIAS). */
#define SVC_LOGIT_BIAS_MAX 300
#define SVC_LOGIT_BIAS_ABS_MAX 100.0
/* tools: OpenAI's fixed limit on the tools of one request. */
#define SVC_TOOLS_MAX 128
/* The longest run of whitespace between two lexemes of a tool call
 * (ml_schema_limits.max_whitespace): the model writes calls the way
 * json.dumps does, one space after ':' and ',' (the template renders the
 * history's calls so), and one byte more leaves room for a newline; a
 * longer run is never a call the model was taught, and a model spinning on
 * whitespace would run out of max_tokens inside the call. */
#define SVC_TOOL_CALL_MAX_WHITESPACE 2

/* What one request may ask for; hostile input is bounded by these before
 * anything proportional to it is allocated. */
typedef struct svc_limits {
    size_t max_request_bytes; /* the record value */
    size_t max_json_values;   /* JSON values (objects, arrays, scalars): bounds cJSON's memory */
    size_t max_id_bytes;
    size_t max_messages;
    size_t max_parts;         /* content parts over all messages */
    size_t max_text_bytes;    /* text over all messages */
    size_t max_images;
    size_t max_image_bytes;   /* one decoded image */
    size_t max_stop;          /* stop strings */
    size_t max_stop_bytes;    /* one stop string */
    uint32_t max_tokens_default;
    uint32_t max_tokens_limit;
    size_t max_reply_bytes;   /* one reply record; 0 = unbounded */
    uint32_t max_n;           /* choices of one request (n), 1..SVC_MAX_N_LIMIT */
    size_t max_schema_bytes;  /* response_format json_schema: the schema's compact JSON text
                                 (below INT_MAX: cJSON prints into an int-sized buffer) */
    /* logit_bias ids must be below this: the model's output vocabulary (its
     * logit rows; <|image|> has none). Not a configured bound but the
     * model's: the worker sets it once the model is loaded; 0 = not known
     * here (the engine still refuses such ids at submit). */
    size_t logit_vocab;
} svc_limits;

/* Fill `lim` with the defaults: 32 MiB request, 65536 JSON values, 256-byte
 * id, 1024 messages, 4096 parts, 1 MiB text, 8 images of at most 20 MiB,
 * 4 stop strings of at most 256 bytes, max_tokens 256 by default and 4096 at
 * most, replies unbounded, n at most SVC_MAX_N_DEFAULT, a JSON schema of at most SVC_SCHEMA_BYTES_DEFAULT,
 * logit_bias ids not checked against a vocabulary (logit_vocab 0).
 * @locality any thread. */
void svc_limits_default(svc_limits *lim);

/* The bytes a stream: false completion of n choices of max_tokens tokens
 * may need, as validation bounds it: n x max_tokens x entries x
 * SVC_REPLY_ENTRY_BYTES + SVC_REPLY_FIXED_BYTES, with one entry per token
 * for the text and, with logprobs, 1 + top_logprobs more. @locality any
 * thread. */
size_t svc_reply_bound(uint32_t n, uint32_t max_tokens, bool logprobs, uint32_t top_logprobs);

/* ---- Parsed request ----------------------------------------------------- */

typedef enum svc_role {
    SVC_ROLE_SYSTEM = 0,
    SVC_ROLE_USER,
    SVC_ROLE_ASSISTANT,
    SVC_ROLE_TOOL,     /* a tool's result (the template's ipython turn) */
} svc_role;

/* "system", "user", "assistant" or "tool". Never NULL. @locality any thread. */
const char *svc_role_name(svc_role role);

typedef enum svc_part_kind {
    SVC_PART_TEXT = 0,
    SVC_PART_IMAGE,
} svc_part_kind;

/* One content part, in the order the client wrote it. */
typedef struct svc_part {
    svc_part_kind kind;
    const char *text; /* borrowed from the request; TEXT: NUL-terminated, valid UTF-8 */
    size_t text_len;
    uint32_t image;   /* IMAGE: index into svc_request.images */
} svc_part;

typedef struct svc_message {
    svc_role role;
    const svc_part *parts; /* borrowed from the request */
    size_t n_parts;        /* >= 1; a string content is one TEXT part; 0 for a tool call */
    /* An assistant message with tool_calls: its one call's function name
     * (svc_valid_openai_name) and arguments, the JSON text of an object
     * (the client's `arguments` string), both NUL-terminated; NULL for
     * any other message. */
    const char *tool_call_name;
    const char *tool_call_arguments;
    /* SVC_ROLE_TOOL: the content's JSON text as the client wrote it (a
     * string literal or an array of text parts), NUL-terminated: the chat
     * template renders it with its tojson filter. NULL otherwise. */
    const char *content_json;
} svc_message;

typedef enum svc_image_kind {
    SVC_IMAGE_INLINE = 0, /* decoded bytes from a data: URL */
    SVC_IMAGE_REF,        /* a sha256: resident on this worker or held in Redis */
} svc_image_kind;

typedef struct svc_image {
    svc_image_kind kind;
    const uint8_t *bytes; /* borrowed from the request; INLINE only, else NULL */
    size_t n_bytes;
    char sha256[SVC_SHA256_HEX_LEN + 1]; /* REF: lower-case hex; INLINE: "" (the
                                            runtime hashes the bytes) */
} svc_image;

/* One logit_bias entry: a token id and the bias added to its logit. */
typedef struct svc_logit_bias {
    int32_t id;   /* >= 0, below svc_limits.logit_vocab when that is set */
    float bias;   /* [-SVC_LOGIT_BIAS_ABS_MAX, SVC_LOGIT_BIAS_ABS_MAX] */
} svc_logit_bias;

typedef struct svc_sampling {
    float temperature;
    float top_p;
    int32_t top_k;
    float min_p;
    float repetition_penalty;
    float presence_penalty;
    float frequency_penalty;
    bool has_seed;
    int64_t seed;
    const svc_logit_bias *logit_bias; /* n_logit_bias (<= SVC_LOGIT_BIAS_MAX) distinct ids */
    size_t n_logit_bias;
} svc_sampling;

/* tool_choice: what the answer may be when the request has tools. */
typedef enum svc_tool_choice {
    SVC_TOOL_CHOICE_NONE = 0, /* text only: no tools, or "none" (tools not rendered) */
    SVC_TOOL_CHOICE_AUTO,     /* text, or one call: "auto", the default with tools */
    SVC_TOOL_CHOICE_REQUIRED, /* one call of any of the tools */
    SVC_TOOL_CHOICE_FUNCTION, /* one call of the named tool (svc_request.tool_named) */
} svc_tool_choice;

/* One of a request's tools ({"type": "function", "function": {...}}). */
typedef struct svc_tool {
    const char *name;   /* NUL-terminated, svc_valid_openai_name, distinct within the request */
    /* The tool object's JSON text exactly as the client wrote it
     * (NUL-terminated, json_len bytes): the chat template prints it with
     * Python's json.dumps, whose numbers (1.0 against 1) and key order only
     * the written text keeps. */
    const char *json;
    size_t json_len;
} svc_tool;

/* A validated request. Every pointer is borrowed from the request itself and
 * lives until svc_request_destroy; the record it was parsed from may be
 * freed at once. Read-only for its users. */
typedef struct svc_request {
    /* Addressing: filled as far as parsing got, also on failure. */
    const char *id;          /* NUL-terminated; NULL when it could not be determined */
    const char *reply_topic; /* NUL-terminated; NULL when it could not be determined */
    const char *traceparent; /* NUL-terminated; NULL when absent or malformed */
    bool stream;             /* true unless the body said "stream": false */

    /* The rest is valid only when parsing succeeded. */
    int64_t deadline_ms;     /* absolute unix ms; 0 = none */
    const char *adapter;     /* NULL = the base model */
    const svc_message *messages;
    size_t n_messages;
    const svc_image *images; /* in order of appearance; parts refer to them by index */
    size_t n_images;
    size_t n_text_bytes;     /* over all text parts */
    svc_sampling sampling;
    uint32_t max_tokens;     /* per choice */
    uint32_t n;              /* choices, 1..max_n */
    const char *const *stop; /* n_stop NUL-terminated strings */
    size_t n_stop;
    bool logprobs;
    uint32_t top_logprobs;
    bool json_object;        /* response_format {"type": "json_object"} */
    /* response_format {"type": "json_schema"}: the schema as compact JSON
     * text (NUL-terminated, json_schema_len <= max_schema_bytes), NULL when
     * none; its name ([A-Za-z0-9_-]{1,64}) and strict as the client gave
     * them (strict changes nothing: the answer is valid either way). The
     * schema is compiled by the worker, not here. */
    const char *json_schema;
    size_t json_schema_len;
    const char *json_schema_name;
    bool json_schema_strict;
    /* The chat template's "Today Date" (NUL-terminated, svc_valid_date_string);
     * NULL = the worker writes today's date. */
    const char *date_string;
    /* Tools (request_tools.c): rendered into the prompt unless tool_choice
     * is NONE; n_tools <= SVC_TOOLS_MAX. */
    const svc_tool *tools;
    size_t n_tools;
    svc_tool_choice tool_choice;
    size_t tool_named;       /* SVC_TOOL_CHOICE_FUNCTION: index into tools */
    bool parallel_tool_calls; /* as given (default true); one call per turn either way */
    /* With a tool choice other than NONE: the JSON Schema of a call,
     * {"name": <a tool's name>, "parameters": <its parameters>} for the
     * tools tool_choice allows (compact JSON, NUL-terminated,
     * tool_call_schema_len <= max_schema_bytes), compiled by the worker as
     * a response_format schema is. AUTO binds it only to an answer that
     * starts (after whitespace) with '{'. NULL otherwise. */
    const char *tool_call_schema;
    size_t tool_call_schema_len;
} svc_request;

/* A header value as it came off the wire: not NUL-terminated; ptr NULL =
 * header absent. */
typedef struct svc_bytes {
    const void *ptr; /* borrowed */
    size_t len;
} svc_bytes;

/* Everything svc_request_parse reads from one consumed record. */
typedef struct svc_request_input {
    const void *value;   /* borrowed: the record value */
    size_t value_len;
    const void *key;     /* borrowed: the record key; NULL if none */
    size_t key_len;
    svc_bytes request_id;  /* headers, last occurrence of each */
    svc_bytes reply_topic;
    svc_bytes deadline_ms;
    svc_bytes traceparent;
    int64_t now_ms;      /* unix ms for the deadline check; 0 skips the check */
} svc_request_input;

/* Parse and validate one request record against `lim`, decoding inline
 * images.
 *
 * Returns SVC_ERROR_NONE and a complete request in *out, or a request-level
 * error with a message naming the field in err (e.g. "messages[1].content[2]
 * .image_url.url: not a base64 data: URL"). On such an error *out still
 * receives a request (to destroy) whose addressing fields hold what could be
 * determined, so that an error reply can be sent when svc_request_answerable
 * says so, and the record can go to the dead-letter topic when not. When
 * the body is not readable JSON, the record key stands in for the id; a
 * body over max_request_bytes or max_json_values is not parsed at all, so
 * only the headers and the key can address its error reply.
 * Running out of memory is SVC_ERROR_INTERNAL; *out is NULL only when the
 * request object itself could not be allocated.
 * The deadline is checked (now_ms != 0) before any image is decoded.
 *
 * Ownership: borrows `in` and `lim` for the call; the request is owned by
 * the caller (svc_request_destroy).
 * @locality any thread. cJSON records parse errors in a process global, so
 * parsing on several threads at once is a benign data race inside cJSON:
 * keep parsing on one thread. */
svc_error svc_request_parse(const svc_request_input *in, const svc_limits *lim,
                            svc_request **out, char *err, size_t errlen);

/* True when the request has both an id and a reply topic, so an error reply
 * can be sent; false means the record can only go to the dead-letter topic.
 * @locality any thread. */
bool svc_request_answerable(const svc_request *req);

/* Free a request and everything it owns. NULL is a no-op.
 * @locality any thread, once no one reads the request. */
void svc_request_destroy(svc_request *req);

/* ---- Shared validators -------------------------------------------------- */

/* True for a Kafka topic name: [A-Za-z0-9._-]{1,249}, not "." or "..". */
bool svc_valid_topic(const char *s, size_t len);

/* The reply-topic policy (config kafka.reply_topics): `allowed` is a
 * comma-separated list of entries, each an exact topic name or a prefix
 * written as a name followed by '*' ("mllama.replies,mllama.replies.*").
 * Whatever it says, these are never allowed: the `reserved` topics (the
 * worker's request, cancel and dead-letter topics) and every topic whose
 * name starts with "__" (Kafka's internal topics). */
typedef struct svc_topic_policy {
    const char *allowed;          /* borrowed */
    const char *const *reserved;  /* borrowed: n_reserved NUL-terminated names */
    size_t n_reserved;
} svc_topic_policy;

/* True when topic[0..len) (not NUL-terminated) may receive replies: a valid
 * topic name (svc_valid_topic), not reserved, not "__"-prefixed, and equal
 * to an exact entry of p->allowed or starting with one of its prefixes.
 * Pure: reads only its arguments. @locality any thread. */
bool svc_reply_topic_allowed(const svc_topic_policy *p, const char *topic, size_t len);

/* Check p->allowed at configuration time: every entry a valid topic name,
 * or a non-empty prefix of one followed by '*'; none "__"-prefixed and none
 * naming a reserved topic exactly. Returns true, or false with the entry
 * and the reason in err. @locality any thread. */
bool svc_topic_policy_check(const svc_topic_policy *p, char *err, size_t errlen);

/* True when some topic name is allowed by an entry of a->allowed and by an
 * entry of b->allowed (equal names, a name under a prefix, or two prefixes
 * one of which starts the other), with the two entries in why. Reserved
 * topics are not considered. Pure. @locality any thread. */
bool svc_topic_policy_overlap(const svc_topic_policy *a, const svc_topic_policy *b, char *why,
                              size_t whylen);

/* True for a tenant or cache-group name: [a-z0-9_-]{1,48} (it becomes a
 * topic-name suffix and a Redis key part). */
#define SVC_TENANT_NAME_MAX 48
bool svc_valid_tenant_name(const char *s, size_t len);

/* True for a name OpenAI's rule allows for a JSON schema or a function:
 * [A-Za-z0-9_-]{1,SVC_OPENAI_NAME_MAX}. @locality any thread. */
bool svc_valid_openai_name(const char *s, size_t len);

/* True for an adapter name: [A-Za-z0-9._-]{1,128}, not starting with '.'
 * (it becomes a Redis key part and may name a directory). */
bool svc_valid_adapter_name(const char *s, size_t len);

/* True for a date_string: 1..SVC_DATE_STRING_MAX bytes of UTF-8 without
 * control characters (C0, DEL, C1). Only its shape is checked: any text a
 * client chooses to call the date ("26 Jul 2024", "2024-07-26") passes. */
bool svc_valid_date_string(const char *s, size_t len);

/* True for exactly 64 lower-case hex digits. */
bool svc_valid_sha256(const char *s, size_t len);

/* True for a W3C trace-context traceparent: "vv-<32 hex trace id>-<16 hex
 * parent id>-<2 hex flags>", lower-case, version not ff, ids not all zero. */
bool svc_valid_traceparent(const char *s, size_t len);

/* True when s[0..len) is valid UTF-8 (no overlongs, surrogates or code
 * points above U+10FFFF). On false, *bad (if non-NULL) is the offset of the
 * first invalid byte. @locality any thread (all validators). */
bool svc_utf8_valid(const char *s, size_t len, size_t *bad);
/* Length (1..4) of the valid UTF-8 sequence at s[0..n), or 0 when s[0]
 * does not start one (RFC 3629: no overlongs, no surrogates, <= U+10FFFF). */
size_t svc_utf8_seq_len(const unsigned char *s, size_t n);

/* ---- Reply records ------------------------------------------------------ */

typedef enum svc_finish {
    SVC_FINISH_NONE = 0, /* not the last record */
    SVC_FINISH_STOP,
    SVC_FINISH_LENGTH,
    SVC_FINISH_CANCELLED,
    SVC_FINISH_ERROR,
    SVC_FINISH_TOOL_CALLS, /* the answer is a complete tool call */
} svc_finish;

/* "stop", "length", "cancelled", "error", "tool_calls"; NULL for
 * SVC_FINISH_NONE. */
const char *svc_finish_name(svc_finish f);

/* The finish_reason that goes with an error: cancelled for
 * SVC_ERROR_CANCELLED and SVC_ERROR_DEADLINE_EXCEEDED (the work was
 * abandoned, not failed), error for the others. */
svc_finish svc_error_finish(svc_error e);

/* What stays the same across all records of one attempt. */
typedef struct svc_reply_ctx {
    const char *id;    /* borrowed: the request id */
    const char *model; /* borrowed: the served model's name */
    int64_t created;   /* unix seconds, the same in every record */
    uint32_t attempt;  /* execution number: 1, 2, ... as counted in Redis, or a unique
                          value >= 2^31 when Redis could not count it (worker.h) */
} svc_reply_ctx;

/* One token's log-probability. token is its text, possibly a partial UTF-8
 * sequence (emitted with U+FFFD; "bytes" carries the exact bytes). */
typedef struct svc_token_logprob {
    const char *token; /* borrowed */
    size_t token_len;
    float logprob;     /* -inf is written as -9999.0, as OpenAI does */
} svc_token_logprob;

typedef struct svc_logprob_entry {
    svc_token_logprob chosen;
    const svc_token_logprob *top; /* borrowed; n_top alternatives, most likely first */
    size_t n_top;
} svc_logprob_entry;

typedef struct svc_usage {
    uint32_t prompt_tokens;
    uint32_t prompt_tokens_cached; /* of those, K/V served from the prefix cache */
    uint32_t completion_tokens;
    uint32_t images;
    uint32_t images_cached; /* served from resident cross-attention states */
} svc_usage;

typedef struct svc_timings {
    double queue_ms;
    double vision_ms;
    double prefill_ms;
    double decode_ms;
    double ttft_ms;
} svc_timings;

/* One reply record. For stream: false (svc_reply_completion) `content` is
 * the whole answer and `logprobs` every token's entry. */
/* A tool call's share of a record (tool_stream.h). */
typedef struct svc_reply_call {
    const char *id;        /* borrowed: svc_tool_call_id's */
    /* borrowed: the function; in a chunk, only in the one where the call
     * begins (with id and type), NULL in those that carry arguments only */
    const char *name;
    const char *arguments; /* borrowed: the arguments' JSON text, this chunk's bytes of
                              it or, in a completion, all of it */
    size_t arguments_len;
} svc_reply_call;

typedef struct svc_reply {
    uint32_t seq;
    /* Chunks: the choice (n > 1); role says its first chunk, which carries
     * the role (as the seq 0 record always does). */
    uint32_t index;
    bool role;
    /* The final record of a request of n > 1 choices: "choices":[], usage
     * and timings (content, logprobs and finish are unused). */
    bool no_choices;
    const char *content;  /* borrowed; NULL or "" = no content */
    size_t content_len;
    const svc_reply_call *call; /* borrowed; NULL = none (the completion's content is then
                                   the message's; with a call it is null) */
    const svc_logprob_entry *logprobs; /* borrowed; NULL = "logprobs":null */
    size_t n_logprobs;
    svc_finish finish;    /* NONE for a non-final chunk */
    /* Final records only: */
    const svc_usage *usage;     /* borrowed; NULL = omitted */
    const svc_timings *timings; /* borrowed; NULL = omitted */
    svc_error error;            /* NONE, or the code of "error" */
    const char *error_message;  /* borrowed; NULL = "" */
} svc_reply;

/* Write one chat.completion.chunk record into `out` (replacing its
 * content). The seq 0 record carries delta.role "assistant".
 * Returns 0, or -1 when memory runs out (out is then empty).
 * @locality any thread; ctx and r are borrowed for the call. */
int svc_reply_chunk(svc_buf *out, const svc_reply_ctx *ctx, const svc_reply *r);

/* Write the single chat.completion record of a stream: false request
 * (r->seq should be 0). Returns 0 or -1 as svc_reply_chunk. */
int svc_reply_completion(svc_buf *out, const svc_reply_ctx *ctx, const svc_reply *r);

/* The same with n choices: r[i] is choice i (its content, logprobs and
 * finish); seq, usage, timings and error are r[0]'s. n = 1 writes what
 * svc_reply_completion writes. */
int svc_reply_completion_n(svc_buf *out, const svc_reply_ctx *ctx, const svc_reply *r,
                           size_t n);

/* Write the final error record of a request: a chunk, or a completion when
 * `stream` is false, with finish_reason svc_error_finish(e) and no usage.
 * Returns 0 or -1 as svc_reply_chunk. */
int svc_reply_error(svc_buf *out, const svc_reply_ctx *ctx, bool stream, uint32_t seq,
                    svc_error e, const char *message);

/* ---- Record headers ----------------------------------------------------- */

#define SVC_HEADERS_MAX 8
#define SVC_HEADERS_STORE 640 /* formatted numbers and the copied error message */

typedef struct svc_header {
    const char *name;  /* static string */
    const char *value; /* borrowed (see svc_headers) */
    size_t len;
} svc_header;

/* The headers of one outgoing record, ready for rd_kafka_headers_add or
 * RD_KAFKA_V_HEADER (which copy them). Values point either at the strings
 * the builder was given or into `store`: the struct points into itself, so
 * build it where it is used and pass it by pointer; never copy it. */
typedef struct svc_headers {
    size_t n;
    svc_header h[SVC_HEADERS_MAX];
    char store[SVC_HEADERS_STORE];
    size_t store_used;
} svc_headers;

/* Reply headers: request_id (borrowed), attempt, seq, final and
 * reproducible ("true" or "false"). reproducible says that another
 * execution of the request on a worker of the same configuration gives the
 * same records, bit for bit: the backend is batch invariant (the CPU
 * backend always; CUDA with runtime.batch_invariant), so a new attempt's
 * tokens do not depend on what else was batched. A frontend that has shown
 * part of an attempt may then continue from where it was instead of
 * starting over (service/protocol/README.md, "Delivery contract").
 * @locality any thread. */
void svc_headers_reply(svc_headers *hs, const char *request_id, uint32_t attempt,
                       uint32_t seq, bool final, bool reproducible);

/* Dead-letter headers: x-error-code, x-error-msg (copied, truncated to fit
 * the store), x-original-topic (borrowed), x-original-partition,
 * x-original-offset, and x-worker (borrowed; omitted when NULL).
 * @locality any thread. */
void svc_headers_dlt(svc_headers *hs, svc_error code, const char *message,
                     const char *topic, int32_t partition, int64_t offset,
                     const char *worker);

#endif
