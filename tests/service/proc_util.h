/* Helpers for the tests that run `mllama worker` as a real process: spawning
 * and stopping processes (fork/execv, waitpid with a timeout, their output
 * in a file), a redis-server on a free port, `mllama mock-kafka`, the micro
 * model, a librdkafka client that produces requests and collects reply
 * records by request id, kcat through popen, and the checks every test
 * makes on a reply stream.
 *
 * Every wait polls for a condition up to a bound, so a broken worker fails
 * a test instead of hanging it, and nothing sleeps longer than it must.
 * Processes started here die with the test (PR_SET_PDEATHSIG) even when it
 * is killed by ctest's timeout. Everything runs on the test's main thread.
 *
 * Each test works in a fresh /tmp/mllama-<tag>-XXXXXX (model, logs of every
 * process), removed at the end unless a check failed or ML_KEEP_LOGS is set.
 *
 * The library ml_proc_util (proc_util.c, over svc: librdkafka, hiredis,
 * cJSON) is built against the `mllama` binary under test; the helpers that
 * run it are declared for a test compiled with ML_MLLAMA_BIN (the same
 * path), and a test that only runs redis-server (test_redis_index) goes
 * without them. */
#ifndef ML_TEST_PROC_UTIL_H
#define ML_TEST_PROC_UTIL_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <hiredis/hiredis.h>
#include <librdkafka/rdkafka.h>

#include "protocol/base64.h"
#include "harness.h"
#include "sha256.h"

#define PU_REQUESTS "mllama.requests"
#define PU_REPLIES "mllama.replies"
#define PU_DLT "mllama.dlt"
#define PU_CANCEL "mllama.cancel"
#define PU_PATH_MAX 512
/* The micro model's end tokens (mkmodel writes Llama 3.1's eos_token_id). */
#define PU_END_OF_TEXT 128001
#define PU_EOM 128008
#define PU_EOT 128009
#define PU_STR(x) #x
#define PU_XSTR(x) PU_STR(x)
/* A request's "logit_bias" member banning those end tokens: a stream that a
 * test means to interrupt then ends at its max_tokens or by the test's hand,
 * never by drawing one (sampled, the micro model draws one within a few
 * hundred tokens; greedy, where depends on the prompt, and the chat template
 * writes today's date into it: "Count to a million." ended at ~5,300 tokens
 * in December 2026's first days and at 1,706 on 2026-12-08, a second on one
 * thread, sooner than a cancel reached it). */
#define PU_BAN(id) "\"" PU_XSTR(id) "\":-100"
#define PU_NO_STOP \
    "\"logit_bias\":{" PU_BAN(PU_END_OF_TEXT) "," PU_BAN(PU_EOM) "," PU_BAN(PU_EOT) "}"
#define PU_START_MS 20000  /* a process reaching its ready state (ASan builds are slow) */
#define PU_POLL_MS 20
#define PU_MAX_FD 65536    /* descriptors a child closes before exec */

/* A sanitizer build runs the model several times slower: a test that needs
 * requests to stream for a while divides their tokens by this, so both
 * builds stream for about as long. */
#if defined(__SANITIZE_ADDRESS__)
#define PU_SLOWDOWN 4
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PU_SLOWDOWN 4
#endif
#endif
#ifndef PU_SLOWDOWN
#define PU_SLOWDOWN 1
#endif
/* A process exiting after SIGTERM. A sanitizer build takes longer: its exit
 * unpoisons every mapping it frees, and the CUDA host execution model maps
 * the whole device memory pool (a shadow of gigabytes to clear). */
#define PU_STOP_MS (20000 * PU_SLOWDOWN)

int64_t pu_now_ms(void);

int64_t pu_now_us(void);

void pu_sleep_ms(int ms);

/* A fatal setup failure: the test cannot go on. */
_Noreturn void pu_die(const char *what);

/* ---- files -------------------------------------------------------------------- */

/* The whole file, NUL-terminated (malloc'd, owned by the caller), or NULL.
 * *len (if non-NULL) gets its size. */
char *pu_slurp(const char *path, size_t *len);

/* The bytes of image file `path` (malloc'd, owned by the caller) and their
 * sha256 in lower-case hex into `hex`; exits when the file cannot be read. */
uint8_t *pu_slurp_image(const char *path, size_t *len, char hex[ML_SHA256_HEX_SIZE]);

bool pu_write_file(const char *path, const void *data, size_t len);

