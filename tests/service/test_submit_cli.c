/* `mllama submit` against a worker on the micro model (mock Kafka, real
 * redis-server, separate processes): the streamed answer and the final
 * record's summary stay apart. The answer goes to stdout and ends with a
 * newline before the summary goes to stderr, so the two never share a line
 * even when stdout is a file or a pipe (fully buffered) and both land in one
 * place, as in the demo. Exit 0 on a length or stop finish. With --tools
 * and --tool-choice required the answer is the call, name(arguments), and
 * the exit 0 (finish tool_calls). Skipped (77) without redis-server. */
#include <string.h>

#include "proc_util.h"

#define TOPICS PU_REQUESTS ":1," PU_REPLIES ":1," PU_DLT ":1," PU_CANCEL ":1"
#define SUBMIT_MS 60000 /* a request answered, from the submit's start */
#define SUMMARY "{\"finish_reason\":"
#define TOOLS ML_SOURCE_DIR "/config/samples/weather_tools.json"

static pu_stack st;
static pu_proc *const worker = &st.workers[0];

int main(void)
{
    pu_stack_start(&st, "submit", TOPICS);
    if (!pu_worker_start(worker, &st.env, "w1", NULL) || !pu_wait_assigned(worker, SUBMIT_MS))
        pu_die("worker start");

    char log[PU_PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/submit.log", st.dir);
    char *const argv[] = {PU_MLLAMA, "submit", "--brokers", st.brokers, "--max-tokens", "6",
                          "Describe the weather.", NULL};
    int code = pu_run(argv, log, SUBMIT_MS);
    check(code == 0, "submit: exit code %d", code);
    size_t n;
    char *out = pu_slurp(log, &n);
    check(out != NULL, "submit: no output");
    const char *sent = out ? strstr(out, " bytes) to ") : NULL;
    const char *summary = out ? strstr(out, SUMMARY) : NULL;
    check(sent && summary && summary > sent, "submit: no summary after the request was sent");
    if (sent && summary && summary > sent) {
        const char *answer = strchr(sent, '\n') + 1;
        check(summary > answer, "submit: an empty answer proves nothing");
        check(summary[-1] == '\n', "submit: the summary shares a line with the answer");
        check(strchr(summary, '\n') != NULL, "submit: the summary is not a whole line");
    }
    if (ml_test_failures)
        pu_show_log(log, 2000);
    free(out);

    char *const tool_argv[] = {PU_MLLAMA, "submit", "--brokers", st.brokers, "--max-tokens", "128",
                               "--tools", TOOLS, "--tool-choice", "required",
                               "Weather in Oslo this week?", NULL};
    code = pu_run(tool_argv, log, SUBMIT_MS);
    out = pu_slurp(log, &n);
    check(code == 0 && out && strstr(out, "\nget_weather(") &&
              strstr(out, "})\n" SUMMARY "\"tool_calls\""),
          "submit --tools: exit code %d, a call then its summary", code);
    if (ml_test_failures)
        pu_show_log(log, 2000);
    free(out);
    check(pu_stop(worker, PU_STOP_MS) == 0, "worker: exit code after SIGTERM");
    pu_check_log_clean(worker->log);
    return check_done();
}
