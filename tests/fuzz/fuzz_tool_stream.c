/* Fuzz target: the tool-call scanner (protocol/tool_stream.h) on any bytes,
 * fed in pieces the input's first byte sizes. Properties:
 *   the arguments passed on, put together, are one run of the input;
 *   an answer that may be prose and does not begin with '{' comes back
 *   whole as content;
 *   a name, when told, is at most SVC_OPENAI_NAME_MAX bytes.
 * Aborts when one breaks. */
#define _GNU_SOURCE /* memmem */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/tool_stream.h"
#include "util.h"

static void require(bool ok)
{
    if (!ok)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t step = data[0] % 16 + 1;
    bool call = data[0] & 0x80;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    svc_tool_stream ts = {0};
    svc_tool_stream_init(&ts, call);
    svc_buf content, args;
    svc_buf_init(&content);
    svc_buf_init(&args);
    for (size_t at = 0; at < n; at += step) {
        size_t k = step < n - at ? step : n - at;
        svc_tool_delta d = svc_tool_stream_feed(&ts, text + at, k);
        require(!d.arguments_len || (d.arguments >= text + at && d.arguments + d.arguments_len <= text + at + k));
        require(svc_buf_append(&content, d.content, d.content_len) == 0 &&
                svc_buf_append(&args, d.arguments, d.arguments_len) == 0);
        if (d.call_begins)
            require(strlen(svc_tool_stream_name(&ts)) <= SVC_OPENAI_NAME_MAX);
    }
    svc_tool_delta d = svc_tool_stream_end(&ts);
    require(svc_buf_append(&content, d.content, d.content_len) == 0);
    if (args.len)
        require(memmem(text, n, args.data, args.len) != NULL);
    size_t lead = 0;
    while (lead < n && strchr(" \t\n\r", text[lead]) && text[lead])
        lead++;
    if (!call && (lead == n || text[lead] != '{'))
        require(content.len == n && (n == 0 || !memcmp(content.data, text, n)) && !args.len);
    svc_buf_deinit(&content);
    svc_buf_deinit(&args);
    svc_tool_stream_deinit(&ts);
    return 0;
}