/* A fresh directory /tmp/mllama-<tag>-XXXXXX into dir (PU_PATH_MAX). */
void pu_tmpdir(const char *tag, char *dir);

/* Remove a directory tree (the test's temporary directory). */
void pu_rmtree(const char *dir);

/* At the end of a test: remove its directory, or keep it (and say where)
 * when a check failed or ML_KEEP_LOGS is set, for the workers' logs. */
void pu_tmpdir_done(const char *dir);

/* Occurrences of needle in the file at path (0 when unreadable). */
int pu_file_count(const char *path, const char *needle);

/* True when `prog` is an executable on PATH. */
bool pu_which(const char *prog);

/* ---- processes ----------------------------------------------------------------- */

typedef struct pu_proc {
    pid_t pid;              /* 0: never started */
    int status;             /* waitpid status once reaped */
    bool reaped;
    char log[PU_PATH_MAX + 128]; /* stdout and stderr */
} pu_proc;

/* Start argv[0] (a path) with stdout and stderr appended to `log`. Returns
 * whether the fork succeeded (an exec failure shows as exit code 127). */
bool pu_spawn(pu_proc *p, const char *log, char *const argv[]);

/* Reap p if it has exited, waiting up to timeout_ms. Returns whether it has
 * exited (now or before). */
bool pu_wait_exit(pu_proc *p, int timeout_ms);

bool pu_running(pu_proc *p);

/* The exit code of a reaped process; 128 + signal when a signal ended it. */
int pu_exit_code(const pu_proc *p);

void pu_signal(pu_proc *p, int sig);

/* SIGKILL and reap. */
void pu_kill(pu_proc *p);

/* SIGTERM, wait up to timeout_ms, then SIGKILL. Returns the exit code (-1
 * when it had to be killed). */
int pu_stop(pu_proc *p, int timeout_ms);

/* Wait until the process's log holds `needle` at least `count` times.
 * Returns false at the timeout or when the process exits first. */
bool pu_wait_log(pu_proc *p, const char *needle, int count, int timeout_ms);

/* Run argv to completion (output to log), up to timeout_ms. Returns the exit
 * code, or -1 when it had to be killed. */
int pu_run(char *const argv[], const char *log, int timeout_ms);

/* Print the tail of a process's log (to explain a failure). */
void pu_show_log(const char *log, size_t tail);

/* No sanitizer report in a log: ASan, LeakSanitizer and UBSan all write
 * these markers. Checked for every worker a test ran. */
void pu_check_log_clean(const char *log);

/* SIGTERM a worker and check that it drained: exit code 0 (the tail of its
 * log shown otherwise) and no sanitizer report in its log. */
void pu_worker_drain(pu_proc *p);

/* ---- redis-server ----------------------------------------------------------------- */

int pu_free_port(void);

typedef struct pu_redis {
    pu_proc proc;
    int port;
    char dir[PU_PATH_MAX];
    char url[64]; /* redis://127.0.0.1:<port>/0 */
} pu_redis;

/* A reply to one command on a new connection (NULL when the server is not
 * reachable); the caller frees it with freeReplyObject. */
redisReply *pu_redis_cmd(const pu_redis *r, const char *fmt, ...);

/* pu_redis_cmd on the server at 127.0.0.1:port, after AUTH user pw when
 * user is non-NULL (a command the user may not run gets its error reply). */
redisReply *pu_redis_cmd_as(int port, const char *user, const char *pw, const char *fmt, ...);

/* Calls of `command` counted in `info`, a reply to INFO commandstats: 0 when
 * never called, -1 when info is no such reply (NULL included). */
long pu_redis_calls(const redisReply *info, const char *command);

/* EXISTS key: 1, 0, or -1 when the server does not answer. */
int pu_redis_exists(const pu_redis *r, const char *key);

/* Wait up to timeout_ms for key to exist (a worker's index thread writes
 * it after the reply). Returns whether it does. */
bool pu_redis_wait_exists(const pu_redis *r, const char *key, int timeout_ms);

/* Start redis-server on r->port (0: a free one) with no persistence, its
 * files under dir, and wait until it answers PING. */
bool pu_redis_start(pu_redis *r, const char *dir, int port);

/* A fake Redis that trickles: it accepts every connection and answers any
 * command with the start of a long bulk string, one byte per
 * PU_TRICKLE_BYTE_MS, for PU_TRICKLE_FOR_MS per connection, then hangs up.
 * Each read of a client then gets a byte within any timeout of its own, so
 * only a total deadline ends a call before the server does. It accepts on a
 * thread of its own and serves each connection on another. */
