/*
 * test_conformance - every plugin of the catalog against its slot's
 * reference plugin, in the manner of ggml's test-backend-ops.
 *
 * The catalog's manifests ($TESSERA_CATALOG) are read through core/host; a
 * plugin joins by having a manifest there. For each plugin (test plugins
 * excepted) the slot's table of cases is run against the reference plugin
 * (ref_gemv, ref_attention, ref_kv_cache, drafter_none, expert_resident):
 * guard bytes around outputs, NaN/Inf parity, an error norm held to the
 * tolerance its exactness allows; stateful slots replay scripts and compare
 * state. A case the plugin refuses with TSR_ERR_UNSUPPORTED is reported as
 * unsupported, never as a pass; any failure fails the plugin's test.
 *
 *   test_conformance [PLUGIN]     (or TESSERA_CONF_PLUGIN=PLUGIN)
 *   TESSERA_CONF_SEED=N           (default 20261129; printed)
 *   TESSERA_CONF_INCLUDE_TEST=1   run test plugins too (the harness's own test)
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "conf_cases.h"
#include "core/host/diag.h"

#define CONF_DEFAULT_SEED 20261129ull

static const char *ref_names[TSR_SLOT_COUNT] = {
    [TSR_SLOT_ATTENTION] = "ref_attention", [TSR_SLOT_KV_CACHE] = "ref_kv_cache",
    [TSR_SLOT_DRAFTER] = "drafter_none",    [TSR_SLOT_EXPERT_CACHE] = "expert_resident",
    [TSR_SLOT_GEMV] = "ref_gemv",
};

void conf_report(conf_env *env, conf_outcome o, const char *what, const char *fmt, ...) {
    static const char *tag[] = {"OK", "UNSUPPORTED", "FAIL"};
    char msg[1600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("  %-12s %-58s %s%s%s%s%s%s\n", tag[o], what, env->m->name, env->variant ? "[" : "",
           env->variant ? env->variant : "", env->variant ? "]" : "", msg[0] ? ": " : "", msg);
    if (o == CONF_PASS) env->tally.pass++;
    else if (o == CONF_UNSUPPORTED) env->tally.unsupported++;
    else env->tally.fail++;
}

int conf_variant_declined(conf_env *env, int rc, const char *what, const char *why) {
    if (rc != TSR_ERR_UNSUPPORTED || !env->variant) return 0;
    conf_report(env, CONF_UNSUPPORTED, what, "init: %s", why ? why : "declined");
    return 1;
}

int conf_params(const conf_env *env, const char *const *want, int n_want, const char **out) {
    int n = 0;
    for (int i = 0; i < n_want; i++) {
        const char *eq = want[i] ? strchr(want[i], '=') : NULL;
        char name[64];
        snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - want[i]) : 0, want[i] ? want[i] : "");
        if (eq && tsr_manifest_param(env->m, name)) out[n++] = want[i];
    }
    if (env->variant && env->variant[0]) out[n++] = env->variant;
    return n;
}

int conf_variants(const tsr_manifest *m, char out[][96], int max) {
    int n = 0;
    if (max < 1) return 0;
    out[n++][0] = '\0';
    for (int i = 0; i < m->n_params; i++) {
        const tsr_mparam *p = &m->params[i];
        if (p->type == TSR_PARAM_STRING)
            for (int j = 0; j < p->n_values && n < max; j++) {
                if (p->def.v.s && !strcmp(p->values[j], p->def.v.s)) continue;
                snprintf(out[n++], 96, "%s=%s", p->name, p->values[j]);
            }
        else if (p->type == TSR_PARAM_BOOL && n < max)
            snprintf(out[n++], 96, "%s=%s", p->name, p->def.v.b ? "false" : "true");
    }
    return n;
}

void conf_provided(const tsr_manifest *m, const tsr_mcap *c, int i, const char *variant, char *buf, size_t size) {
    const char *v = c->values[i];
    if (v[0] == '$') {
        size_t ln = strlen(v + 1);
        if (variant && !strncmp(variant, v + 1, ln) && variant[ln] == '=') {
            snprintf(buf, size, "%s", variant + ln + 1);
            return;
        }
        const tsr_mparam *p = tsr_manifest_param(m, v + 1);
        if (p) {
            tsr_param_format(&p->def, buf, size);
            return;
        }
    }
    snprintf(buf, size, "%s", v);
}

int conf_compare(const float *got, const float *want, int64_t n, int strict_nonfinite, double *nmse,
                 int64_t *bad_index) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float a = got[i], b = want[i];
        int same = strict_nonfinite ? (isnan(a) == isnan(b) && (isinf(a) ? isinf(b) && a == b : !isinf(b)))
                                    : (!isfinite(a)) == (!isfinite(b));
        if (!same) {
            *bad_index = i;
            return -1;
        }
        if (!isfinite(b)) continue;
        num += ((double)a - b) * ((double)a - b);
        den += (double)b * b;
    }
    *nmse = den > 0.0 ? num / den : num;
    return 0;
}

float *conf_guarded_alloc(int64_t n) {
    size_t bytes = (size_t)n * sizeof(float) + 2 * CONF_GUARD;
    unsigned char *p = malloc(bytes);
    if (!p) return NULL;
    memset(p, 0xA5, bytes);
    return (float *)(p + CONF_GUARD);
}

int conf_guard_intact(const float *p, int64_t n) {
    const unsigned char *lo = (const unsigned char *)p - CONF_GUARD;
    const unsigned char *hi = (const unsigned char *)(p + n);
    for (int i = 0; i < CONF_GUARD; i++)
        if (lo[i] != 0xA5 || hi[i] != 0xA5) return 0;
    return 1;
}

void conf_guarded_free(float *p) {
    if (p) free((unsigned char *)p - CONF_GUARD);
}

uint64_t conf_rand(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

float conf_randf(uint64_t *s) { return (float)((conf_rand(s) >> 40) * (1.0 / 8388608.0) - 1.0); }

/* --- the driver ----------------------------------------------------------- */

