/* Tests of loading: a full engine of test plugins (tests/plugins), refusals
 * through purpose-built bad plugins, library sha256 and permission checks on
 * a temporary copy of the test catalog, libffi exports (C and Lua), and
 * fault injection through the host allocator. Needs the build's test catalog
 * ($TESSERA_BUILD_DIR/tests/catalog); skips plainly without it. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/host/catalog.h"
#include "core/host/diag.h"
#include "core/host/engine.h"
#include "core/host/ffi.h"
#include "core/host/halloc.h"
#include "core/host/loader.h"
#include "core/host/lua_assembly.h"
#include "core/host/slot_calls.h"

static char g_catalog[1024];
static char g_tmp[256];

static const char *const all_test = "name: test-engine\n"
                                    "device: cpu\n"
                                    "slots:\n"
                                    "  attention: test_attention\n"
                                    "  kv_cache: test_kv_cache\n"
                                    "  drafter: test_drafter\n"
                                    "  expert_cache: test_expert_cache\n"
                                    "  gemv: {plugin: test_gemv, params: {threads: 2}}\n";

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* An assembly file in the temp folder; returns its path (static buffer). */
static const char *assembly(const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", g_tmp, name);
    write_file(path, text);
    return path;
}

/* The all-test assembly with gemv replaced by plugin. */
static const char *with_gemv(const char *plugin) {
    char text[1024];
    snprintf(text, sizeof text,
             "name: t\ndevice: cpu\nslots:\n  attention: test_attention\n  kv_cache: test_kv_cache\n"
             "  drafter: test_drafter\n  expert_cache: test_expert_cache\n  gemv: %s\n",
             plugin);
    return assembly("gemv.yaml", text);
}

static int open_engine(const char *path, const char *catalog, int allow_test, const tsr_model_desc *md,
                       tsr_engine **e, tsr_diag *d) {
    tsr_engine_opts o = {.catalog_dir = catalog, .n_threads = 2, .allow_test = allow_test};
    return tsr_engine_open_diag(path, NULL, md, &o, e, d);
}

static int has_error(const tsr_diag *d, int code, const char *word) {
    for (int i = 0; i < d->n_errors; i++)
        if (d->errors[i].code == code && strstr(d->errors[i].msg, word)) return 1;
    return 0;
}

