/*
 * test_conformance_catches - the harness's own test: plugins with planted
 * defects (tests/conformance/bad/) must each fail with the right reason,
 * and what such a plugin refuses must show as UNSUPPORTED, not as a pass.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include <cmocka.h>

static char dir[256];

static int setup(void **state) {
    (void)state;
    const char *cat = getenv("TESSERA_CATALOG");
    if (!cat || !getenv("TESSERA_BUILD_DIR")) {
        fprintf(stderr, "TESSERA_CATALOG or TESSERA_BUILD_DIR not set: run through ctest\n");
        return -1;
    }
    snprintf(dir, sizeof dir, "/tmp/tsr_conf_bad_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    /* the planted defects beside the real reference plugins */
    DIR *d = opendir(TESSERA_BAD_CATALOG);
    if (!d) return -1;
    struct dirent *e;
    char a[1024], b[1024];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(a, sizeof a, "%s/%s", TESSERA_BAD_CATALOG, e->d_name);
        snprintf(b, sizeof b, "%s/%s", dir, e->d_name);
        if (symlink(a, b)) return -1;
    }
    closedir(d);
    const char *refs[] = {"ref_gemv", "ref_attention", "ref_kv_cache", "drafter_none", "expert_resident"};
    for (int i = 0; i < 5; i++) {
        snprintf(a, sizeof a, "%s/%s.yaml", cat, refs[i]);
        snprintf(b, sizeof b, "%s/%s.yaml", dir, refs[i]);
        if (symlink(a, b)) return -1;
        snprintf(a, sizeof a, "%s/lib%s.so", cat, refs[i]);
        snprintf(b, sizeof b, "%s/lib%s.so", dir, refs[i]);
        if (symlink(a, b)) return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[512];
    if (!strncmp(dir, "/tmp/tsr_conf_bad_", 18)) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    }
    return 0;
}

typedef struct expect {
    const char *plugin;
    const char *reason;   /* in some FAIL line */
    int want_unsupported; /* some case must be UNSUPPORTED */
    int want_pass;        /* some case must still pass (the defect is narrow) */
} expect;

static void run_one(const expect *x) {
    char cmd[1024], line[2048];
    snprintf(cmd, sizeof cmd,
             "TESSERA_CONF_INCLUDE_TEST=1 TESSERA_CATALOG='%s' '%s/tests/bin/test_conformance' %s 2>&1", dir,
             getenv("TESSERA_BUILD_DIR"), x->plugin);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int fails = 0, reason = 0, unsup = 0, pass = 0;
    while (fgets(line, sizeof line, p)) {
        if (!strncmp(line, "  FAIL", 6)) {
            fails++;
            reason |= strstr(line, x->reason) != NULL;
        }
        unsup += !strncmp(line, "  UNSUPPORTED", 13);
        pass += !strncmp(line, "  OK ", 5);
    }
    int status = pclose(p);
    printf("%s: %d failed (reason '%s' %s), %d unsupported, %d passed, exit %d\n", x->plugin, fails, x->reason,
           reason ? "seen" : "NOT seen", unsup, pass, status);
    assert_int_not_equal(status, 0);
    assert_true(fails > 0);
    assert_true(reason);
    if (x->want_unsupported) assert_true(unsup > 0);
    if (x->want_pass) assert_true(pass > 0);
}

static void test_guard(void **s) {
    (void)s;
    expect x = {"bad_gemv_guard", "guard bytes changed", 1, 0};
    run_one(&x);
}
static void test_drift(void **s) {
    (void)s;
    expect x = {"bad_gemv_drift", "nmse", 1, 0};
    run_one(&x);
}
static void test_nan(void **s) {
    (void)s;
    expect x = {"bad_gemv_nan", "NaN/Inf parity", 1, 1};
    run_one(&x);
}
static void test_glu(void **s) {
    (void)s;
    expect x = {"bad_gemv_glu", "gate and up swapped?", 1, 1};
    run_one(&x);
}
static void test_drafter(void **s) {
    (void)s;
    expect x = {"bad_drafter_ids", "not a valid id", 0, 0};
    run_one(&x);
}
static void test_expert(void **s) {
    (void)s;
    expect x = {"bad_expert_swap", "weights behave unlike", 0, 0};
    run_one(&x);
}
static void test_expert_resident(void **s) {
    (void)s;
    expect x = {"bad_expert_resident", "resident counted as lookups", 0, 0};
    run_one(&x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_guard),  cmocka_unit_test(test_drift),  cmocka_unit_test(test_nan),
        cmocka_unit_test(test_glu),     cmocka_unit_test(test_drafter), cmocka_unit_test(test_expert),
        cmocka_unit_test(test_expert_resident),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
