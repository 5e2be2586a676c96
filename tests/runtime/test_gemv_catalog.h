/*
 * test_gemv_catalog.h - a gemv test plugin (tests/plugins, built into
 * build/tests/catalog) run by the model runtime: a catalog under dir of
 * links to the engine's plugins ($TESSERA_CATALOG) and to the test plugin,
 * and an assembly dir/PLUGIN.yaml naming it for the gemv slot (the other
 * slots the CPU defaults). Test plugins that the runtime assembles are not
 * marked `test: true` in their manifests (the runtime has no allow_test):
 * they live only in the test catalog. cmocka asserts; skips the test where
 * the plugin or $TESSERA_CATALOG is absent.
 */
#ifndef TSR_TESTS_TEST_GEMV_CATALOG_H
#define TSR_TESTS_TEST_GEMV_CATALOG_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* catalog (4096 bytes) and assembly (4096 bytes) receive the two paths. */
static inline void test_gemv_catalog(const char *dir, const char *plugin, char *catalog, char *assembly) {
    const char *b = getenv("TESSERA_BUILD_DIR"), *engine = getenv("TESSERA_CATALOG");
    char tests[4096], cmd[16384];
    snprintf(tests, sizeof tests, "%s/tests/catalog", b ? b : "build");
    snprintf(cmd, sizeof cmd, "%s/lib%s.so", tests, plugin);
    if (!engine || access(cmd, R_OK) != 0) {
        printf("# %s or $TESSERA_CATALOG absent: skipped (build tessera_test_plugins)\n", cmd);
        skip();
    }
    if (snprintf(catalog, 4096, "%s/catalog", dir) >= 4096 ||
        snprintf(assembly, 4096, "%s/%s.yaml", dir, plugin) >= 4096 ||
        snprintf(cmd, sizeof cmd, "mkdir -p '%s' && ln -sf '%s'/* '%s'/ && ln -sf '%s'/lib%s.so '%s'/%s.yaml '%s'/",
                 catalog, engine, catalog, tests, plugin, tests, plugin, catalog) >= (int)sizeof cmd)
        fail_msg("paths too long");
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(assembly, "w");
    assert_non_null(f);
    fprintf(f, "name: %s\ndevice: cpu\nslots:\n  gemv: %s\n", plugin, plugin);
    fclose(f);
}

#endif /* TSR_TESTS_TEST_GEMV_CATALOG_H */
