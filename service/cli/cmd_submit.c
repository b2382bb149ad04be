/* `mllama submit`: send one chat request and stream its reply to the
 * terminal, as a chat frontend would: it reads the reply topic from the end
 * offsets it saw before producing, prints the deltas of its request id, and
 * starts over when a new attempt begins (a worker died mid-stream and
 * another one is answering). With --conversation it keys the record by the
 * conversation id, so the default partitioner puts every turn on one
 * partition (one worker, whose prefix cache holds the earlier turns); with
 * --redis, and no conversation, it routes the request to a partition owned
 * by the worker that holds the image resident.
 * @locality: the main thread. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "protocol/base64.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "engine.h"
#include "redis/redis.h"

#define CMD "mllama submit"
#define MAX_IMAGES 8
#define MAX_IMAGE_BYTES (20u << 20)
#define METADATA_TIMEOUT_MS 10000
#define POLL_MS 100
#define FLUSH_MS 10000
#define DEFAULT_TIMEOUT_S 300
#define MAX_RESPONSE_FORMAT_BYTES (16u << 20)

typedef struct submit_opts {
    const char *brokers, *topic, *reply_topic, *redis_url, *redis_prefix, *id, *adapter;
    const char *conversation;   /* the record key when given; NULL: the request id */
    const char *prompt;
    const char *response_format; /* a file holding the response_format object; NULL: none */
    const char *images[MAX_IMAGES];
    int n_images;
    long max_tokens, timeout_s;
    double temperature;
    int no_stream, quiet;
} submit_opts;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mllama submit --brokers HOST:PORT [--image FILE]... [--max-tokens N]\n"
            "                     [--temperature T] [--topic T] [--reply-topic T] [--id ID]\n"
            "                     [--adapter NAME] [--redis URL [--redis-prefix P]]\n"
            "                     [--conversation ID] [--no-stream] [--timeout S] [--quiet]\n"
            "                     [--response-format FILE] \"prompt\"\n\n"
            "Sends one chat request (images inline as data URLs, then the text) and\n"
            "streams the reply's text to stdout; the final record goes to stderr.\n"
            "--conversation ID keys the record by ID instead of the request id: every turn\n"
            "of a conversation goes to one partition, hence one worker and its prefix\n"
            "cache. It wins over --redis image routing (README.md \"Prefix cache\").\n"
            "--response-format FILE: the request's response_format, a JSON object such as\n"
            "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": {...}}}\n"
            "(README.md \"Protocol\"); the worker checks it.\n"
            "Exit 0 on finish_reason stop/length, 1 on error or timeout.\n");
}

static char *build_request(const submit_opts *o, char *sha_hex_out)
{
    cJSON *req = cJSON_CreateObject();
    cJSON_AddStringToObject(req, "id", o->id);
    cJSON_AddStringToObject(req, "reply_topic", o->reply_topic);
    cJSON_AddNumberToObject(req, "max_tokens", (double)o->max_tokens);
    cJSON_AddNumberToObject(req, "temperature", o->temperature);
    cJSON_AddBoolToObject(req, "stream", !o->no_stream);
    if (o->adapter)
        cJSON_AddStringToObject(req, "adapter", o->adapter);
    if (o->response_format) {
        size_t len;
        char *text = svc_read_file(CMD, o->response_format, MAX_RESPONSE_FORMAT_BYTES, &len);
        cJSON *format = text ? cJSON_ParseWithLength(text, len) : NULL;
        if (text && !cJSON_IsObject(format))
            fprintf(stderr, CMD ": %s: expected a JSON object\n", o->response_format);
        free(text);
        if (!cJSON_IsObject(format)) {
            cJSON_Delete(format);
            cJSON_Delete(req);
            return NULL;
        }
        cJSON_AddItemToObject(req, "response_format", format);
    }
    cJSON *msg = cJSON_CreateObject();
    cJSON_AddStringToObject(msg, "role", "user");
    cJSON *content = cJSON_AddArrayToObject(msg, "content");
    for (int i = 0; i < o->n_images; i++) {
        size_t len;
        char *bytes = svc_read_file(CMD, o->images[i], MAX_IMAGE_BYTES, &len);
        if (!bytes) {
            cJSON_Delete(req);
            cJSON_Delete(msg);
            return NULL;
        }
        if (i == 0) {
            uint8_t d[ML_SHA256_DIGEST_SIZE];
            ml_sha256(bytes, len, d);
            ml_sha256_hex(d, sha_hex_out);
        }
        /* Labelled by signature; anything else goes out as JPEG for the
         * worker to refuse with its own message. */
        const char *type = ml_image_media_type((const uint8_t *)bytes, len);
        char prefix[64];
        int plen = snprintf(prefix, sizeof prefix, "data:%s;base64,", type ? type : "image/jpeg");
        size_t enc = svc_base64_encoded_len(len);
        char *url = malloc((size_t)plen + enc + 1);
        if (!url) {
            free(bytes);
            cJSON_Delete(req);
            cJSON_Delete(msg);
            return NULL;
        }
        memcpy(url, prefix, (size_t)plen);
        svc_base64_encode((const uint8_t *)bytes, len, url + plen);
        free(bytes);
        cJSON *part = cJSON_CreateObject();
        cJSON_AddStringToObject(part, "type", "image_url");
        cJSON *iu = cJSON_AddObjectToObject(part, "image_url");
        cJSON_AddStringToObject(iu, "url", url);
        free(url);
        cJSON_AddItemToArray(content, part);
    }
    cJSON *text = cJSON_CreateObject();
    cJSON_AddStringToObject(text, "type", "text");
    cJSON_AddStringToObject(text, "text", o->prompt);
    cJSON_AddItemToArray(content, text);
    cJSON *msgs = cJSON_AddArrayToObject(req, "messages");
    cJSON_AddItemToArray(msgs, msg);
    char *s = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    return s;
}