#define PU_TRICKLE_BYTE_MS 20
#define PU_TRICKLE_FOR_MS 20000
typedef struct pu_trickle {
    int listen_fd, port;
    pthread_t thread;
    atomic_bool stop;
    atomic_int serving; /* connections being served */
    char url[64]; /* redis://127.0.0.1:<port>/0 */
} pu_trickle;
bool pu_trickle_start(pu_trickle *t);
void pu_trickle_stop(pu_trickle *t);

/* ---- mllama processes --------------------------------------------------------------- */

#ifdef ML_MLLAMA_BIN
#define PU_MLLAMA ML_MLLAMA_BIN

/* Write the micro model (56-pixel tiles: images cost milliseconds) to dir. */
bool pu_make_model(const char *dir, const char *log);

/* More `mllama mock-kafka` arguments (up to PU_MOCK_ARGS_MAX, NULL-
 * terminated), for a test that injects faults (--topic-error); set before
 * the mock starts. */
#define PU_MOCK_ARGS_MAX 8
extern const char *const *pu_mock_kafka_args;

/* `mllama mock-kafka` with topics "name:parts,..."; its bootstrap servers go
 * to bootstraps (cap bytes). */
bool pu_mock_kafka_start(pu_proc *p, const char *dir, const char *topics,
                         char *bootstraps, size_t cap);

/* What every worker of a test shares. */
typedef struct pu_worker_env {
    const char *brokers;
    const char *redis_url;
    const char *model_dir;
    const char *dir; /* logs go to <dir>/<name>.log */
} pu_worker_env;

/* The processes and files of a worker test: what pu_micro_stack_start
 * starts, and the workers a test runs over it (up to PU_STACK_WORKERS). */
#define PU_STACK_WORKERS 3
typedef struct pu_stack {
    char dir[PU_PATH_MAX]; /* "" until started */
    char model[PU_PATH_MAX + 16];
    char brokers[256];
    pu_redis redis;
    pu_proc kafka;
    pu_proc workers[PU_STACK_WORKERS];
    pu_worker_env env; /* the addresses above, for pu_worker_start */
} pu_stack;

/* pu_micro_stack_start into s (static: it is stopped at exit, after a
 * failed check or pu_die too). One stack per test. Skips the test (77)
 * without redis-server on PATH; dies on any other failure. */
void pu_stack_start(pu_stack *s, const char *tag, const char *topics);

/* Kill every process of s and pu_tmpdir_done its directory. Safe to call
 * again, and before pu_stack_start returned. */
void pu_stack_stop(pu_stack *s);

/* The usual stack of a worker test, in a fresh pu_tmpdir(tag, dir): the
 * micro model in dir/micro (path to model, PU_PATH_MAX + 16 bytes), a
 * redis-server and a mock Kafka cluster with `topics` (bootstraps to
 * brokers, cap bytes). Dies on any failure. */
void pu_micro_stack_start(const char *tag, char *dir, char *model,
                          pu_redis *redis, pu_proc *kafka, const char *topics,
                          char *brokers, size_t cap);

#define PU_MAX_SETS 24

/* The settings every test worker gets after its addresses. Group timings
 * small enough for the mock's rebalance rounds (about session.timeout.ms -
 * 1 s each); frequent commits; a short fetch wait, because the mock answers
 * a Fetch that finds no data only after fetch.wait.max.ms and is not woken
 * by a produce (the 500 ms default delays every request by up to 500 ms);
 * fast Redis heartbeats; one CPU thread per worker (tests run several on
 * two cores); an ephemeral HTTP port. */
static const char *const pu_worker_defaults[] = {
    "http.listen=127.0.0.1:0",         "kafka.session.timeout.ms=3000",
    "kafka.heartbeat.interval.ms=500", "kafka.auto.commit.interval.ms=500",
    "kafka.fetch.wait.max.ms=20",      "redis.heartbeat_s=1",
    "model.threads=1",
};

/* A configuration file every worker started from now on loads (--config;
 * what only a file can set, such as "tenants"); NULL: none. */
extern const char *pu_worker_config;

/* Start `mllama worker` named `name` (its worker_id and log <dir>/<name>.log)
 * with pu_worker_config, pu_worker_defaults, then the `extra` --set overrides
 * (NULL-terminated, may be NULL; a later setting of a key wins). Waits for
 * worker_started. */
bool pu_worker_start(pu_proc *p, const pu_worker_env *env, const char *name,
                     const char *const *extra);

