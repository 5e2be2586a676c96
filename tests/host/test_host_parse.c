/* Tests of the host runtime's documents: YAML trees, manifests, assemblies
 * (YAML and Lua), and the checker's resolution of requires/provides. No
 * plugin library is loaded here (see test_host_load.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "core/host/assembly.h"
#include "core/host/checker.h"
#include "core/host/halloc.h"
#include "core/host/lua_assembly.h"
#include "core/host/manifest.h"
#include "core/host/sha256.h"

#define SHA "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define BASE8                                   \
    "name: p_kv\n"                              \
    "slot: kv_cache\n"                          \
    "version: 1.0.0\n"                          \
    "abi: \"1.0\"\n"                            \
    "library: libp_kv.so\n"                     \
    "sha256: \"" SHA "\"\n"                     \
    "devices: [cpu]\n"                          \
    "exactness: exact\n"

/* 1 if some error in d has code, line, col (0 = any) and word in its message. */
static int has_error(const tsr_diag *d, int code, int line, int col, const char *word) {
    for (int i = 0; i < d->n_errors; i++) {
        const tsr_error *e = &d->errors[i];
        if (e->code == code && (!line || e->line == line) && (!col || e->col == col) && strstr(e->msg, word))
            return 1;
    }
    return 0;
}

static void dump(const tsr_diag *d) { tsr_diag_print(d, stderr); }

/* --- sha256 against FIPS 180-2 vectors -------------------------------------- */
static void test_sha256(void **state) {
    (void)state;
    static const struct {
        const char *in;
        const char *hex;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        tsr_sha256 s;
        uint8_t dig[32];
        char hex[65];
        tsr_sha256_init(&s);
        /* feed in uneven pieces to cross block boundaries */
        const char *p = v[i].in;
        size_t n = strlen(p);
        for (size_t o = 0; o < n; o += 7) tsr_sha256_update(&s, p + o, n - o < 7 ? n - o : 7);
        tsr_sha256_final(&s, dig);
        for (int j = 0; j < 32; j++) snprintf(hex + 2 * j, 3, "%02x", dig[j]);
        assert_string_equal(hex, v[i].hex);
    }
}

/* --- manifests ------------------------------------------------------------------ */

static void test_manifest_good(void **state) {
    (void)state;
    const char *doc = "name: ref_kv\n"
                      "slot: kv_cache\n"
                      "version: 1.2.3\n"
                      "abi: \"1.0\"\n"
                      "library: libref_kv.so\n"
                      "sha256: \"" SHA "\"\n"
                      "devices: [cpu, cuda]\n"
                      "exactness: lossy\n"
                      "quality: {max_mean_kl: 0.01, max_ppl_ratio: 1.02}\n"
                      "baseline: [cpu]\n"
                      "description: \"one line\"\n"
                      "provides:\n"
                      "  kv_dtype: $dtype\n"
                      "  kv_layout: contiguous\n"
                      "  block: 16\n"
                      "requires:\n"
                      "  gemv.fast: [true]\n"
                      "  model.moe: false\n"
                      "params:\n"
                      "  threads: {type: int, default: 0, min: 0, max: 1024, description: \"n\"}\n"
                      "  dtype: {type: string, default: f32, values: [f32, f16]}\n"
                      "  eps: {type: float, default: 0.5, min: 0, max: 1}\n"
                      "  enable: {type: bool, default: true}\n"
                      "exports:\n"
                      "  - name: ref_kv_bytes\n"
                      "    signature: \"int64 (int32, int32, int32)\"\n";
    uint64_t live = tsr_halloc_live();
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_manifest *m = NULL;
    int rc = tsr_manifest_parse(doc, strlen(doc), "/cat/ref_kv.yaml", &m, &d);
    if (rc) dump(&d);
    assert_int_equal(rc, TSR_OK);
    assert_string_equal(m->name, "ref_kv");
    assert_int_equal(m->slot, TSR_SLOT_KV_CACHE);
    assert_int_equal(m->devices, TSR_DEVMASK_CPU | TSR_DEVMASK_CUDA);
    assert_int_equal(m->baseline, TSR_DEVMASK_CPU);
    assert_int_equal(m->exact, 0);
    assert_true(m->max_ppl_ratio > 1.019 && m->max_ppl_ratio < 1.021);
    assert_string_equal(m->library_path, "/cat/libref_kv.so");
    assert_int_equal(m->n_provides, 3);
    assert_string_equal(tsr_manifest_provides(m, "block")->values[0], "16");
    assert_string_equal(m->requires[0].values[0], "true");
    assert_string_equal(m->requires[1].values[0], "false");
    const tsr_mparam *p = tsr_manifest_param(m, "eps");
    assert_non_null(p);
    assert_int_equal(p->type, TSR_PARAM_FLOAT);
    assert_true(p->def.v.f == 0.5);
    assert_int_equal(tsr_manifest_param(m, "dtype")->n_values, 2);
    assert_int_equal(tsr_manifest_param(m, "enable")->def.v.b, 1);
    assert_int_equal(m->n_exports, 1);
    assert_int_equal(m->exports[0].sig.ret, TSR_FFI_INT64);
    assert_int_equal(m->exports[0].sig.n_args, 3);
    tsr_manifest_free(m);
    tsr_diag_free(&d);
    assert_true(tsr_halloc_live() == live);
}

typedef struct mcase {
    const char *doc;
    int code, line, col;
    const char *word;
} mcase;