/* The partition of the worker holding the image, or RD_KAFKA_PARTITION_UA. */
static int32_t route(const submit_opts *o, const char *sha_hex)
{
    if (!o->redis_url || !sha_hex[0])
        return RD_KAFKA_PARTITION_UA;
    svc_redis_config rc;
    svc_redis_config_default(&rc);
    rc.url = o->redis_url;
    rc.prefix = o->redis_prefix;
    rc.worker_id = "submit";
    svc_redis *r;
    char err[256], parts[1024];
    int32_t p = RD_KAFKA_PARTITION_UA;
    if (svc_redis_create(&rc, &r, err, sizeof err) != SVC_REDIS_OK) {
        fprintf(stderr, CMD ": redis: %s (sending without affinity)\n", err);
        return p;
    }
    if (svc_redis_route(r, sha_hex, parts, sizeof parts) == SVC_REDIS_OK) {
        const char *colon = strchr(parts, ':');
        if (colon && colon[1] >= '0' && colon[1] <= '9' &&
            !strncmp(parts, o->topic, (size_t)(colon - parts))) {
            p = (int32_t)atoi(colon + 1);
            fprintf(stderr, CMD ": image resident on a worker owning partition %d\n", p);
        }
    }
    svc_redis_destroy(r);
    return p;
}

/* Assign every partition of the reply topic at its current end, so the
 * reply cannot be missed and old records are not read. */
static int assign_reply_topic(rd_kafka_t *c, const char *topic)
{
    const rd_kafka_metadata_t *md;
    rd_kafka_topic_t *t = rd_kafka_topic_new(c, topic, NULL);
    rd_kafka_resp_err_t e = rd_kafka_metadata(c, 0, t, &md, METADATA_TIMEOUT_MS);
    rd_kafka_topic_destroy(t);
    if (e || md->topic_cnt != 1 || md->topics[0].err) {
        fprintf(stderr, CMD ": reply topic %s: %s\n", topic,
                rd_kafka_err2str(e ? e : md->topics[0].err));
        if (!e)
            rd_kafka_metadata_destroy(md);
        return -1;
    }
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
    for (int i = 0; i < md->topics[0].partition_cnt; i++) {
        int64_t lo, hi;
        int32_t id = md->topics[0].partitions[i].id;
        if (rd_kafka_query_watermark_offsets(c, topic, id, &lo, &hi, METADATA_TIMEOUT_MS))
            hi = RD_KAFKA_OFFSET_END;
        rd_kafka_topic_partition_list_add(parts, topic, id)->offset = hi;
    }
    rd_kafka_metadata_destroy(md);
    e = rd_kafka_assign(c, parts);
    rd_kafka_topic_partition_list_destroy(parts);
    return e ? -1 : 0;
}

