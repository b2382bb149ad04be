/* `mllama submit`: send one chat request and stream its reply to the
 * terminal, as a chat frontend would: it reads the reply topic from the end
 * offsets it saw before producing, prints the deltas of its request id, and
 * starts over when a new attempt begins (a worker died mid-stream and
 * another one is answering). With --conversation it keys the record by the
 * conversation id, so the default partitioner puts every turn on one
 * partition (one worker, whose prefix cache holds the earlier turns); with
 * --redis, and no conversation, it routes the request to a partition owned
 * by the worker that holds the image resident in the tenant's cache
 * partition (the image's index key is that partition's: --cache-group, by
 * default the tenant's name). With --tenant it writes the
 * tenant's request topic and reads its reply topic, named as the worker
 * derives them (service/protocol/README.md "Tenants"). The request id is 128 random bits: on
 * a reply topic that others read, an id is all it takes to read or cancel
 * a request of the tenant, so it must not be guessable.
 * @locality: the main thread. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "protocol/base64.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "config.h"
#include "engine.h"
#include "kafka/kafka.h"
#include "protocol/protocol.h"
#include "redis/redis.h"
#include "util.h"

#define CMD "mllama submit"
#define MAX_IMAGES 8
#define MAX_IMAGE_BYTES (20u << 20)
#define METADATA_TIMEOUT_MS 10000
#define POLL_MS 100
#define FLUSH_MS 10000
#define DEFAULT_TIMEOUT_S 300
#define MAX_RESPONSE_FORMAT_BYTES (16u << 20)
#define REQUEST_TOPIC "mllama.requests" /* kafka.request_topic's default */
#define REPLY_TOPIC "mllama.replies"    /* the first of kafka.reply_topics' default */
#define ID_RANDOM_BYTES 16              /* an unguessable request id: 128 bits */
#define ID_PREFIX "req-"

typedef struct submit_opts {
    const char *brokers, *topic, *reply_topic, *redis_url, *redis_prefix, *id, *adapter;
    const char *tenant;         /* picks the tenant's topics; NULL: the shared ones */
    const char *conversation;   /* the record key when given; NULL: the request id */
    const char *cache_group;    /* the tenant's cache group: its image keys in Redis */
    const char *prompt;
    const char *response_format; /* a file holding the response_format object; NULL: none */
    const char *tools;           /* a file holding the tools array; NULL: none */
    const char *tool_choice;     /* none, auto, required or a function's name; NULL: the default */
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
            "                     [--tenant NAME] [--adapter NAME]\n"
            "                     [--redis URL [--redis-prefix P] [--cache-group G]]\n"
            "                     [--conversation ID] [--no-stream] [--timeout S] [--quiet]\n"
            "                     [--response-format FILE] [--tools FILE [--tool-choice C]]\n"
            "                     \"prompt\"\n\n"
            "Sends one chat request (images inline as data URLs, then the text) and\n"
            "streams the reply's text to stdout; the final record goes to stderr.\n"
            "--tenant NAME sends to " REQUEST_TOPIC ".NAME and reads " REPLY_TOPIC ".NAME (the\n"
            "worker's defaults for a tenant); --topic and --reply-topic win over it.\n"
            "Without --id the id is 128 random bits: ids must be unguessable.\n"
            "--conversation ID keys the record by ID instead of the request id: every turn\n"
            "of a conversation goes to one partition, hence one worker and its prefix\n"
            "cache. It wins over --redis image routing (service/protocol/README.md,\n"
            "\"Keying a conversation\").\n"
            "--cache-group G: the cache group of the request's tenant (default: the tenant's\n"
            "name, or \"" SVC_IMPLICIT_TENANT "\" without --tenant): --redis looks the image up in\n"
            "that group's cache partition.\n"
            "--response-format FILE: the request's response_format, a JSON object such as\n"
            "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": {...}}}\n"
            "(service/protocol/README.md); the worker checks it.\n"
            "--tools FILE: the request's tools, a JSON array of {\"type\": \"function\",\n"
            "\"function\": {...}}, sent as written (the prompt prints them as written);\n"
            "--tool-choice C: none, auto (the default), required, or a function's name. A call\n"
            "is printed as name(arguments).\n"
            "Exit 0 on finish_reason stop/length/tool_calls, 1 on error or timeout.\n");
}

/* --tools FILE (its text, raw: cJSON would print 1.0 as 1, and the
 * prompt prints the tools as written) and --tool-choice into req. Returns
 * 0, or -1 after saying why. */
