/* Fuzz target: bytes -> the worker configuration's "tenants" array
 * (service/config.c), given as `--set tenants=<bytes>` over the embedded
 * defaults. Whatever loads keeps tenants apart: at least one tenant, valid
 * distinct names, request and cancel topics that are valid, distinct and
 * found back by svc_config_tenant_by_topic, and reply policies that pass
 * the check and overlap no other tenant's. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char prefix[] = "tenants=";
    char *set = malloc(sizeof prefix + size);
    if (!set)
        return 0;
    memcpy(set, prefix, sizeof prefix - 1);
    memcpy(set + sizeof prefix - 1, data, size);
    set[sizeof prefix - 1 + size] = '\0'; /* a NUL inside ends the text, as on a command line */
    const char *sets[] = {set};
    static svc_config cfg;
    char err[1024], why[512];
    if (svc_config_load(&cfg, NULL, sets, 1, err, sizeof err) == 0) {
        if (cfg.n_tenants < 1 || cfg.n_tenants > SVC_TENANTS_MAX)
            abort();
        for (size_t i = 0; i < cfg.n_tenants; i++) {
            const svc_tenant *t = &cfg.tenants[i];
            if (!svc_valid_tenant_name(t->name, strlen(t->name)) ||
                !svc_valid_tenant_name(t->cache_group, strlen(t->cache_group)) ||
                !svc_valid_topic(t->request_topic, strlen(t->request_topic)) ||
                !svc_valid_topic(t->cancel_topic, strlen(t->cancel_topic)) ||
                svc_config_tenant_by_topic(&cfg, t->request_topic) != t ||
                svc_config_tenant_by_topic(&cfg, t->cancel_topic) != t ||
                !svc_topic_policy_check(&t->policy, why, sizeof why) || t->weight < 1 ||
                t->max_in_flight < 1)
                abort();
            for (size_t j = 0; j < i; j++)
                if (!strcmp(cfg.tenants[j].name, t->name) ||
                    svc_topic_policy_overlap(&cfg.tenants[j].policy, &t->policy, why, sizeof why))
                    abort();
        }
    }
    svc_config_deinit(&cfg);
    free(set);
    return 0;
}