static int setup(void **state) {
    (void)state;
    const char *b = getenv("TESSERA_BUILD_DIR");
    snprintf(g_catalog, sizeof g_catalog, "%s/tests/catalog", b ? b : "build");
    struct stat st;
    char probe[1100];
    snprintf(probe, sizeof probe, "%s/libtest_gemv.so", g_catalog);
    if (stat(probe, &st) != 0) {
        fprintf(stderr, "skipped: no test catalog at %s (build tessera_test_plugins)\n", g_catalog);
        return -1;
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/tsr_host_test.XXXXXX");
    if (!mkdtemp(g_tmp)) return -1;
    chmod(g_tmp, 0755);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "chmod -R u+w '%s' && rm -rf '%s'", g_tmp, g_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static const tsr_model_desc model = {.arch = "llama", .n_layers = 2, .hidden = 8, .n_heads = 2, .n_kv_heads = 1,
                                     .head_dim = 4, .vocab = 16, .max_ctx = 32};

static void test_full_engine(void **state) {
    (void)state;
    uint64_t live = tsr_halloc_live();
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_engine *e = NULL;
    int rc = open_engine(assembly("all.yaml", all_test), g_catalog, 1, &model, &e, &d);
    if (rc) tsr_diag_print(&d, stderr);
    assert_int_equal(rc, TSR_OK);
    assert_string_equal(tsr_engine_name(e), "test-engine");
    assert_int_equal(tsr_engine_device(e), TSR_DEVICE_CPU);
    assert_non_null(tsr_engine_pool(e));

    /* describe: one line per slot, with params and resolved provides */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    tsr_engine_describe(e, f);
    fclose(f);
    assert_non_null(strstr(text, "test_gemv"));
    assert_non_null(strstr(text, "1.2.3"));
    assert_non_null(strstr(text, "threads=2"));
    assert_non_null(strstr(text, "kv_dtype=f32"));
    assert_non_null(strstr(text, "kv_layout=contiguous"));
    free(text);

    /* gemv through the wrappers against a reference computed here */
    const tsr_slot_ref *g = tsr_engine_slot(e, TSR_SLOT_GEMV);
    assert_string_equal(g->plugin, "test_gemv");
    assert_true(g->exact && g->baseline);
    float W[3 * 4], x[2 * 4], y[2 * 3], ref[2 * 3];
    for (int i = 0; i < 12; i++) W[i] = (float)(i % 5) - 1.5f;
    for (int i = 0; i < 8; i++) x[i] = 0.25f * (float)i - 0.5f;
    for (int r = 0; r < 2; r++)
        for (int o = 0; o < 3; o++) {
            double acc = 0;
            for (int i = 0; i < 4; i++) acc += (double)x[r * 4 + i] * W[o * 4 + i];
            ref[r * 3 + o] = (float)acc;
        }
    tsr_weight w = {.name = "w", .dtype = TSR_DTYPE_F32, .rows = 3, .cols = 4, .data = W, .nbytes = sizeof W};
    void *prep = NULL;
    uint64_t before = tsr_engine_host_bytes(e);
    assert_int_equal(tsr_gemv_prepare(g, &w, &prep), TSR_OK);
    assert_true(tsr_engine_host_bytes(e) > before); /* the plugin's allocation is accounted */
    tsr_exec ex = {.device = TSR_DEVICE_CPU, .n_threads = 2};
    assert_int_equal(tsr_gemv_run(g, prep, 2, x, y, &ex), TSR_OK);
    for (int i = 0; i < 6; i++) assert_true(fabsf(y[i] - ref[i]) < 1e-6f);
    assert_true(tsr_gemv_bytes(g, prep, &w) == sizeof W); /* the documented default */
    tsr_gemv_release(g, prep);
    assert_true(tsr_engine_host_bytes(e) == before);
    tsr_weight wq = w;
    wq.dtype = TSR_DTYPE_Q8_0;
    assert_int_equal(tsr_gemv_prepare(g, &wq, &prep), TSR_ERR_UNSUPPORTED);
    assert_non_null(strstr(tsr_engine_plugin_error(e, TSR_SLOT_GEMV), "f32"));

    /* kv append/view/truncate + attention against a direct computation */
    const tsr_slot_ref *kv = tsr_engine_slot(e, TSR_SLOT_KV_CACHE);
    const tsr_slot_ref *at = tsr_engine_slot(e, TSR_SLOT_ATTENTION);
    int seq = -1;
    assert_int_equal(tsr_kv_seq_alloc(kv, 8, &seq), TSR_OK);
    float K[3 * 4], V[3 * 4], q[2 * 4], out[2 * 4];
    for (int i = 0; i < 12; i++) K[i] = sinf((float)i), V[i] = cosf((float)i);
    for (int i = 0; i < 8; i++) q[i] = 0.1f * (float)i;
    assert_int_equal(tsr_kv_append(kv, seq, 1, 0, 3, K, V, &ex), TSR_OK);
    assert_int_equal(tsr_kv_append(kv, seq, 1, 5, 1, K, V, &ex), TSR_ERR_RANGE); /* not at the end */
    tsr_kv_view view;
    assert_int_equal(tsr_kv_view_get(kv, seq, 1, &view), TSR_OK);
    assert_int_equal(view.n_tokens, 3);
    tsr_attn_args a = {.rows = 1, .pos0 = 2, .n_heads = 2, .n_kv_heads = 1, .head_dim = 4, .scale = 0.5f,
                       .q = q, .kv = &view, .out = out};
    assert_int_equal(tsr_attention_run(at, &a, &ex), TSR_OK);
    for (int h = 0; h < 2; h++) {
        double s[3], mx = -1e30, sum = 0;
        for (int t = 0; t < 3; t++) {
            s[t] = 0;
            for (int dd = 0; dd < 4; dd++) s[t] += (double)q[h * 4 + dd] * K[t * 4 + dd];
            s[t] *= 0.5;
            if (s[t] > mx) mx = s[t];
        }
        for (int t = 0; t < 3; t++) sum += exp(s[t] - mx);
        for (int dd = 0; dd < 4; dd++) {
            double o = 0;
            for (int t = 0; t < 3; t++) o += exp(s[t] - mx) / sum * V[t * 4 + dd];
            assert_true(fabs(o - out[h * 4 + dd]) < 1e-5);
        }
    }
    assert_int_equal(tsr_kv_truncate(kv, seq, 1), TSR_ERR_RANGE); /* layer 0 is empty */
    uint64_t used = 1, cap = 1;
    tsr_kv_usage(kv, &used, &cap); /* optional member absent: 0 and 0 */
    assert_true(used == 0 && cap == 0);
    tsr_kv_seq_free(kv, seq);

    /* drafter: propose nothing; optional seq_end absent is a no-op */
    const tsr_slot_ref *dr = tsr_engine_slot(e, TSR_SLOT_DRAFTER);
    int32_t toks[4] = {1, 2, 3, 4}, drafted[4];
    tsr_draft_req req = {.seq = 0, .tokens = toks, .n_tokens = 4, .max_draft = 4};
    tsr_draft_out dout = {.tokens = drafted, .n = -1};
    assert_int_equal(tsr_drafter_propose(dr, &req, &dout), TSR_OK);
    assert_int_equal(dout.n, 0);
    tsr_drafter_accept(dr, 0, 0, 0);
    tsr_drafter_seq_end(dr, 0);

    tsr_engine_free(e);
    tsr_diag_free(&d);
    assert_true(tsr_halloc_live() == live);
}

static void test_no_init_and_test_plugins_refused(void **state) {
    (void)state;
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_engine *e = NULL;
    /* test plugins are refused unless the caller allows them: every slot says so */
    assert_int_equal(open_engine(assembly("all.yaml", all_test), g_catalog, 0, NULL, &e, &d), TSR_ERR_REFUSED);
    assert_int_equal(d.n_errors, 5);
    assert_true(has_error(&d, TSR_ERR_REFUSED, "test plugin"));
    tsr_diag_free(&d);
    /* no_init: loaded and cross-checked, no instances */
    tsr_diag_init(&d);
    tsr_engine_opts o = {.catalog_dir = g_catalog, .allow_test = 1, .no_init = 1};
    assert_int_equal(tsr_engine_open_diag(assembly("all.yaml", all_test), NULL, NULL, &o, &e, &d), TSR_OK);
    const tsr_slot_ref *g = tsr_engine_slot(e, TSR_SLOT_GEMV);
    assert_non_null(g->iface);
    assert_null(g->inst);
    void *prep;
    assert_int_equal(tsr_gemv_prepare(g, NULL, &prep), TSR_ERR_UNSUPPORTED); /* the wrapper refuses */
    tsr_engine_free(e);
    tsr_diag_free(&d);
}

typedef struct badcase {
    const char *plugin;
    int code;
    const char *word;
} badcase;

static void test_bad_plugins(void **state) {
    (void)state;
    static const badcase cases[] = {
        {"bad_abi", TSR_ERR_REFUSED, "built for ABI 99."},
        {"bad_noentry", TSR_ERR_REFUSED, "no entry symbol tsr_plugin_entry"},
        {"bad_nullmember", TSR_ERR_REFUSED, "required member tsr_gemv_i.run is NULL"},
        {"bad_mismatch", TSR_ERR_REFUSED, "descriptor version '9.9.9' differs"},
        {"bad_init", TSR_ERR_PLUGIN, "init failed: deliberate failure (threads=3)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t live = tsr_halloc_live();
        tsr_diag d;
        tsr_diag_init(&d);
        tsr_engine *e = NULL;
        int rc = open_engine(with_gemv(cases[i].plugin), g_catalog, 1, &model, &e, &d);
        int ok = rc == cases[i].code && !e && has_error(&d, cases[i].code, cases[i].word) &&
                 strstr(d.errors[0].msg, cases[i].plugin) && strstr(d.errors[0].file, ".so");
        if (!ok) {
            fprintf(stderr, "bad plugin %s: rc %d\n", cases[i].plugin, rc);
            tsr_diag_print(&d, stderr);
        }
        assert_true(ok);
        tsr_diag_free(&d);
        assert_true(tsr_halloc_live() == live); /* bad_init's scratch was freed by the host */
        /* and the host keeps running: a good engine opens right after */
        tsr_diag_init(&d);
        assert_int_equal(open_engine(with_gemv("test_gemv"), g_catalog, 1, &model, &e, &d), TSR_OK);
        tsr_engine_free(e);
        tsr_diag_free(&d);
    }
}

/* A private copy of the test catalog to tamper with. */
static const char *copy_catalog(const char *name) {
    static char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", g_tmp, name);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s' && chmod -R go-w '%s'", dir, g_catalog, dir, dir);
    assert_int_equal(system(cmd), 0);
    return dir;
}

static void test_sha256_mismatch(void **state) {
    (void)state;
    const char *dir = copy_catalog("cat_sha");
    char lib[800];
    snprintf(lib, sizeof lib, "%s/libtest_gemv.so", dir);
    FILE *f = fopen(lib, "ab");
    assert_non_null(f);
    fputc(0, f); /* one byte more: a different library */
    fclose(f);
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_engine *e = NULL;
    assert_int_equal(open_engine(with_gemv("test_gemv"), dir, 1, &model, &e, &d), TSR_ERR_REFUSED);
    assert_true(has_error(&d, TSR_ERR_REFUSED, "sha256 mismatch"));
    assert_int_equal(d.errors[0].line, 7); /* the manifest's sha256 line */
    assert_non_null(strstr(d.errors[0].file, "test_gemv.yaml"));
    tsr_diag_free(&d);
    /* the same library through an export call is refused too */
    tsr_diag_init(&d);
    tsr_catalog *c = NULL;
    assert_int_equal(tsr_catalog_load(dir, &c, &d), TSR_OK);
    void *h = NULL;
    void (*fn)(void) = NULL;
    tsr_error err;
    assert_int_equal(tsr_export_bind(tsr_catalog_find(c, "test_gemv"), "test_gemv_add_i32", &h, &fn, &err),
                     TSR_ERR_REFUSED);
    assert_non_null(strstr(err.msg, "sha256 mismatch"));
    assert_null(h);
    tsr_catalog_free(c);
    tsr_diag_free(&d);
}

static void test_writable(void **state) {
    (void)state;
    const char *dir = copy_catalog("cat_w");
    assert_int_equal(chmod(dir, 0775), 0);
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_engine *e = NULL;
    assert_int_equal(open_engine(assembly("all.yaml", all_test), dir, 1, &model, &e, &d), TSR_ERR_REFUSED);
    assert_true(has_error(&d, TSR_ERR_REFUSED, "folder"));
    assert_true(has_error(&d, TSR_ERR_REFUSED, "writable by group"));
    assert_int_equal(d.n_errors, 5); /* every plugin of the engine */
    tsr_diag_free(&d);
    assert_int_equal(chmod(dir, 0755), 0);
    char lib[800];
    snprintf(lib, sizeof lib, "%s/libtest_drafter.so", dir);
    assert_int_equal(chmod(lib, 0757), 0);
    tsr_diag_init(&d);
    assert_int_equal(open_engine(assembly("all.yaml", all_test), dir, 1, &model, &e, &d), TSR_ERR_REFUSED);
    assert_int_equal(d.n_errors, 1);
    assert_true(has_error(&d, TSR_ERR_REFUSED, "libtest_drafter.so is writable by others"));
    tsr_diag_free(&d);
}

static void test_catalog_and_open_errors(void **state) {
    (void)state;
    /* two manifests of one name, and a malformed one: the catalog refuses, naming both files */
    const char *dir = copy_catalog("cat_dup");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cp '%s/test_gemv.yaml' '%s/zz_dup.yaml' && printf 'name: [x\\n' > '%s/broken.yml'",
             dir, dir, dir);
    assert_int_equal(system(cmd), 0);
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_catalog *c = NULL;
    assert_int_not_equal(tsr_catalog_load(dir, &c, &d), TSR_OK);
    assert_null(c);
    assert_int_equal(d.n_errors, 2);
    assert_true(has_error(&d, TSR_ERR_FORMAT, "already used by"));
    assert_true(has_error(&d, TSR_ERR_FORMAT, "malformed YAML"));
    tsr_diag_free(&d);
    /* a folder with no manifest: an empty catalog (its list of names never made: no sort of NULL) */
    char empty[700];
    snprintf(empty, sizeof empty, "%s/cat_empty", g_tmp);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -m 755 '%s'", empty, empty);
    assert_int_equal(system(cmd), 0);
    tsr_diag_init(&d);
    assert_int_equal(tsr_catalog_load(empty, &c, &d), TSR_OK);
    assert_non_null(c);
    assert_int_equal(d.n_errors, 0);
    assert_null(tsr_catalog_find(c, "test_gemv"));
    tsr_catalog_free(c);
    c = NULL;
    tsr_diag_free(&d);
    /* tsr_engine_open: the first error, and how many there were */
    tsr_error err;
    tsr_engine *e = NULL;
    tsr_engine_opts o = {.catalog_dir = g_catalog, .allow_test = 1};
    const char *path = assembly("three.yaml", "name: t\ndevice: cpu\nslots:\n  gemv: a\n  drafter: b\n  attention: c\n");
    assert_int_equal(tsr_engine_open(path, NULL, NULL, &o, &e, &err), TSR_ERR_REFUSED);
    assert_null(e);
    assert_int_equal(err.line, 6); /* slots are checked in slot order: attention first */
    assert_int_equal(err.col, 3);
    assert_non_null(strstr(err.msg, "(and 2 more errors)"));
    /* a missing assembly file */
    assert_int_equal(tsr_engine_open("/nonexistent/a.yaml", NULL, NULL, &o, &e, &err), TSR_ERR_IO);
    assert_non_null(strstr(err.file, "/nonexistent/a.yaml"));
}

static void test_ffi(void **state) {
    (void)state;
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_catalog *c = NULL;
    assert_int_equal(tsr_catalog_load(g_catalog, &c, &d), TSR_OK);
    const tsr_manifest *m = tsr_catalog_find(c, "test_gemv");
    assert_non_null(m);
    struct {
        const char *fn;
        const char *args[3];
        int n;
        const char *want;
    } calls[] = {
        {"test_gemv_add_i32", {"40", "2"}, 2, "42"},
        {"test_gemv_add_i32", {"-7", "-8"}, 2, "-15"},
        {"test_gemv_mul_i64", {"4000000000", "3"}, 2, "12000000000"},
        {"test_gemv_fma", {"1.5", "0.25", "-1"}, 3, "-0.625"},
        {"test_gemv_half", {"3"}, 1, "1.5"},
        {"test_gemv_strlen", {"tessera"}, 1, "7"},
        {"test_gemv_not", {"true"}, 1, "false"},
        {"test_gemv_not", {"false"}, 1, "true"},
        {"test_gemv_umax", {"18446744073709551615", "7"}, 2, "18446744073709551615"},
        {"test_gemv_parity", {"3"}, 1, "odd"},
    };
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        const tsr_mexport *ex = tsr_manifest_export(m, calls[i].fn);
        assert_non_null(ex);
        tsr_ffi_value args[3];
        tsr_error err;
        for (int j = 0; j < calls[i].n; j++)
            assert_int_equal(tsr_ffi_value_parse(ex->sig.args[j], calls[i].args[j], &args[j], &err), TSR_OK);
        void *h = NULL;
        void (*fn)(void) = NULL;
        assert_int_equal(tsr_export_bind(m, calls[i].fn, &h, &fn, &err), TSR_OK);
        tsr_ffi_value ret;
        assert_int_equal(tsr_ffi_call(fn, &ex->sig, args, calls[i].n, &ret, &err), TSR_OK);
        char buf[128];
        tsr_ffi_value_format(&ret, buf, sizeof buf);
        if (strcmp(buf, calls[i].want)) fprintf(stderr, "%s: got %s want %s\n", calls[i].fn, buf, calls[i].want);
        assert_string_equal(buf, calls[i].want);
        /* wrong arity and out-of-range arguments are errors, not calls */
        assert_int_equal(tsr_ffi_call(fn, &ex->sig, args, calls[i].n + 1, &ret, &err), TSR_ERR_INVALID);
        dlclose(h);
    }
    tsr_error err;
    tsr_ffi_value v;
    assert_int_equal(tsr_ffi_value_parse(TSR_FFI_INT32, "2147483648", &v, &err), TSR_ERR_INVALID);
    assert_int_equal(tsr_ffi_value_parse(TSR_FFI_UINT64, "-1", &v, &err), TSR_ERR_INVALID);
    assert_int_equal(tsr_ffi_value_parse(TSR_FFI_DOUBLE, "nan", &v, &err), TSR_ERR_INVALID);
    assert_int_equal(tsr_ffi_value_parse(TSR_FFI_BOOL, "yes", &v, &err), TSR_ERR_INVALID);
    tsr_ffi_sig sig;
    int off;
    assert_int_equal(tsr_ffi_sig_parse("void (int32, string)", &sig, &off, &err), TSR_OK);
    assert_int_equal(sig.n_args, 2);
    assert_int_equal(tsr_ffi_sig_parse("int32 (void)", &sig, &off, &err), TSR_ERR_FORMAT);
    assert_int_equal(off, 7);
    assert_int_equal(tsr_ffi_sig_parse("int32 (int32", &sig, &off, &err), TSR_ERR_FORMAT);
    assert_int_equal(tsr_ffi_sig_parse("int32 (int32) x", &sig, &off, &err), TSR_ERR_FORMAT);
    tsr_catalog_free(c);
    tsr_diag_free(&d);
}