static int header_u32(rd_kafka_message_t *m, const char *name, uint32_t *out)
{
    rd_kafka_headers_t *hs;
    const void *v;
    size_t n;
    char buf[32];
    if (rd_kafka_message_headers(m, &hs) || rd_kafka_header_get_last(hs, name, &v, &n) ||
        n >= sizeof buf)
        return -1;
    memcpy(buf, v, n);
    buf[n] = 0;
    *out = (uint32_t)strtoul(buf, NULL, 10);
    return 0;
}

/* Print one reply record of ours. Returns 1 when it was the final one. */
static int show(rd_kafka_message_t *m, const submit_opts *o, uint32_t *attempt, int *ok)
{
    uint32_t a = 0, seq = 0;
    header_u32(m, "attempt", &a);
    header_u32(m, "seq", &seq);
    /* Follow the attempt that most recently started (seq 0); records of any
     * other attempt are stale. */
    if (a != *attempt) {
        if (seq != 0)
            return 0;
        if (*attempt)
            printf("\n[attempt %u: the request is being answered again]\n", a);
        *attempt = a;
    }
    cJSON *v = cJSON_ParseWithLength(m->payload, m->len);
    const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(v, "choices"), 0);
    const cJSON *delta = cJSON_GetObjectItem(choice, o->no_stream ? "message" : "delta");
    const cJSON *content = cJSON_GetObjectItem(delta, "content");
    if (cJSON_IsString(content))
        fputs(content->valuestring, stdout);
    fflush(stdout);
    const cJSON *fin = cJSON_GetObjectItem(choice, "finish_reason");
    int final = cJSON_IsString(fin) || cJSON_GetObjectItem(v, "error");
    if (final) {
        const cJSON *err = cJSON_GetObjectItem(v, "error");
        *ok = !err && cJSON_IsString(fin) &&
              (!strcmp(fin->valuestring, "stop") || !strcmp(fin->valuestring, "length"));
        /* The answer's line ends before the summary goes to stderr: when both
         * go to one file or pipe, stdout is fully buffered. */
        printf("\n");
        fflush(stdout);
        if (!o->quiet || err) {
            cJSON *summary = cJSON_CreateObject();
            cJSON_AddItemToObject(summary, "finish_reason", cJSON_Duplicate(fin, 1));
            const char *keys[] = {"usage", "timings", "error"};
            for (int i = 0; i < 3; i++) {
                const cJSON *x = cJSON_GetObjectItem(v, keys[i]);
                if (x)
                    cJSON_AddItemToObject(summary, keys[i], cJSON_Duplicate(x, 1));
            }
            char *s = cJSON_PrintUnformatted(summary);
            fprintf(stderr, "%s\n", s ? s : "");
            free(s);
            cJSON_Delete(summary);
        }
    }
    cJSON_Delete(v);
    return final;
}

static int parse_args(int argc, char **argv, submit_opts *o)
{
    *o = (submit_opts){.topic = "mllama.requests", .reply_topic = "mllama.replies",
                       .redis_prefix = "mllama", .max_tokens = 128, .temperature = 0,
                       .timeout_s = DEFAULT_TIMEOUT_S};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(SVC_EXIT_OK);
        }
        if (!strcmp(a, "--no-stream") || !strcmp(a, "--quiet")) {
            *(a[2] == 'n' ? &o->no_stream : &o->quiet) = 1;
            continue;
        }
        if (a[0] != '-') {
            o->prompt = a;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, CMD ": %s needs a value\n", a);
            return -1;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--brokers"))
            o->brokers = v;
        else if (!strcmp(a, "--topic"))
            o->topic = v;
        else if (!strcmp(a, "--reply-topic"))
            o->reply_topic = v;
        else if (!strcmp(a, "--redis"))
            o->redis_url = v;
        else if (!strcmp(a, "--redis-prefix"))
            o->redis_prefix = v;
        else if (!strcmp(a, "--id"))
            o->id = v;
        else if (!strcmp(a, "--adapter"))
            o->adapter = v;
        else if (!strcmp(a, "--conversation"))
            o->conversation = v;
        else if (!strcmp(a, "--response-format"))
            o->response_format = v;
        else if (!strcmp(a, "--image") && o->n_images < MAX_IMAGES)
            o->images[o->n_images++] = v;
        else if (!strcmp(a, "--max-tokens")) {
            if (svc_parse_long(CMD, a, v, 1, 1 << 20, &o->max_tokens))
                return -1;
        } else if (!strcmp(a, "--timeout")) {
            if (svc_parse_long(CMD, a, v, 1, 86400, &o->timeout_s))
                return -1;
        } else if (!strcmp(a, "--temperature")) {
            if (svc_parse_double(CMD, a, v, 0, 100, &o->temperature))
                return -1;
        } else {
            fprintf(stderr, CMD ": unknown option %s\n", a);
            return -1;
        }
    }
    if (!o->brokers || !o->prompt) {
        usage(stderr);
        return -1;
    }
    return 0;
}

