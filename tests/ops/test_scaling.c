/* The scaling simulation of ops/ (RUNBOOK "Scale"): KEDA's control loop,
 * played by this test against real workers on the mock Kafka cluster.
 *
 * KEDA's Kafka scaler sets replicas = ceil(total lag / lagThreshold), within
 * [minReplicaCount, maxReplicaCount], and maxReplicaCount may not exceed the
 * request topic's partitions (an idle consumer would get none). This test
 * reads minReplicaCount and maxReplicaCount from ops/k8s/keda-scaledobject.yaml,
 * scales them to its topic of PARTITIONS partitions, and derives the test's
 * lagThreshold with the documented formula (in-flight capacity C plus the
 * backlog X·T a worker clears in the target time) for its tiny workers.
 *
 * A burst of requests arrives; every POLL_MS the loop measures the lag
 * (end offsets minus committed offsets of the group), computes the desired
 * replicas, starts workers to reach it and drains (SIGTERM) the newest one
 * when it drops, after a cooldown, down to minReplicaCount. Workers join and
 * leave while requests are in flight. Proven: every request completes with a valid stream (no loss, a
 * new attempt only after a rebalance), the loop scaled out and back in,
 * every drained worker exited 0, and the lag drains to 0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "service/proc_util.h"

#define PARTITIONS 4
#define N_REQUESTS 48
#define MAX_WORKERS PARTITIONS
#define WORKER_MAX_RUNNING 2     /* C: requests one test worker runs at once */
#define BACKLOG_PER_WORKER 4     /* X·T: what a test worker clears in the target time */
#define POLL_MS 200
#define COOLDOWN_MS 3000         /* KEDA's cooldownPeriod, scaled down */
#define DEADLINE_MS 100000
#define KEDA_FILE ML_SOURCE_DIR "/ops/k8s/keda-scaledobject.yaml"

/* An integer mapping value `key: N` (or key: "N") from the ScaledObject:
 * the first line whose content starts with the key (comments never do). */
static int yaml_int(const char *text, const char *key)
{
    size_t k = strlen(key);
    for (const char *line = text; line && *line;) {
        const char *at = line + strspn(line, " ");
        line = strchr(line, '\n');
        line = line ? line + 1 : NULL;
        if (strncmp(at, key, k) || at[k] != ':')
            continue;
        at += k + 1;
        at += strspn(at, " \"");
        return atoi(at);
    }
    return -1;
}

static int64_t total_lag(pu_client *c, const char *brokers)
{
    int64_t end[PARTITIONS], done[PARTITIONS], lag = 0;
    if (!pu_end_offsets(c, PU_REQUESTS, PARTITIONS, end) ||
        !pu_committed(brokers, "mllama-workers", PU_REQUESTS, PARTITIONS, done))
        return -1;
    for (int p = 0; p < PARTITIONS; p++)
        lag += end[p] - (done[p] < 0 ? 0 : done[p]);
    return lag;
}