static void test_manifest_bad(void **state) {
    (void)state;
    static const mcase cases[] = {
        {BASE8 "colour: red\n", TSR_ERR_FORMAT, 9, 1, "unknown key 'colour'"},
        {BASE8 "test: 3\n", TSR_ERR_FORMAT, 9, 7, "true or false"},
        {BASE8 "baseline: [gpu]\n", TSR_ERR_FORMAT, 9, 12, "unknown device"},
        {BASE8 "name: again\n", TSR_ERR_FORMAT, 9, 1, "duplicate key 'name'"},
        {BASE8 "description: &a x\n", TSR_ERR_FORMAT, 9, 14, "anchors"},
        {BASE8 "description: !!str x\n", TSR_ERR_FORMAT, 9, 14, "tags"},
        {BASE8 "provides: {a: 1}\nrequires: {gemv.a: *x}\n", TSR_ERR_FORMAT, 10, 20, "alias"},
        {BASE8 "exports:\n  - {name: f, signature: \"int64 (int128)\"}\n", TSR_ERR_FORMAT, 10, 34,
         "unsupported argument type 'int128'"},
        {BASE8 "exports:\n  - {name: f, signature: \"struct (int32)\"}\n", TSR_ERR_FORMAT, 10, 27,
         "unsupported return type"},
        {BASE8 "exports:\n  - {name: f}\n", TSR_ERR_FORMAT, 10, 5, "missing 'signature'"},
        {BASE8 "quality: {max_mean_kl: 0.1, max_ppl_ratio: 1.1}\n", TSR_ERR_FORMAT, 9, 10, "forbidden"},
        {BASE8 "params:\n  n: {type: int, default: 5, max: 4}\n", TSR_ERR_FORMAT, 10, 27, "out of range"},
        {BASE8 "params:\n  n: {type: int, default: x}\n", TSR_ERR_FORMAT, 10, 27, "must be an integer"},
        {BASE8 "params:\n  s: {type: string, default: c, values: [a, b]}\n", TSR_ERR_FORMAT, 10, 30,
         "not one of"},
        {BASE8 "params:\n  n: {type: complex, default: 1}\n", TSR_ERR_FORMAT, 10, 13, "unknown type"},
        {BASE8 "params:\n  n: {type: int, default: 1, step: 2}\n", TSR_ERR_FORMAT, 10, 30, "unknown key 'step'"},
        {BASE8 "provides:\n  kv_dtype: $nope\n", TSR_ERR_FORMAT, 10, 3, "names no declared param"},
        {BASE8 "provides:\n  kv_dtype: 0.5\n", TSR_ERR_FORMAT, 10, 13, "floats"},
        {BASE8 "requires:\n  foo.bar: 1\n", TSR_ERR_FORMAT, 10, 3, "unknown slot 'foo'"},
        {BASE8 "requires:\n  model.colour: red\n", TSR_ERR_FORMAT, 10, 3, "unknown model field"},
        {BASE8 "requires:\n  device: [tpu]\n", TSR_ERR_FORMAT, 10, 3, "unknown device 'tpu'"},
        {BASE8 "requires:\n  whatever: 1\n", TSR_ERR_FORMAT, 10, 3, "SLOT.CAPABILITY"},
        {BASE8 "provides: [a, b]\n", TSR_ERR_FORMAT, 9, 11, "must be a mapping"},
        {"name: p\nslot: gpu\n", TSR_ERR_FORMAT, 2, 7, "unknown slot"},
        {"name: Bad-Name\n", TSR_ERR_FORMAT, 1, 7, "must match"},
        {"version: \"1.0\"\n", TSR_ERR_FORMAT, 1, 10, "MAJOR.MINOR.PATCH"},
        {"abi: \"2.0\"\n", TSR_ERR_REFUSED, 1, 6, "not supported"},
        {"abi: \"1.9\"\n", TSR_ERR_REFUSED, 1, 6, "not supported"},
        {"sha256: \"@SHA256@\"\n", TSR_ERR_FORMAT, 1, 9, "not filled in"},
        {"sha256: abc\n", TSR_ERR_FORMAT, 1, 9, "64 hex"},
        {"library: /etc/libx.so\n", TSR_ERR_FORMAT, 1, 10, "relative"},
        {"exactness: lossy\n", TSR_ERR_FORMAT, 1, 12, "must declare quality"},
        {"devices: []\n", TSR_ERR_FORMAT, 1, 10, "must not be empty"},
        {"name: p\n", TSR_ERR_FORMAT, 1, 1, "missing required key 'library'"},
        {"name: [unclosed\n", TSR_ERR_FORMAT, 2, 1, "malformed YAML"},
        {"name: a\n  bad: indent\n", TSR_ERR_FORMAT, 2, 6, "malformed YAML"},
        {"- a\n- b\n", TSR_ERR_FORMAT, 1, 1, "must be a mapping"},
        {"a: 1\n---\nb: 2\n", TSR_ERR_FORMAT, 2, 1, "more than one document"},
        {"? [a]\n: 1\n", TSR_ERR_FORMAT, 1, 3, "plain scalars"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t live = tsr_halloc_live();
        tsr_diag d;
        tsr_diag_init(&d);
        tsr_manifest *m = NULL;
        int rc = tsr_manifest_parse(cases[i].doc, strlen(cases[i].doc), "m.yaml", &m, &d);
        int ok = rc != TSR_OK && m == NULL && has_error(&d, cases[i].code, cases[i].line, cases[i].col, cases[i].word);
        if (!ok) {
            fprintf(stderr, "case %zu (%s) expected %d at %d:%d '%s', got rc %d:\n", i, cases[i].doc, cases[i].code,
                    cases[i].line, cases[i].col, cases[i].word, rc);
            dump(&d);
        }
        assert_true(ok);
        assert_string_equal(d.errors[0].file, "m.yaml");
        tsr_diag_free(&d);
        assert_true(tsr_halloc_live() == live);
    }
}

static void test_manifest_collects_every_error(void **state) {
    (void)state;
    const char *doc = BASE8 "colour: red\ntest: maybe\nbaseline: [tpu]\n";
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_manifest *m = NULL;
    assert_int_not_equal(tsr_manifest_parse(doc, strlen(doc), "m.yaml", &m, &d), TSR_OK);
    assert_int_equal(d.n_errors, 3);
    assert_true(has_error(&d, TSR_ERR_FORMAT, 9, 1, "colour"));
    assert_true(has_error(&d, TSR_ERR_FORMAT, 10, 7, "test"));
    assert_true(has_error(&d, TSR_ERR_FORMAT, 11, 12, "tpu"));
    tsr_error first;
    tsr_diag_to_error(&d, &first);
    assert_non_null(strstr(first.msg, "and 2 more errors"));
    tsr_diag_free(&d);
}

static void test_limits(void **state) {
    (void)state;
    /* nested 70 deep */
    char deep[400];
    size_t o = (size_t)snprintf(deep, sizeof deep, "description: ");
    for (int i = 0; i < 70; i++) deep[o++] = '[';
    for (int i = 0; i < 70; i++) deep[o++] = ']';
    deep[o++] = '\n';
    deep[o] = '\0';
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_ynode *root = NULL;
    assert_int_equal(tsr_ydoc_parse(deep, strlen(deep), "deep.yaml", &root, &d), TSR_ERR_FORMAT);
    assert_true(has_error(&d, TSR_ERR_FORMAT, 1, 14 + 63, "nested deeper than 64"));
    assert_null(root);
    tsr_diag_free(&d);
    /* exactly 64 levels (the root map plus 63 lists) is fine */
    o = (size_t)snprintf(deep, sizeof deep, "d: ");
    for (int i = 0; i < 63; i++) deep[o++] = '[';
    for (int i = 0; i < 63; i++) deep[o++] = ']';
    deep[o] = '\0';
    tsr_diag_init(&d);
    assert_int_equal(tsr_ydoc_parse(deep, strlen(deep), "ok.yaml", &root, &d), TSR_OK);
    tsr_ynode_free(root);
    tsr_diag_free(&d);
    /* over 1 MiB */
    size_t big = TSR_YDOC_MAX_BYTES + 10;
    char *buf = malloc(big);
    assert_non_null(buf);
    memset(buf, '#', big);
    tsr_diag_init(&d);
    assert_int_equal(tsr_ydoc_parse(buf, big, "big.yaml", &root, &d), TSR_ERR_FORMAT);
    assert_true(has_error(&d, TSR_ERR_FORMAT, 0, 0, "more than the limit"));
    tsr_diag_free(&d);
    free(buf);
    /* embedded NUL */
    tsr_diag_init(&d);
    assert_int_not_equal(tsr_ydoc_parse("a: \"x\\0y\"\n", 10, "nul.yaml", &root, &d), TSR_OK);
    tsr_diag_free(&d);
}

static void test_scalar_types(void **state) {
    (void)state;
    const char *doc = "i: -42\nh: 0x1F\nf: 2.5e-3\nb: True\ns: \"42\"\nn: ~\nbig: 99999999999999999999\ninf: .inf\n";
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_ynode *r = NULL;
    assert_int_equal(tsr_ydoc_parse(doc, strlen(doc), "t.yaml", &r, &d), TSR_OK);
    int64_t i;
    double f;
    int b;
    const char *s;
    assert_true(tsr_ynode_as_int(tsr_ynode_get(r, "i"), &i) && i == -42);
    assert_true(tsr_ynode_as_int(tsr_ynode_get(r, "h"), &i) && i == 31);
    assert_false(tsr_ynode_as_int(tsr_ynode_get(r, "f"), &i));
    assert_true(tsr_ynode_as_float(tsr_ynode_get(r, "f"), &f) && f == 2.5e-3);
    assert_true(tsr_ynode_as_bool(tsr_ynode_get(r, "b"), &b) && b == 1);
    assert_false(tsr_ynode_as_int(tsr_ynode_get(r, "s"), &i)); /* quoted: a string */
    assert_true(tsr_ynode_as_str(tsr_ynode_get(r, "s"), &s) && !strcmp(s, "42"));
    assert_true(tsr_ynode_is_null(tsr_ynode_get(r, "n")));
    assert_false(tsr_ynode_as_int(tsr_ynode_get(r, "big"), &i)); /* overflow is not an int */
    assert_false(tsr_ynode_as_float(tsr_ynode_get(r, "inf"), &f));
    tsr_ynode_free(r);
    tsr_diag_free(&d);
}

/* --- assemblies ----------------------------------------------------------------- */

static void test_assembly_yaml(void **state) {
    (void)state;
    const char *doc = "name: a1\n"
                      "device: cpu\n"
                      "slots:\n"
                      "  gemv: g\n"
                      "  attention: {plugin: att, params: {threads: 2}}\n";
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_assembly *a = NULL;
    assert_int_equal(tsr_assembly_parse(doc, strlen(doc), "a.yaml", &a, &d), TSR_OK);
    assert_string_equal(a->name, "a1");
    assert_int_equal(a->device, TSR_DEVICE_CPU);
    assert_true(a->slots[TSR_SLOT_GEMV].given);
    assert_string_equal(a->slots[TSR_SLOT_GEMV].plugin, "g");
    assert_int_equal(a->slots[TSR_SLOT_GEMV].line, 4);
    assert_string_equal(a->slots[TSR_SLOT_ATTENTION].plugin, "att");
    assert_non_null(a->slots[TSR_SLOT_ATTENTION].params);
    assert_false(a->slots[TSR_SLOT_KV_CACHE].given);
    tsr_assembly_free(a);
    tsr_diag_free(&d);
}

static void test_assembly_bad(void **state) {
    (void)state;
    static const mcase cases[] = {
        {"name: a\ndevice: cpu\ncolour: red\n", TSR_ERR_FORMAT, 3, 1, "unknown key 'colour'"},
        {"name: a\ndevice: tpu\n", TSR_ERR_FORMAT, 2, 9, "unknown device"},
        {"name: a\n", TSR_ERR_FORMAT, 1, 1, "missing required key 'device'"},
        {"device: cpu\n", TSR_ERR_FORMAT, 1, 1, "missing required key 'name'"},
        {"name: a\ndevice: cpu\nslots:\n  gpu: x\n", TSR_ERR_FORMAT, 4, 3, "unknown slot 'gpu'"},
        {"name: a\ndevice: cpu\nslots:\n  gemv: [x]\n", TSR_ERR_FORMAT, 4, 9, "plugin name or"},
        {"name: a\ndevice: cpu\nslots:\n  gemv: {plugin: g, colour: 1}\n", TSR_ERR_FORMAT, 4, 21, "unknown key 'colour'"},
        {"name: a\ndevice: cpu\nslots:\n  gemv: {params: {}}\n", TSR_ERR_FORMAT, 4, 9, "missing 'plugin'"},
        {"name: a\ndevice: cpu\nslots:\n  gemv: {plugin: g, params: [1]}\n", TSR_ERR_FORMAT, 4, 29, "must be a mapping"},
        {"name: a\ndevice: cpu\nslots:\n  gemv: Bad-Name\n", TSR_ERR_FORMAT, 4, 9, "not a plugin name"},
        {"name: a\ndevice: cpu\nslots:\n  gemv: g\n  gemv: h\n", TSR_ERR_FORMAT, 5, 3, "duplicate key 'gemv'"},
        {"name: a\ndevice: cpu\nslots: 3\n", TSR_ERR_FORMAT, 3, 8, "slots must be a mapping"},
        {"name: [a\n", TSR_ERR_FORMAT, 0, 0, "malformed"},
        {"name: &x a\ndevice: *x\n", TSR_ERR_FORMAT, 1, 7, "anchors"},
        {"name: a\ndevice: cpu\nruntime: 3\n", TSR_ERR_FORMAT, 3, 10, "runtime must be a mapping"},
        {"name: a\ndevice: cpu\nruntime:\n  colour: 1\n", TSR_ERR_FORMAT, 4, 3,
         "runtime: unknown key 'colour' (cuda_graphs, pdl, pipeline)"},
        {"name: a\ndevice: cpu\nruntime:\n  cuda_graphs: yes\n", TSR_ERR_FORMAT, 4, 16, "must be true or false"},
        {"name: a\ndevice: cpu\nruntime:\n  pdl: 2\n", TSR_ERR_FORMAT, 4, 8, "runtime.pdl must be true or false"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tsr_diag d;
        tsr_diag_init(&d);
        tsr_assembly *a = NULL;
        int rc = tsr_assembly_parse(cases[i].doc, strlen(cases[i].doc), "a.yaml", &a, &d);
        int ok = rc != TSR_OK && !a && has_error(&d, cases[i].code, cases[i].line, cases[i].col, cases[i].word);
        if (!ok) {
            fprintf(stderr, "assembly case %zu: rc %d\n", i, rc);
            dump(&d);
        }
        assert_true(ok);
        tsr_diag_free(&d);
    }
}

/* --- an in-memory catalog (no libraries: the checker runs with skip_files) --- */

#define MHEAD(name, slot) \
    "name: " name "\nslot: " slot "\nversion: 1.0.0\nabi: \"1.0\"\nlibrary: lib" name ".so\nsha256: \"" SHA "\"\nexactness: exact\n"

static const char *const mem_manifests[] = {
    MHEAD("kv_a", "kv_cache") "devices: [cpu]\nbaseline: [cpu]\n"
                              "provides: {kv_dtype: $dtype, kv_layout: contiguous}\n"
                              "params: {dtype: {type: string, default: f32, values: [f32, f16]}}\n",
    MHEAD("kv_paged", "kv_cache") "devices: [cpu]\nprovides: {kv_dtype: [f16, f32], kv_layout: paged}\n",
    MHEAD("att_any", "attention") "devices: [cpu]\nbaseline: [cpu]\n"
                                  "requires: {kv_cache.kv_dtype: [f32, f16], kv_cache.kv_layout: contiguous}\n",
    MHEAD("att_f16", "attention") "devices: [cpu]\nrequires: {kv_cache.kv_dtype: [f16], kv_cache.kv_layout: contiguous}\n",
    MHEAD("att_blk", "attention") "devices: [cpu]\nrequires: {kv_cache.block_size: 16}\n",
    MHEAD("att_cuda", "attention") "devices: [cuda]\n",
    MHEAD("gemv_a", "gemv") "devices: [cpu]\nbaseline: [cpu]\n"
                            "params: {threads: {type: int, default: 0, min: 0, max: 64}}\n",
    MHEAD("dr_a", "drafter") "devices: [cpu]\nbaseline: [cpu]\n",
    MHEAD("ec_moe", "expert_cache") "devices: [cpu]\nbaseline: [cpu]\nrequires: {model.moe: true, device: cpu}\n",
    MHEAD("ec_test", "expert_cache") "devices: [cpu]\ntest: true\n",
};

/* CUDA plugins, for runtime.cuda_graphs: every baseline replays captured
 * passes (provides cuda_graph), att_plain does not; for runtime.pipeline:
 * dr_g proposes nothing, dr_spec as many as its param says. */
static const char *const cuda_manifests[] = {
    MHEAD("gemv_g", "gemv") "devices: [cuda]\nbaseline: [cuda]\nprovides: {cuda_graph: true}\n",
    MHEAD("att_g", "attention") "devices: [cuda]\nbaseline: [cuda]\nprovides: {cuda_graph: true}\n",
    MHEAD("att_plain", "attention") "devices: [cuda]\n",
    MHEAD("kv_g", "kv_cache") "devices: [cuda]\nbaseline: [cuda]\nprovides: {cuda_graph: true}\n",
    MHEAD("dr_g", "drafter") "devices: [cuda]\nbaseline: [cuda]\nprovides: {max_draft: 0}\n",
    MHEAD("dr_spec", "drafter") "devices: [cuda]\nprovides: {max_draft: $max_draft}\n"
                                "params: {max_draft: {type: int, default: 4, min: 0, max: 16}}\n",
    MHEAD("ec_g", "expert_cache") "devices: [cuda]\nbaseline: [cuda]\n",
};

static tsr_catalog *catalog_of(const char *const *manifests, size_t n);

static tsr_catalog *mem_catalog(void) {
    return catalog_of(mem_manifests, sizeof mem_manifests / sizeof mem_manifests[0]);
}

static tsr_catalog *catalog_of(const char *const *manifests, size_t n) {
    tsr_catalog *c = tsr_hcalloc(1, sizeof *c);
    c->dir = tsr_hstrdup("<mem>");
    c->items = tsr_hcalloc(n, sizeof *c->items);
    tsr_diag d;
    tsr_diag_init(&d);
    for (size_t i = 0; i < n; i++) {
        tsr_manifest *m = NULL;
        if (tsr_manifest_parse(manifests[i], strlen(manifests[i]), "/mem/m.yaml", &m, &d)) {
            dump(&d);
            fail_msg("in-memory manifest %zu does not parse", i);
        }
        c->items[c->n++] = m;
    }
    tsr_diag_free(&d);
    return c;
}

static int check_doc(const tsr_catalog *c, const char *doc, const tsr_model_config *model, int allow_test,
                     tsr_diag *d, tsr_plan **plan_out) {
    tsr_assembly *a = NULL;
    int rc = tsr_assembly_parse(doc, strlen(doc), "a.yaml", &a, d);
    if (rc) return rc;
    tsr_check_opts o = {.model = model, .allow_test = allow_test, .skip_files = 1};
    tsr_plan *p = NULL;
    rc = tsr_check(c, a, &o, &p, d);
    if (plan_out && p) {
        *plan_out = p;
        /* keep a alive with the plan for the caller: leak-free because the
         * caller frees both through plan->assembly */
    } else {
        tsr_plan_free(p);
        tsr_assembly_free(a);
    }
    return rc;
}

#define ASM(slots) "name: t\ndevice: cpu\nslots:\n" slots

/* The plan of doc, which must pass the checker; plan_done frees it with its
 * assembly. */
static tsr_plan *accepted(const tsr_catalog *c, const char *doc, const tsr_model_config *model) {
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_plan *p = NULL;
    if (check_doc(c, doc, model, 0, &d, &p) != TSR_OK || !p) {
        dump(&d);
        fail_msg("refused: %s", doc);
    }
    tsr_diag_free(&d);
    return p;
}

static void plan_done(tsr_plan *p) {
    tsr_assembly_free((tsr_assembly *)p->assembly);
    tsr_plan_free(p);
}

/* doc checked against c (model, no test plugins) is refused with an error
 * at line:col naming word (a macro: a failure reports the caller's line). */
#define EXPECT_REFUSED(c, doc, model, line, col, word)                                                  \
    do {                                                                                               \
        tsr_diag d_;                                                                                   \
        tsr_diag_init(&d_);                                                                            \
        assert_int_equal(check_doc((c), (doc), (model), 0, &d_, NULL), TSR_ERR_REFUSED);               \
        assert_true(has_error(&d_, TSR_ERR_REFUSED, (line), (col), (word)));                            \
        tsr_diag_free(&d_);                                                                            \
    } while (0)

static void test_checker_resolution(void **state) {
    (void)state;
    tsr_catalog *c = mem_catalog();
    tsr_model_config moe = {.n_experts = 8, .n_experts_used = 2};
    tsr_model_config dense = {.n_experts = 0};
    snprintf(moe.arch_name, sizeof moe.arch_name, "mixtral");
    snprintf(dense.arch_name, sizeof dense.arch_name, "llama");
    tsr_diag d;

    /* all baselines; model not given: the model requirement is noted */
    tsr_diag_init(&d);
    tsr_plan *p = NULL;
    assert_int_equal(check_doc(c, "name: t\ndevice: cpu\n", NULL, 0, &d, &p), TSR_OK);
    assert_string_equal(p->slots[TSR_SLOT_ATTENTION].m->name, "att_any");
    assert_string_equal(p->slots[TSR_SLOT_EXPERT_CACHE].m->name, "ec_moe");
    assert_false(p->slots[TSR_SLOT_GEMV].given);
    assert_int_equal(d.n_notes, 1);
    assert_non_null(strstr(d.notes[0], "not checked: no model"));
    assert_non_null(strstr(d.notes[0], "model.moe"));
    tsr_assembly_free((tsr_assembly *)p->assembly);
    tsr_plan_free(p);
    tsr_diag_free(&d);

    /* with a MoE model it passes; with a dense one ec_moe is refused */
    tsr_diag_init(&d);
    assert_int_equal(check_doc(c, "name: t\ndevice: cpu\n", &moe, 0, &d, NULL), TSR_OK);
    assert_int_equal(d.n_notes, 0);
    tsr_diag_free(&d);
    EXPECT_REFUSED(c, "name: t\ndevice: cpu\n", &dense, 1, 1, "requires model.moe in [true], the model has false");

    /* att_f16 against the default kv dtype f32: refused at the attention line */
    EXPECT_REFUSED(c, ASM("  attention: att_f16\n"), &moe, 4, 3, "provides kv_dtype = [f32]");

    /* ... and accepted once the kv param makes it provide f16 ($dtype) */
    p = accepted(c, ASM("  attention: att_f16\n  kv_cache: {plugin: kv_a, params: {dtype: f16}}\n"), &moe);
    char v[64];
    tsr_plan_provided(&p->slots[TSR_SLOT_KV_CACHE], tsr_manifest_provides(p->slots[TSR_SLOT_KV_CACHE].m, "kv_dtype"),
                      0, v, sizeof v);
    assert_string_equal(v, "f16");
    plan_done(p);

    /* list intersection: paged f16/f32 kv satisfies dtype but not layout */
    tsr_diag_init(&d);
    assert_int_equal(check_doc(c, ASM("  kv_cache: kv_paged\n"), &moe, 0, &d, NULL), TSR_ERR_REFUSED);
    assert_int_equal(d.n_errors, 1);
    assert_true(has_error(&d, TSR_ERR_REFUSED, 1, 1, "kv_cache.kv_layout in [contiguous]"));
    tsr_diag_free(&d);

    /* a capability nobody provides */
    EXPECT_REFUSED(c, ASM("  attention: att_blk\n"), &moe, 4, 3, "provides no 'block_size'");

    /* device, unknown plugin, wrong slot, test plugin, params: every error at once */
    tsr_diag_init(&d);
    assert_int_equal(check_doc(c,
                               ASM("  attention: att_cuda\n"
                                   "  drafter: nosuch\n"
                                   "  gemv: {plugin: gemv_a, params: {threads: 99, colour: 1}}\n"
                                   "  kv_cache: {plugin: kv_a, params: {dtype: bf16}}\n"
                                   "  expert_cache: ec_test\n"),
                               &moe, 0, &d, NULL),
                     TSR_ERR_REFUSED);
    assert_true(has_error(&d, TSR_ERR_REFUSED, 4, 3, "runs on [cuda]"));
    assert_true(has_error(&d, TSR_ERR_REFUSED, 5, 3, "no plugin 'nosuch'"));
    assert_true(has_error(&d, TSR_ERR_INVALID, 6, 44, "out of range"));
    assert_true(has_error(&d, TSR_ERR_INVALID, 6, 48, "unknown param 'colour'"));
    assert_true(has_error(&d, TSR_ERR_INVALID, 7, 44, "not one of"));
    assert_true(has_error(&d, TSR_ERR_REFUSED, 8, 3, "test plugin"));
    assert_int_equal(d.n_errors, 6);
    tsr_diag_free(&d);

    /* test plugins pass when allowed; wrong-type param; plugin in the wrong slot */
    tsr_diag_init(&d);
    assert_int_equal(check_doc(c, ASM("  expert_cache: ec_test\n"), &moe, 1, &d, NULL), TSR_OK);
    tsr_diag_free(&d);
    tsr_diag_init(&d);
    assert_int_equal(check_doc(c, ASM("  gemv: {plugin: gemv_a, params: {threads: two}}\n  drafter: gemv_a\n"), &moe,
                               0, &d, NULL),
                     TSR_ERR_REFUSED);
    assert_true(has_error(&d, TSR_ERR_INVALID, 4, 44, "must be an integer"));
    assert_true(has_error(&d, TSR_ERR_REFUSED, 5, 3, "fills slot gemv"));
    tsr_diag_free(&d);

    tsr_catalog_free(c);
}

static void test_checker_baselines(void **state) {
    (void)state;
    tsr_catalog *c = mem_catalog();
    /* make kv_paged a second cpu baseline: a slot left out is then ambiguous */
    tsr_manifest *paged = (tsr_manifest *)tsr_catalog_find(c, "kv_paged");
    paged->baseline = TSR_DEVMASK_CPU;
    EXPECT_REFUSED(c, "name: t\ndevice: cpu\n", NULL, 1, 1, "2 baselines");
    tsr_diag d;
    /* no baseline for cuda at all */
    tsr_diag_init(&d);
    assert_int_equal(check_doc(c, "name: t\ndevice: cuda\n", NULL, 0, &d, NULL), TSR_ERR_REFUSED);
    assert_true(has_error(&d, TSR_ERR_REFUSED, 1, 1, "no baseline gemv plugin for device cuda"));
    assert_int_equal(d.n_errors, 5);
    tsr_diag_free(&d);
    tsr_catalog_free(c);
}

/* runtime.cuda_graphs: only on cuda, only with plugins that replay captured passes. */
static void test_checker_graphs(void **state) {
    (void)state;
    tsr_catalog *c = catalog_of(cuda_manifests, sizeof cuda_manifests / sizeof cuda_manifests[0]);
    tsr_plan *p = accepted(c, "name: t\ndevice: cuda\nruntime:\n  cuda_graphs: true\n", NULL);
    assert_true(p->assembly->runtime[TSR_RT_CUDA_GRAPHS].on);
    plan_done(p);
    EXPECT_REFUSED(c, "name: t\ndevice: cuda\nslots:\n  attention: att_plain\nruntime:\n  cuda_graphs: true\n", NULL, 6,
                   16, "plugin att_plain (slot attention) does not provide cuda_graph");
    /* off, the same plugin is fine */
    plan_done(accepted(c, "name: t\ndevice: cuda\nslots:\n  attention: att_plain\nruntime: {cuda_graphs: false}\n", NULL));
    tsr_catalog_free(c);
    c = mem_catalog();
    EXPECT_REFUSED(c, "name: t\ndevice: cpu\nruntime:\n  cuda_graphs: true\n", NULL, 4, 16,
                   "runtime.cuda_graphs needs device cuda");
    tsr_catalog_free(c);
}

/* runtime.pdl: a launch attribute of CUDA kernels, refused elsewhere; any
 * plugin may take part (one that ignores it launches as before). */
static void test_checker_pdl(void **state) {
    (void)state;
    tsr_catalog *c = catalog_of(cuda_manifests, sizeof cuda_manifests / sizeof cuda_manifests[0]);
    tsr_plan *p = accepted(c, "name: t\ndevice: cuda\nslots:\n  attention: att_plain\nruntime:\n  pdl: true\n", NULL);
    assert_true(p->assembly->runtime[TSR_RT_PDL].on);
    assert_false(p->assembly->runtime[TSR_RT_CUDA_GRAPHS].on);
    plan_done(p);
    tsr_catalog_free(c);
    c = mem_catalog();
    EXPECT_REFUSED(c, "name: t\ndevice: cpu\nruntime: {cuda_graphs: false, pdl: true}\n", NULL, 3, 36,
                   "runtime.pdl needs device cuda");
    tsr_catalog_free(c);
}

/* runtime.pipeline: only on cuda, only with a drafter that proposes nothing
 * (its max_draft, a param's value where it names one). */
static void test_checker_pipeline(void **state) {
    (void)state;
    tsr_catalog *c = catalog_of(cuda_manifests, sizeof cuda_manifests / sizeof cuda_manifests[0]);
    tsr_plan *p = accepted(c, "name: t\ndevice: cuda\nruntime:\n  pipeline: true\n", NULL);
    assert_true(p->assembly->runtime[TSR_RT_PIPELINE].on);
    plan_done(p);
    EXPECT_REFUSED(c, "name: t\ndevice: cuda\nslots:\n  drafter: dr_spec\nruntime:\n  pipeline: true\n", NULL, 6, 13,
                   "needs a drafter that proposes nothing (max_draft: 0); plugin dr_spec provides max_draft = 4");
    plan_done(accepted(c,
                       "name: t\ndevice: cuda\nslots:\n  drafter: {plugin: dr_spec, params: {max_draft: 0}}\n"
                       "runtime:\n  pipeline: true\n",
                       NULL));
    tsr_catalog_free(c);
    c = mem_catalog();
    EXPECT_REFUSED(c, "name: t\ndevice: cpu\nruntime: {pipeline: true}\n", NULL, 3, 21,
                   "runtime.pipeline needs device cuda, the assembly's device is cpu");
    tsr_catalog_free(c);
}

/* --- Lua assemblies ------------------------------------------------------------- */

static int lua_doc(const char *script, const tsr_assembly_env *env, tsr_assembly **out, tsr_diag *d) {
    tsr_ynode *root = NULL;
    *out = NULL;
    int rc = tsr_lua_assembly_run_buffer(script, strlen(script), "a.lua", env, &root, d);
    if (rc) return rc;
    return tsr_assembly_from_tree(root, "a.lua", out, d);
}

static void test_lua_ok(void **state) {
    (void)state;
    tsr_catalog *c = mem_catalog();
    tsr_model_config moe = {.n_experts = 8, .n_layers = 4, .dtype = TSR_DTYPE_BF16};
    snprintf(moe.arch_name, sizeof moe.arch_name, "mixtral");
    const char *script =
        "-- choose an expert cache only for a MoE model; count the catalog's attention plugins\n"
        "local n = 0\n"
        "for _, p in ipairs(tessera.catalog()) do\n"
        "  if p.slot == 'attention' and p.devices[1] == 'cpu' then n = n + 1 end\n"
        "end\n"
        "local slots = {gemv = {plugin = 'gemv_a', params = {threads = n}}}\n"
        "if tessera.model and tessera.model.moe then slots.expert_cache = 'ec_moe' end\n"
        "local sandboxed = io == nil and os == nil and load == nil and require == nil and dofile == nil\n"
        "  and string.dump == nil and package == nil and debug == nil\n"
        "return {name = 'lua-' .. tessera.device() .. '-' .. (tessera.model and tessera.model.dtype or 'none'),\n"
        "        description = tostring(sandboxed), device = tessera.device(), slots = slots}\n";
    tsr_assembly_env env = {.catalog = c, .model = &moe, .device = TSR_DEVICE_CPU};
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_assembly *a = NULL;
    int rc = lua_doc(script, &env, &a, &d);
    if (rc) dump(&d);
    assert_int_equal(rc, TSR_OK);
    assert_string_equal(a->name, "lua-cpu-bf16");
    assert_string_equal(a->description, "true");
    assert_string_equal(a->slots[TSR_SLOT_EXPERT_CACHE].plugin, "ec_moe");
    int64_t threads = -1;
    assert_true(tsr_ynode_as_int(tsr_ynode_get(a->slots[TSR_SLOT_GEMV].params, "threads"), &threads));
    assert_int_equal(threads, 3); /* att_any, att_f16, att_blk (att_cuda is cuda) */
    /* it goes through the same checker */
    tsr_check_opts o = {.model = &moe, .skip_files = 1};
    tsr_plan *p = NULL;
    assert_int_equal(tsr_check(c, a, &o, &p, &d), TSR_OK);
    tsr_plan_free(p);
    tsr_assembly_free(a);
    /* a dense model: no expert cache named, so the slot takes its baseline */
    env.model = NULL;
    assert_int_equal(lua_doc(script, &env, &a, &d), TSR_OK);
    assert_false(a->slots[TSR_SLOT_EXPERT_CACHE].given);
    assert_string_equal(a->name, "lua-cpu-none");
    tsr_assembly_free(a);
    /* an empty table (params = {}): an empty map (its key list never made: no sort of NULL) */
    assert_int_equal(
        lua_doc("return {name = 'e', device = 'cpu', slots = {gemv = {plugin = 'gemv_a', params = {}}}}\n", &env, &a, &d),
        TSR_OK);
    assert_string_equal(a->slots[TSR_SLOT_GEMV].plugin, "gemv_a");
    tsr_assembly_free(a);
    tsr_diag_free(&d);
    tsr_catalog_free(c);
}

typedef struct lcase {
    const char *script;
    int code, line;
    const char *word;
} lcase;

static void test_lua_bad(void **state) {
    (void)state;
    static const lcase cases[] = {
        {"local x = 1\nerror('boom')\nreturn {}\n", TSR_ERR_INVALID, 2, "boom"},
        {"local t = nil\nreturn t.x\n", TSR_ERR_INVALID, 2, "attempt to index"},
        {"return {name = 'x',\n", TSR_ERR_FORMAT, 2, "syntax error"},
        {"while true do end\n", TSR_ERR_RANGE, 1, "instruction budget"},
        {"local function f(n) return f(n + 1) + 1 end\nreturn f(1)\n", TSR_ERR_RANGE, 0, "memory cap"},
        {"local t = {}\nfor i = 1, 1e9 do t[i] = string.rep('x', 1000) .. i end\n", TSR_ERR_RANGE, 0, "memory cap"},
        {"return 42\n", TSR_ERR_FORMAT, 0, "must return one table"},
        {"return {}, {}\n", TSR_ERR_FORMAT, 0, "must return one table"},
        {"return {name = 'x', device = 'cpu', slots = {gemv = true}}\n", TSR_ERR_FORMAT, 0, "must name a plugin"},
        {"return {name = 'x', device = 'cpu', slots = {gemv = function() end}}\n", TSR_ERR_FORMAT, 0, "function"},
        {"return {name = 'x', [1] = 'y'}\n", TSR_ERR_FORMAT, 0, "only string keys"},
        {"return {name = 'x', device = 'cpu', slots = {gemv = {[1] = 'a', [3] = 'b'}}}\n", TSR_ERR_FORMAT, 0, "holes"},
        {"return {name = 'x', device = 0/0}\n", TSR_ERR_FORMAT, 0, "finite"},
        {"local t = {}\nt.t = t\nreturn {name = 'x', device = 'cpu', loop = t}\n", TSR_ERR_FORMAT, 0, "deeper"},
        {"return io.open('/etc/passwd')\n", TSR_ERR_INVALID, 1, "io"},
        {"return tessera.call('gemv_a', 'nope')\n", TSR_ERR_INVALID, 1, "exports no 'nope'"},
        {"\x1bLua", TSR_ERR_FORMAT, 0, "syntax error"}, /* binary chunks refused */
    };
    tsr_catalog *c = mem_catalog();
    tsr_assembly_env env = {.catalog = c, .device = TSR_DEVICE_CPU, .lua_instructions = 2000000,
                            .lua_memory = 4u << 20};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tsr_diag d;
        tsr_diag_init(&d);
        tsr_assembly *a = NULL;
        clock_t t0 = clock();
        int rc = lua_doc(cases[i].script, &env, &a, &d);
        double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
        int ok = rc != TSR_OK && !a && has_error(&d, cases[i].code, cases[i].line, 0, cases[i].word);
        if (!ok) {
            fprintf(stderr, "lua case %zu: rc %d\n", i, rc);
            dump(&d);
        }
        assert_true(ok);
        assert_string_equal(d.errors[0].file, "a.lua");
        assert_true(secs < 5.0);
        tsr_diag_free(&d);
    }
    /* the wrong shape of a well-formed table is the shared validator's error */
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_assembly *a = NULL;
    assert_int_not_equal(lua_doc("return {name = 'x', device = 'cpu', slots = {gemv = 3}}\n", &env, &a, &d), TSR_OK);
    assert_true(has_error(&d, TSR_ERR_FORMAT, 0, 0, "must name a plugin"));
    tsr_diag_free(&d);
    tsr_catalog_free(c);
}

/* --- fault injection: every allocation of a manifest parse may fail ------------ */

static void test_manifest_alloc_failures(void **state) {
    (void)state;
    const char *doc = mem_manifests[0];
    uint64_t live = tsr_halloc_live();
    int n_ok = 0;
    for (uint64_t n = 1; n < 500; n++) {
        tsr_halloc_fail_at(n);
        tsr_diag d;
        tsr_diag_init(&d);
        tsr_manifest *m = NULL;
        int rc = tsr_manifest_parse(doc, strlen(doc), "m.yaml", &m, &d);
        tsr_halloc_fail_at(0);
        if (rc == TSR_OK) {
            assert_non_null(m);
            tsr_manifest_free(m);
            n_ok++;
        } else {
            assert_null(m);
        }
        tsr_diag_free(&d);
        assert_true(tsr_halloc_live() == live);
        if (n_ok && n > 5 && rc == TSR_OK && n > 200) break;
    }
    assert_true(n_ok > 0);
}

/* the same for a Lua assembly checked against the in-memory catalog */
static void test_lua_alloc_failures(void **state) {
    (void)state;
    tsr_catalog *c = mem_catalog();
    tsr_assembly_env env = {.catalog = c, .device = TSR_DEVICE_CPU};
    const char *script = "return {name = 'x', device = 'cpu', slots = {gemv = {plugin = 'gemv_a',"
                         " params = {threads = 2}}, kv_cache = 'kv_a'}}\n";
    uint64_t live = tsr_halloc_live();
    int failures = 0;
    uint64_t n;
    for (n = 1; n < 1000; n++) {
        tsr_diag d;
        tsr_diag_init(&d);
        tsr_assembly *a = NULL;
        tsr_plan *p = NULL;
        tsr_halloc_fail_at(n);
        int rc = lua_doc(script, &env, &a, &d);
        if (rc == TSR_OK) {
            tsr_check_opts o = {.skip_files = 1};
            rc = tsr_check(c, a, &o, &p, &d);
        }
        tsr_halloc_fail_at(0);
        tsr_plan_free(p);
        tsr_assembly_free(a);
        tsr_diag_free(&d);
        assert_true(tsr_halloc_live() == live);
        if (rc == TSR_OK) break;
        failures++;
    }
    assert_true(failures > 10 && n < 1000);
    tsr_catalog_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256),
        cmocka_unit_test(test_manifest_good),
        cmocka_unit_test(test_manifest_bad),
        cmocka_unit_test(test_manifest_collects_every_error),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_scalar_types),
        cmocka_unit_test(test_assembly_yaml),
        cmocka_unit_test(test_assembly_bad),
        cmocka_unit_test(test_checker_resolution),
        cmocka_unit_test(test_checker_baselines),
        cmocka_unit_test(test_checker_graphs),
        cmocka_unit_test(test_checker_pdl),
        cmocka_unit_test(test_checker_pipeline),
        cmocka_unit_test(test_lua_ok),
        cmocka_unit_test(test_lua_bad),
        cmocka_unit_test(test_manifest_alloc_failures),
        cmocka_unit_test(test_lua_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