static rd_kafka_t *client(rd_kafka_type_t type, const char *brokers, const char *group)
{
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof err) ||
        (group && rd_kafka_conf_set(conf, "group.id", group, err, sizeof err)) ||
        (type == RD_KAFKA_PRODUCER &&
         rd_kafka_conf_set(conf, "enable.idempotence", "true", err, sizeof err))) {
        fprintf(stderr, CMD ": %s\n", err);
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_t *rk = rd_kafka_new(type, conf, err, sizeof err);
    if (!rk)
        fprintf(stderr, CMD ": %s\n", err);
    return rk;
}

int cmd_submit(int argc, char **argv)
{
    submit_opts o;
    if (parse_args(argc, argv, &o))
        return SVC_EXIT_USAGE;
    char id_buf[64], sha_hex[ML_SHA256_HEX_SIZE] = "";
    if (!o.id) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(id_buf, sizeof id_buf, "req-%lld-%ld", (long long)ts.tv_sec, ts.tv_nsec);
        o.id = id_buf;
    }
    char *body = build_request(&o, sha_hex);
    if (!body)
        return SVC_EXIT_FAILURE;
    /* A conversation's worker holds the K/V of all its earlier turns (and
     * their images); an image resident elsewhere saves one vision encode. */
    int32_t partition = RD_KAFKA_PARTITION_UA;
    if (o.conversation && o.redis_url)
        fprintf(stderr, CMD ": conversation affinity: image routing not used\n");
    else
        partition = route(&o, sha_hex);
    const char *key = o.conversation ? o.conversation : o.id;

    rd_kafka_t *cons = client(RD_KAFKA_CONSUMER, o.brokers, o.id);
    rd_kafka_t *prod = client(RD_KAFKA_PRODUCER, o.brokers, NULL);
    int rc = SVC_EXIT_FAILURE, ok = 0;
    if (!cons || !prod || assign_reply_topic(cons, o.reply_topic))
        goto out;
    rd_kafka_resp_err_t e = rd_kafka_producev(
        prod, RD_KAFKA_V_TOPIC(o.topic), RD_KAFKA_V_PARTITION(partition),
        RD_KAFKA_V_KEY(key, strlen(key)), RD_KAFKA_V_VALUE(body, strlen(body)),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    if (e || rd_kafka_flush(prod, FLUSH_MS)) {
        fprintf(stderr, CMD ": produce to %s: %s\n", o.topic, rd_kafka_err2str(e));
        goto out;
    }
    fprintf(stderr, CMD ": sent %s (%zu bytes) to %s\n", o.id, strlen(body), o.topic);
    uint32_t attempt = 0;
    time_t deadline = time(NULL) + o.timeout_s;
    int done = 0;
    while (!done && time(NULL) < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(cons, POLL_MS);
        if (!m)
            continue;
        if (!m->err && m->key_len == strlen(o.id) && !memcmp(m->key, o.id, m->key_len))
            done = show(m, &o, &attempt, &ok);
        rd_kafka_message_destroy(m);
    }
    if (!done)
        fprintf(stderr, CMD ": no final record within %ld s\n", o.timeout_s);
    rc = done && ok ? SVC_EXIT_OK : SVC_EXIT_FAILURE;
out:
    free(body);
    if (cons) {
        rd_kafka_consumer_close(cons);
        rd_kafka_destroy(cons);
    }
    if (prod)
        rd_kafka_destroy(prod);
    return rc;
}