/* The worker's HTTP port, from its worker_started line; -1 if not found. */
int pu_worker_http_port(const pu_proc *p);

/* GET http://127.0.0.1:port/path; the response body (malloc'd) or NULL. */
char *pu_http_get(int port, const char *path);

/* Sum of every sample of a Prometheus metric (all label sets); -1 when the
 * page could not be read. */
double pu_metric(int port, const char *name);

/* Wait until the worker holds at least one partition of the request topic
 * (its mllama_kafka_assigned_partitions gauge). */
bool pu_wait_assigned(pu_proc *p, int timeout_ms);

#endif /* ML_MLLAMA_BIN */

/* ---- kcat ---------------------------------------------------------------------- */

/* Run a shell command and return its stdout (malloc'd; NULL if it could not
 * run). *code gets its exit status. */
char *pu_shell(const char *cmd, int *code);

/* ---- request bodies ------------------------------------------------------------- */

/* The Redis key part (<p>:img:<key>, <p>:blob:img:<key>) of the image whose
 * bytes have sha256 content_hex, in cache group `group`'s partition: the
 * hex of ml_image_state_key over svc_cache_salt(group), as a frontend
 * computes it. */
void pu_image_key(const char *group, const char *content_hex, char out[ML_SHA256_HEX_SIZE]);

/* "data:image/jpeg;base64,..." of bytes (malloc'd). */
char *pu_data_url(const void *bytes, size_t n);

/* A chat request body: one user message with `image_part` (a JSON content
 * part, or NULL) then the text, reply_topic mllama.replies, and `extra`
 * top-level members ("\"max_tokens\":8,...", or ""). Malloc'd. */
char *pu_chat_request(const char *id, const char *text, const char *image_part,
                      const char *extra);

/* {"type":"image_url","image_url":{"url":"<data url>"}} for bytes (malloc'd). */
char *pu_image_part(const void *bytes, size_t n);

/* ---- a Kafka client ---------------------------------------------------------------- */

/* One record read back (replies or dead letters). */
typedef struct pu_record {
    char *topic, *key, *value;      /* owned, NUL-terminated ("" when absent) */
    int32_t partition;
    int64_t offset;
    int64_t attempt;                /* header; -1 when absent */
    int seq;                        /* header; -1 when absent */
    bool final;                     /* header final == "true" */
    char *headers;                  /* owned: "name=value\n..." of every header */
    int64_t t_us;                   /* monotonic microseconds when it was read */
} pu_record;

/* The next offset the client's consumer is due on one partition. */
typedef struct pu_client_position {
    char topic[64];
    int32_t partition;
    int64_t next;
} pu_client_position;

#define PU_CLIENT_POSITIONS 32

typedef struct pu_client {
    rd_kafka_t *producer, *consumer;
    pu_record *recs;
    size_t n, cap;
    /* A consumer can deliver an offset again after an outage (a fetch
     * restarted from an older position): such a record is kept once, so the
     * stream checks see what was produced, not how often it was read. */
    pu_client_position pos[PU_CLIENT_POSITIONS];
    int n_pos;
    int rereads;
    int delivery_errors;
    int32_t last_partition; /* where the last produced record went */
    int64_t last_offset;
} pu_client;

/* fetch.wait.max.ms of the client's consumer: the mock answers a Fetch that
 * finds nothing only after it, so it bounds how late a reply is seen (a
 * benchmark lowers it before pu_client_init). */
extern const char *pu_client_fetch_wait_ms;
/* message.max.bytes of the client's producer: a test that sends records
 * over librdkafka's default raises it before pu_client_init. */
extern const char *pu_client_message_max_bytes;

void pu_client_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque);

rd_kafka_conf_t *pu_client_conf(const char *brokers);

/* A producer (idempotent, no linger) and a consumer that reads every
 * partition of `topics` (n of them) from the beginning. */
void pu_client_init(pu_client *c, const char *brokers, const char *const *topics,
                    int n_topics);

void pu_client_deinit(pu_client *c);

char *pu_strndup0(const void *p, size_t n);

/* Produce one record (key may be NULL; headers: n_headers name/value pairs
 * as 2*n strings) and wait for its delivery. partition -1: by key. */
bool pu_client_send_to(pu_client *c, const char *topic, int32_t partition,
                       const char *key, const void *value, size_t len,
                       const char *const *headers, int n_headers);

/* A request keyed by its id. */
bool pu_client_send(pu_client *c, const char *id, const char *body);