int main(void)
{
    if (!pu_which("redis-server"))
        ml_test_skip("redis-server is not installed");
    char *keda = pu_slurp(KEDA_FILE, NULL);
    check(keda != NULL, "read %s", KEDA_FILE);
    int min_rep = keda ? yaml_int(keda, "minReplicaCount") : -1;
    int max_rep = keda ? yaml_int(keda, "maxReplicaCount") : -1;
    int threshold_prod = keda ? yaml_int(keda, "lagThreshold") : -1;
    free(keda);
    check(min_rep >= 1 && max_rep >= min_rep && threshold_prod > 0,
          "ScaledObject: min %d, max %d, lagThreshold %d", min_rep, max_rep, threshold_prod);
    /* The same formula, at the test's scale. */
    const int threshold = WORKER_MAX_RUNNING + BACKLOG_PER_WORKER;
    if (max_rep > MAX_WORKERS)
        max_rep = MAX_WORKERS;

    char dir[PU_PATH_MAX], model[PU_PATH_MAX + 16], brokers[256], log[PU_PATH_MAX + 32];
    pu_tmpdir("scaling", dir);
    snprintf(model, sizeof model, "%s/model", dir);
    snprintf(log, sizeof log, "%s/mkmodel.log", dir);
    pu_proc kafka;
    pu_redis redis;
    memset(&redis, 0, sizeof redis);
    if (!pu_make_model(model, log) ||
        !pu_mock_kafka_start(&kafka, dir, PU_REQUESTS ":4," PU_REPLIES ":4," PU_DLT ":1," PU_CANCEL ":1",
                             brokers, sizeof brokers) ||
        !pu_redis_start(&redis, dir, 0))
        pu_die("setup");
    pu_worker_env env = {.brokers = brokers, .redis_url = redis.url, .model_dir = model,
                         .dir = dir};
    static const char *const extra[] = {"runtime.max_running=2", "runtime.max_step_tokens=256",
                                        NULL};

    pu_client c;
    const char *topics[] = {PU_REPLIES};
    pu_client_init(&c, brokers, topics, 1);

    pu_proc workers[MAX_WORKERS];
    int running = 0, started = 0, peak = 0, drained = 0, drained_ok = 0;
    char name[32];
    snprintf(name, sizeof name, "w%d", started++);
    if (!pu_worker_start(&workers[running++], &env, name, extra) ||
        !pu_wait_assigned(&workers[0], PU_START_MS))
        pu_die("first worker");

    char ids[N_REQUESTS][32];
    for (int i = 0; i < N_REQUESTS; i++) {
        snprintf(ids[i], sizeof ids[i], "scale-%02d", i);
        char *body = pu_chat_request(ids[i], "Count slowly to twenty.", NULL,
                                     "\"max_tokens\":24,\"temperature\":0");
        check(pu_client_send(&c, ids[i], body), "send %s", ids[i]);
        free(body);
    }

    int64_t t0 = pu_now_ms(), last_change = t0, max_lag = 0;
    int done = 0;
    while (pu_now_ms() - t0 < DEADLINE_MS) {
        done = pu_client_wait_finals(&c, ids[0], sizeof ids[0], N_REQUESTS, POLL_MS);
        int64_t lag = total_lag(&c, brokers);
        if (lag < 0)
            continue;
        if (lag > max_lag)
            max_lag = lag;
        if (done == N_REQUESTS && lag == 0 && running <= min_rep)
            break;
        int desired = (int)((lag + threshold - 1) / threshold);
        desired = desired < min_rep ? min_rep : desired > max_rep ? max_rep : desired;
        int64_t now = pu_now_ms();
        if (desired > running && running < MAX_WORKERS) {
            snprintf(name, sizeof name, "w%d", started++);
            check(pu_worker_start(&workers[running], &env, name, extra), "scale out to %d",
                  running + 1);
            running++;
            last_change = now;
            fprintf(stderr, "  lag %lld -> desired %d: started %s\n", (long long)lag, desired, name);
        } else if (desired < running && now - last_change >= COOLDOWN_MS) {
            /* Scale in: the newest worker drains its requests and leaves. */
            pu_proc *w = &workers[--running];
            int code = pu_stop(w, PU_STOP_MS);
            drained++;
            drained_ok += code == 0;
            last_change = now;
            fprintf(stderr, "  lag %lld -> desired %d: drained a worker (exit %d)\n",
                    (long long)lag, desired, code);
        }
        if (running > peak)
            peak = running;
    }
    fprintf(stderr, "  %d/%d answered, peak %d workers, %d drained, max lag %lld\n", done,
            N_REQUESTS, peak, drained, (long long)max_lag);
    check(done == N_REQUESTS, "every request answered (%d of %d)", done, N_REQUESTS);
    for (int i = 0; i < N_REQUESTS; i++)
        check(pu_check_stream(&c, ids[i]) >= 1, "%s: a valid stream", ids[i]);
    check(peak >= 2, "the burst scaled the group out (peak %d workers)", peak);
    check(drained >= 1 && drained_ok == drained, "scale-in drained %d workers, %d exited 0",
          drained, drained_ok);
    check(total_lag(&c, brokers) == 0, "the lag drained to 0");

    while (running > 0)
        pu_stop(&workers[--running], PU_STOP_MS);
    pu_client_deinit(&c);
    pu_stop(&kafka, PU_STOP_MS);
    pu_stop(&redis.proc, PU_STOP_MS);
    pu_tmpdir_done(dir);
    return check_done();
}
