/* Fuzz target: bytes -> the reply-topic policy (protocol.h). The input is
 * "<kafka.reply_topics list>\n<topic>"; the list is checked as the
 * configuration would be, and the topic matched against it whether the
 * list passed or not (the matcher must not trust it). A topic it allows is
 * always a valid Kafka name, never reserved, never "__"-prefixed, and
 * matches an entry of the list; a list holding just that topic overlaps
 * the list (svc_topic_policy_overlap, both ways). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/protocol.h"

/* topic[0..len) NUL-terminated (malloc'd; NULL out of memory). */
static char *topic_copy(const char *topic, size_t len)
{
    char *s = malloc(len + 1);
    if (s) {
        memcpy(s, topic, len);
        s[len] = '\0';
    }
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size);
    size_t list_len = nl ? (size_t)(nl - data) : size;
    char *list = malloc(list_len + 1);
    if (!list)
        return 0;
    memcpy(list, data, list_len);
    list[list_len] = '\0';
    /* The topic: exactly its bytes, not NUL-terminated. */
    size_t topic_len = nl ? size - list_len - 1 : 0;
    char *topic = malloc(topic_len ? topic_len : 1);
    if (!topic) {
        free(list);
        return 0;
    }
    if (topic_len)
        memcpy(topic, nl + 1, topic_len);
    static const char *const reserved[] = {"mllama.requests", "mllama.cancel", "mllama.dlt"};
    svc_topic_policy p = {list, reserved, sizeof reserved / sizeof reserved[0]};
    char err[SVC_ERRMSG_MAX];
    svc_topic_policy_check(&p, err, sizeof err);
    if (svc_reply_topic_allowed(&p, topic, topic_len)) {
        if (!svc_valid_topic(topic, topic_len) || (topic_len >= 2 && !memcmp(topic, "__", 2)))
            abort();
        for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
            if (strlen(reserved[i]) == topic_len && !memcmp(reserved[i], topic, topic_len))
                abort();
        svc_topic_policy only = {topic_copy(topic, topic_len), reserved, 0};
        char why[SVC_ERRMSG_MAX];
        if (only.allowed && !(svc_topic_policy_overlap(&p, &only, why, sizeof why) &&
                              svc_topic_policy_overlap(&only, &p, why, sizeof why)))
            abort();
        free((char *)only.allowed);
        if (!strstr(list, "*")) {
            /* Without prefixes, an allowed topic is one of the entries. */
            bool found = false;
            for (const char *e = list; e;) {
                const char *comma = strchr(e, ',');
                size_t n = comma ? (size_t)(comma - e) : strlen(e);
                found |= n == topic_len && !memcmp(e, topic, n);
                e = comma ? comma + 1 : NULL;
            }
            if (!found)
                abort();
        }
    }
    free(topic);
    free(list);
    return 0;
}