static void test_lua_call(void **state) {
    (void)state;
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_catalog *c = NULL;
    assert_int_equal(tsr_catalog_load(g_catalog, &c, &d), TSR_OK);
    const char *script = "local s = tessera.call('test_gemv', 'test_gemv_add_i32', 40, 2)\n"
                         "local f = tessera.call('test_gemv', 'test_gemv_fma', 1.5, 0.25, -1)\n"
                         "local b = tessera.call('test_gemv', 'test_gemv_not', false)\n"
                         "local p = tessera.call('test_gemv', 'test_gemv_parity', 4)\n"
                         "local n = tessera.call('test_gemv', 'test_gemv_strlen', 'abc')\n"
                         "return {name = string.format('%d/%g/%s/%s/%d', s, f, tostring(b), p, n), device = 'cpu'}\n";
    tsr_assembly_env env = {.catalog = c, .device = TSR_DEVICE_CPU, .allow_test = 1};
    tsr_ynode *root = NULL;
    int rc = tsr_lua_assembly_run_buffer(script, strlen(script), "c.lua", &env, &root, &d);
    if (rc) tsr_diag_print(&d, stderr);
    assert_int_equal(rc, TSR_OK);
    const char *name;
    assert_true(tsr_ynode_as_str(tsr_ynode_get(root, "name"), &name));
    assert_string_equal(name, "42/-0.625/true/even/3");
    tsr_ynode_free(root);
    /* a wrong argument type is an error at the script's line */
    const char *bad = "local x = 1\nreturn tessera.call('test_gemv', 'test_gemv_add_i32', 'a', 2)\n";
    assert_int_equal(tsr_lua_assembly_run_buffer(bad, strlen(bad), "c.lua", &env, &root, &d), TSR_ERR_INVALID);
    assert_int_equal(d.errors[0].line, 2);
    assert_non_null(strstr(d.errors[0].msg, "argument 1 must be int32"));
    /* test plugins only when allowed */
    env.allow_test = 0;
    assert_int_equal(tsr_lua_assembly_run_buffer(script, strlen(script), "c.lua", &env, &root, &d), TSR_ERR_INVALID);
    assert_non_null(strstr(d.errors[1].msg, "test plugin"));
    tsr_catalog_free(c);
    tsr_diag_free(&d);
}