static tsr_catalog *catalog;
static tsr_threadpool *pool;
static uint64_t seed = CONF_DEFAULT_SEED;

static void run_plugin(void **state) {
    const tsr_manifest *m = *state;
    conf_env env = {.cat = catalog, .m = m, .pool = pool, .seed = seed};
    char why[768];
    printf("[%s] %s %s (%s)\n", tsr_slot_name(m->slot), m->name, m->version, m->exact ? "exact" : "lossy");
    env.ref_m = tsr_catalog_find(catalog, ref_names[m->slot]);
    if (!env.ref_m) {
        conf_report(&env, CONF_FAIL, "setup", "reference plugin %s is not in the catalog", ref_names[m->slot]);
    } else if (!(m->devices & TSR_DEVMASK_CPU)) {
        conf_report(&env, CONF_UNSUPPORTED, "setup", "no CPU device in the manifest: not run on this host");
    } else if (conf_lib_open(m, &env.lib, why, sizeof why)) {
        conf_report(&env, CONF_FAIL, "load", "%s", why);
    } else if (conf_lib_open(env.ref_m, &env.ref_lib, why, sizeof why)) {
        conf_report(&env, CONF_FAIL, "load reference", "%s", why);
    } else {
        char variants[CONF_MAX_VARIANTS][96];
        int nv = conf_variants(m, variants, CONF_MAX_VARIANTS);
        for (int v = 0; v < nv; v++) {
            env.variant = variants[v][0] ? variants[v] : NULL;
            switch (m->slot) {
            case TSR_SLOT_GEMV: conf_run_gemv(&env); break;
            case TSR_SLOT_ATTENTION: conf_run_attention(&env); break;
            case TSR_SLOT_KV_CACHE: conf_run_kv_cache(&env); break;
            case TSR_SLOT_DRAFTER: conf_run_drafter(&env); break;
            case TSR_SLOT_EXPERT_CACHE: conf_run_expert_cache(&env); break;
            default: conf_report(&env, CONF_FAIL, "setup", "unknown slot"); break;
            }
        }
        env.variant = NULL;
    }
    conf_lib_close(&env.ref_lib);
    conf_lib_close(&env.lib);
    printf("[%s] %s: %d passed, %d unsupported, %d failed\n", tsr_slot_name(m->slot), m->name, env.tally.pass,
           env.tally.unsupported, env.tally.fail);
    fflush(stdout);
    if (env.tally.fail) fail_msg("%s: %d case(s) failed", m->name, env.tally.fail);
    if (env.tally.pass == 0 && env.tally.unsupported == 0) fail_msg("%s: no case ran", m->name);
}

int main(int argc, char **argv) {
    const char *dir = conf_catalog_dir();
    if (!dir) {
        printf("conformance: TESSERA_CATALOG is not set (run through ctest): skipped\n");
        return 0;
    }
    const char *only = argc > 1 ? argv[1] : getenv("TESSERA_CONF_PLUGIN");
    const char *inc = getenv("TESSERA_CONF_INCLUDE_TEST");
    int include_test = inc && !strcmp(inc, "1");
    const char *s = getenv("TESSERA_CONF_SEED");
    if (s && *s) seed = strtoull(s, NULL, 10);
    if (!seed) seed = CONF_DEFAULT_SEED;
    printf("conformance: catalog %s, seed %llu\n", dir, (unsigned long long)seed);
    tsr_diag d;
    tsr_diag_init(&d);
    if (tsr_catalog_load(dir, &catalog, &d) != TSR_OK) {
        tsr_diag_print(&d, stderr);
        tsr_diag_free(&d);
        return 1;
    }
    tsr_diag_free(&d);
    pool = tsr_threadpool_new(2);
    struct CMUnitTest *tests = calloc((size_t)catalog->n + 1, sizeof *tests);
    int n = 0;
    for (int i = 0; i < catalog->n; i++) {
        tsr_manifest *m = catalog->items[i];
        if ((m->test && !include_test) || (only && *only && strcmp(only, m->name))) continue;
        tests[n].name = m->name;
        tests[n].test_func = run_plugin;
        tests[n].initial_state = m;
        n++;
    }
    int rc;
    if (n == 0) {
        printf("conformance: no plugin%s%s in the catalog\n", only ? " named " : "", only ? only : "");
        rc = only ? 1 : 0;
    } else {
        rc = _cmocka_run_group_tests("conformance", tests, (size_t)n, NULL, NULL);
    }
    free(tests);
    tsr_threadpool_free(pool);
    tsr_catalog_free(catalog);
    return rc;
}