/* A decimal header (attempts go up to 2^32 - 1: worker.h); -1 when absent. */
int64_t pu_header_num(rd_kafka_headers_t *hs, const char *name);

/* Read whatever arrived within timeout_ms (at least one poll). Returns the
 * number of records read. */
int pu_client_poll(pu_client *c, int timeout_ms);

/* Records of request `id` on the reply topic, in arrival order: up to max
 * pointers into the client (valid until the next poll). Returns the count. */
size_t pu_client_replies(const pu_client *c, const char *id, const pu_record **out,
                         size_t max);

/* The last final record of request `id`, or NULL. */
const pu_record *pu_client_final(const pu_client *c, const char *id);

/* pu_client_replies and pu_client_final on reply topic `topic` (they read
 * PU_REPLIES). */
size_t pu_client_replies_on(const pu_client *c, const char *topic, const char *id,
                            const pu_record **out, size_t max);
const pu_record *pu_client_final_on(const pu_client *c, const char *topic, const char *id);

/* The first record on `topic` whose key is `key`, or NULL. */
const pu_record *pu_client_find(const pu_client *c, const char *topic,
                                const char *key);

/* Poll until every one of the n ids (id i is ids + i * stride) has a final
 * record, up to timeout_ms. Returns how many have one. */
int pu_client_wait_finals(pu_client *c, const char *ids, size_t stride, int n,
                          int timeout_ms);

/* Wait for the final record of one request (NULL at the timeout). */
const pu_record *pu_client_wait(pu_client *c, const char *id, int timeout_ms);

/* End offsets (high watermarks) of partitions 0..n-1 of topic. */
bool pu_end_offsets(pu_client *c, const char *topic, int n, int64_t *out);

/* Offsets committed by `group` for partitions 0..n-1 of topic (negative
 * when none), read through a handle of its own that does not join. */
bool pu_committed(const char *brokers, const char *group, const char *topic, int n,
                  int64_t *out);

/* The delivery contract on the records of one request: within each attempt
 * the seqs run 0, 1, 2, ... in order with no gap or duplicate, at most one
 * final record which is the attempt's last; at least one attempt ends with a
 * final record. Attempts are told apart by their number, whatever it is
 * (uncounted ones are large: worker.h). With `lossy` (a worker may have
 * lost records: worker.h), an attempt superseded by a later one may skip
 * seqs, and may show a record again, byte for byte: librdkafka's mock
 * cluster does not drop an idempotent producer's retry of a batch it stored
 * just before its broker went down (a broker drops it by its sequence
 * number), and a frontend drops an (attempt, seq) it has seen
 * (service/protocol/README.md, "Delivery contract for frontends"). Returns
 * the number of attempts seen (0 when there are no records), reporting
 * violations as check failures. */
typedef struct pu_attempt_state {
    int64_t attempt;
    int next_seq;
    bool done;
} pu_attempt_state;

/* Whether a record before c->recs[i] has r's topic, key, attempt, seq and value. */
bool pu_seen_before(const pu_client *c, size_t i, const pu_record *r);

int pu_check_stream_at(const pu_client *c, const char *id, bool lossy);

int pu_check_stream(const pu_client *c, const char *id);

/* pu_check_stream_at on reply topic `topic` (it reads PU_REPLIES). */
int pu_check_stream_on(const pu_client *c, const char *topic, const char *id, bool lossy);

/* Parse a record value (cJSON, owned by the caller) and return it, or NULL
 * after a check failure. */
cJSON *pu_json(const pu_record *r);

/* The item at a path of object keys / array indexes ("choices", "0",
 * "finish_reason"), NULL-terminated; NULL when absent. */
const cJSON *pu_json_at(const cJSON *j, const char *const *path);

/* The string at a path (pu_json_at); NULL when absent or not a string. */
const char *pu_json_str(const cJSON *j, const char *const *path);

/* The number at a path (pu_json_at); NAN when absent. */
double pu_json_num(const cJSON *j, const char *const *path);

#define PU_PATH(...) ((const char *const[]){__VA_ARGS__, NULL})

/* finish_reason of a chunk or completion record. */
const char *pu_finish_reason(const cJSON *j);

/* Run `cmd`, an `mllama run ... --json` command line; the "text" of the JSON
 * object it prints (malloc'd), or NULL after a failed check naming its exit
 * code and output. */
char *pu_run_text(const char *cmd);

/* error.code of a final record, or NULL. */
const char *pu_error_code(const cJSON *j);

#endif