/* Fail the Nth host allocation for every N an engine open makes: each must
 * fail cleanly (no engine, an error) and leak nothing. */
static void test_alloc_failures(void **state) {
    (void)state;
    const char *path = assembly("all.yaml", all_test);
    uint64_t live = tsr_halloc_live();
    uint64_t n;
    int failures = 0;
    for (n = 1; n < 20000; n++) {
        tsr_diag d;
        tsr_diag_init(&d);
        tsr_engine *e = NULL;
        tsr_halloc_fail_at(n);
        int rc = open_engine(path, g_catalog, 1, &model, &e, &d);
        tsr_halloc_fail_at(0);
        tsr_diag_free(&d);
        if (rc == TSR_OK) {
            assert_non_null(e);
            tsr_engine_free(e);
            assert_true(tsr_halloc_live() == live);
            break;
        }
        failures++;
        assert_null(e);
        if (tsr_halloc_live() != live)
            fail_msg("allocation %llu failing leaked %lld blocks", (unsigned long long)n,
                     (long long)(tsr_halloc_live() - live));
    }
    fprintf(stderr, "fault injection: %d failing allocations, open succeeds from allocation %llu\n", failures,
            (unsigned long long)n);
    assert_true(failures > 50);
    assert_true(n < 20000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_engine),
        cmocka_unit_test(test_no_init_and_test_plugins_refused),
        cmocka_unit_test(test_bad_plugins),
        cmocka_unit_test(test_sha256_mismatch),
        cmocka_unit_test(test_writable),
        cmocka_unit_test(test_catalog_and_open_errors),
        cmocka_unit_test(test_ffi),
        cmocka_unit_test(test_lua_call),
        cmocka_unit_test(test_alloc_failures),
    };
    if (setup(NULL) != 0) {
        printf("test_host_load: skipped (no test catalog)\n");
        return 0;
    }
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    teardown(NULL);
    return rc;
}