static int add_tools(const submit_opts *o, cJSON *req)
{
    size_t len;
    char *text = svc_read_file(CMD, o->tools, MAX_RESPONSE_FORMAT_BYTES, &len);
    cJSON *tools = text ? cJSON_ParseWithLength(text, len) : NULL;
    bool ok = cJSON_IsArray(tools);
    cJSON_Delete(tools);
    if (text && !ok)
        fprintf(stderr, CMD ": %s: expected a JSON array of tools\n", o->tools);
    cJSON *raw = ok ? cJSON_CreateRaw(text) : NULL;
    free(text);
    if (!raw)
        return -1;
    cJSON_AddItemToObject(req, "tools", raw);
    if (!o->tool_choice)
        return 0;
    bool mode = !strcmp(o->tool_choice, "none") || !strcmp(o->tool_choice, "auto") ||
                !strcmp(o->tool_choice, "required");
    if (mode) {
        cJSON_AddStringToObject(req, "tool_choice", o->tool_choice);
        return 0;
    }
    cJSON *choice = cJSON_AddObjectToObject(req, "tool_choice");
    cJSON_AddStringToObject(choice, "type", "function");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(choice, "function"), "name", o->tool_choice);
    return 0;
}

/* The request's body; the first image's content sha256 goes to image_digest. */
static char *build_request(const submit_opts *o, uint8_t image_digest[ML_SHA256_DIGEST_SIZE])
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
    if (o->tools && add_tools(o, req) != 0) {
        cJSON_Delete(req);
        return NULL;
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
        if (i == 0)
            ml_sha256(bytes, len, image_digest);
        /* Labelled by signature; anything else goes out as JPEG for the
         * worker to refuse with its own message. */
        const char *type = ml_image_media_type((const uint8_t *)bytes, len);
        if (!type)
            type = "image/jpeg";
        char *url = malloc(svc_data_url_len(type, len) + 1);
        if (!url) {
            free(bytes);
            cJSON_Delete(req);
            cJSON_Delete(msg);
            return NULL;
        }
        svc_data_url_write(type, (const uint8_t *)bytes, len, url);
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

/* The partition of the worker holding the image of content digest
 * image_digest in the tenant's cache partition, or RD_KAFKA_PARTITION_UA. */
static int32_t route(const submit_opts *o, const uint8_t *image_digest)
{
    if (!o->redis_url || o->n_images == 0)
        return RD_KAFKA_PARTITION_UA;
    /* The index names the state's key in the partition (service/README.md §3). */
    uint8_t salt[SVC_CACHE_SALT_BYTES], key[ML_IMAGE_KEY_BYTES];
    char key_hex[ML_SHA256_HEX_SIZE];
    svc_cache_salt(o->cache_group   ? o->cache_group
                   : o->tenant      ? o->tenant
                                    : SVC_IMPLICIT_TENANT,
                   salt);
    ml_image_state_key(salt, image_digest, NULL, key);
    ml_sha256_hex(key, key_hex);
    svc_redis_config rc;
    svc_redis_config_default(&rc);
    rc.url = o->redis_url;
    rc.prefix = o->redis_prefix;
    rc.worker_id = "submit";
    svc_redis *r;
    char err[256], parts[8192];
    int32_t p = RD_KAFKA_PARTITION_UA;
    if (svc_redis_create(&rc, &r, err, sizeof err) != SVC_REDIS_OK) {
        fprintf(stderr, CMD ": redis: %s (sending without affinity)\n", err);
        return p;
    }
    if (svc_redis_route(r, key_hex, parts, sizeof parts) == SVC_REDIS_OK) {
        /* "topic:0,1;topic2:3": the first partition of our topic's entry. */
        for (const char *e = parts; *e; e += strcspn(e, ";") + (e[strcspn(e, ";")] == ';')) {
            const char *colon = strchr(e, ':');
            if (colon && (size_t)(colon - e) == strlen(o->topic) &&
                !strncmp(e, o->topic, strlen(o->topic)) && colon[1] >= '0' && colon[1] <= '9') {
                p = (int32_t)atoi(colon + 1);
                fprintf(stderr, CMD ": image resident on a worker owning partition %d\n", p);
                break;
            }
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

/* Print one reply record of ours. Returns 1 when it was the final one. */
static int show(rd_kafka_message_t *m, const submit_opts *o, uint32_t *attempt, int *ok)
{
    uint32_t a = 0, seq = 0;
    rd_kafka_headers_t *hs = NULL;
    rd_kafka_message_headers(m, &hs);
    svc_kafka_header_u32(hs, "attempt", &a);
    svc_kafka_header_u32(hs, "seq", &seq);
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
    /* A call: name( where it begins (every call of a completion), then its
     * arguments, then ) at the end. */
    const cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItem(delta, "tool_calls"), 0);
    const cJSON *fn = cJSON_GetObjectItem(call, "function");
    const cJSON *name = cJSON_GetObjectItem(fn, "name");
    const cJSON *args = cJSON_GetObjectItem(fn, "arguments");
    if (cJSON_IsString(name))
        printf("%s(", name->valuestring);
    if (cJSON_IsString(args))
        fputs(args->valuestring, stdout);
    fflush(stdout);
    const cJSON *fin = cJSON_GetObjectItem(choice, "finish_reason");
    int final = cJSON_IsString(fin) || cJSON_GetObjectItem(v, "error");
    if (final) {
        const cJSON *err = cJSON_GetObjectItem(v, "error");
        *ok = !err && cJSON_IsString(fin) &&
              (!strcmp(fin->valuestring, "stop") || !strcmp(fin->valuestring, "length") ||
               !strcmp(fin->valuestring, "tool_calls"));
        if (cJSON_IsString(fin) && !strcmp(fin->valuestring, "tool_calls"))
            printf(")");
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
    *o = (submit_opts){.redis_prefix = "mllama", .max_tokens = 128, .temperature = 0,
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
        else if (!strcmp(a, "--tenant"))
            o->tenant = v;
        else if (!strcmp(a, "--adapter"))
            o->adapter = v;
        else if (!strcmp(a, "--conversation"))
            o->conversation = v;
        else if (!strcmp(a, "--cache-group"))
            o->cache_group = v;
        else if (!strcmp(a, "--response-format"))
            o->response_format = v;
        else if (!strcmp(a, "--tools"))
            o->tools = v;
        else if (!strcmp(a, "--tool-choice"))
            o->tool_choice = v;
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
    if (o->tenant && !svc_valid_tenant_name(o->tenant, strlen(o->tenant))) {
        fprintf(stderr, CMD ": --tenant %s: expected [a-z0-9_-]{1,%d}\n", o->tenant,
                SVC_TENANT_NAME_MAX);
        return -1;
    }
    return 0;
}

/* The tenant's topic `base`.`tenant` in buf, or base without a tenant. */
static const char *tenant_topic(const char *base, const char *tenant, char *buf, size_t n)
{
    if (!tenant)
        return base;
    snprintf(buf, n, "%s.%s", base, tenant);
    return buf;
}

/* "req-" and ID_RANDOM_BYTES random bytes in hex. Returns 0, or -1 when the
 * kernel has no randomness to give. */
static int random_id(char *out, size_t n)
{
    uint8_t bytes[ID_RANDOM_BYTES];
    if (svc_random_bytes(bytes, sizeof bytes)) {
        perror(CMD ": getrandom");
        return -1;
    }
    size_t len = (size_t)snprintf(out, n, "%s", ID_PREFIX);
    for (size_t i = 0; i < sizeof bytes && len + 2 < n; i++)
        len += (size_t)snprintf(out + len, n - len, "%02x", bytes[i]);
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
    char id_buf[64];
    uint8_t image_digest[ML_SHA256_DIGEST_SIZE] = {0};
    char topic_buf[SVC_TOPIC_NAME_MAX + 1], reply_buf[SVC_TOPIC_NAME_MAX + 1];
    if (!o.topic)
        o.topic = tenant_topic(REQUEST_TOPIC, o.tenant, topic_buf, sizeof topic_buf);
    if (!o.reply_topic)
        o.reply_topic = tenant_topic(REPLY_TOPIC, o.tenant, reply_buf, sizeof reply_buf);
    if (!o.id) {
        if (random_id(id_buf, sizeof id_buf))
            return SVC_EXIT_FAILURE;
        o.id = id_buf;
    }
    char *body = build_request(&o, image_digest);
    if (!body)
        return SVC_EXIT_FAILURE;
    /* A conversation's worker holds the K/V of all its earlier turns (and
     * their images); an image resident elsewhere saves one vision encode. */
    int32_t partition = RD_KAFKA_PARTITION_UA;
    if (o.conversation && o.redis_url)
        fprintf(stderr, CMD ": conversation affinity: image routing not used\n");
    else
        partition = route(&o, image_digest);
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
