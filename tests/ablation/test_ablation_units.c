/* Unit tests of the ablation library: Shapley values against hand-computed
 * games, the SSE parser under every split, workload validation, Prometheus
 * lines, statistics, attribution and the report writers. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ablation/ablate.h"
#include "ablation/report.h"
#include "ablation/shapley.h"
#include "ablation/sse.h"

/* cmocka's assert_float_equal compares floats: doubles need their own. */
#define assert_near(a, b, tol)                                                                   \
    do {                                                                                          \
        double a_ = (a), b_ = (b);                                                                \
        if (!(fabs(a_ - b_) <= (tol))) fail_msg("%s = %.17g, want %.17g", #a, a_, b_);           \
    } while (0)

/* ---- Shapley ---- */

static void test_shapley_two(void **st) {
    (void)st;
    /* v({}) = 0, v({0}) = 1, v({1}) = 2, v({0,1}) = 5:
     * phi0 = (1 - 0)/2 + (5 - 2)/2 = 2, phi1 = (2 - 0)/2 + (5 - 1)/2 = 3 */
    double v[4] = {0, 1, 2, 5}, phi[2];
    tsr_error e;
    assert_int_equal(tsr_shapley(2, v, NULL, phi, &e), TSR_OK);
    assert_near(phi[0], 2.0, 1e-12);
    assert_near(phi[1], 3.0, 1e-12);
}

static void test_shapley_three(void **st) {
    (void)st;
    /* additive weights 1, 2, 3 plus 6 when players 0 and 1 are both in:
     * the interaction splits evenly: phi = (1 + 3, 2 + 3, 3). Baseline 10. */
    double v[8], phi[3];
    for (unsigned m = 0; m < 8; m++)
        v[m] = 10 + (m & 1 ? 1 : 0) + (m & 2 ? 2 : 0) + (m & 4 ? 3 : 0) + ((m & 3) == 3 ? 6 : 0);
    tsr_error e;
    assert_int_equal(tsr_shapley(3, v, NULL, phi, &e), TSR_OK);
    assert_near(phi[0], 4.0, 1e-12);
    assert_near(phi[1], 5.0, 1e-12);
    assert_near(phi[2], 3.0, 1e-12);
    assert_near(phi[0] + phi[1] + phi[2], v[7] - v[0], 1e-12);
}

static void test_shapley_glove(void **st) {
    (void)st;
    /* the glove game: player 0 holds a left glove, 1 and 2 right gloves; a
     * coalition is worth 1 if it can make a pair. Known result: (2/3, 1/6, 1/6). */
    double v[8] = {0}, phi[3];
    v[3] = v[5] = v[7] = 1;
    tsr_error e;
    assert_int_equal(tsr_shapley(3, v, NULL, phi, &e), TSR_OK);
    assert_near(phi[0], 2.0 / 3, 1e-12);
    assert_near(phi[1], 1.0 / 6, 1e-12);
    assert_near(phi[2], 1.0 / 6, 1e-12);
}

static void test_shapley_five_efficiency(void **st) {
    (void)st;
    double v[32], phi[5];
    unsigned s = 12345;
    for (int m = 0; m < 32; m++) {
        s = s * 1103515245u + 12345u;
        v[m] = (double)(s >> 16) / 65536.0;
    }
    tsr_error e;
    assert_int_equal(tsr_shapley(5, v, NULL, phi, &e), TSR_OK);
    double sum = 0;
    for (int i = 0; i < 5; i++) sum += phi[i];
    assert_near(sum, v[31] - v[0], 1e-12);
    /* a dummy player (adds nothing anywhere) gets 0 */
    for (int m = 0; m < 32; m++)
        if (m & 16) v[m] = v[m & ~16];
    assert_int_equal(tsr_shapley(5, v, NULL, phi, &e), TSR_OK);
    assert_near(phi[4], 0.0, 1e-12);
}

static void test_shapley_missing(void **st) {
    (void)st;
    double v[4] = {0, 1, 2, 5}, phi[2];
    unsigned char known[4] = {1, 1, 0, 1};
    tsr_error e;
    tsr_error_clear(&e);
    assert_int_equal(tsr_shapley(2, v, known, phi, &e), TSR_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "0x2"));
    assert_int_equal(tsr_shapley(17, v, NULL, phi, &e), TSR_ERR_INVALID);
    v[1] = NAN;
    assert_int_equal(tsr_shapley(2, v, NULL, phi, &e), TSR_ERR_INVALID);
}

/* ---- SSE ---- */

typedef struct events {
    char buf[4096];
    int n;
} events;

static int collect(void *ud, const char *type, const char *data, size_t len) {
    events *e = ud;
    assert_int_equal(strlen(data), len);
    size_t k = strlen(e->buf);
    snprintf(e->buf + k, sizeof e->buf - k, "[%s|%s]", type, data);
    e->n++;
    return 0;
}

static void test_sse_splits(void **st) {
    (void)st;
    const char *stream = ": comment\r\n"
                         "data: {\"a\":1}\r\n\r\n"
                         "data:x\n"
                         "data:  y\n\n"
                         "event: ping\rdata: p\r\r"
                         "id: 7\nretry: 10\n\n" /* no data: no event */
                         "data\n\n"             /* a field with no colon: empty data */
                         "data: [DONE]\n\n";
    const char *want = "[message|{\"a\":1}][message|x\n y][ping|p][message|][message|[DONE]]";
    size_t n = strlen(stream);
    /* every split of the stream into two pieces, and byte by byte */
    for (size_t cut = 0; cut <= n; cut++) {
        events ev = {{0}, 0};
        tsr_sse p;
        tsr_error err;
        tsr_sse_init(&p, collect, &ev);
        assert_int_equal(tsr_sse_feed(&p, stream, cut, &err), TSR_OK);
        assert_int_equal(tsr_sse_feed(&p, stream + cut, n - cut, &err), TSR_OK);
        assert_string_equal(ev.buf, want);
        assert_int_equal(tsr_sse_pending(&p), 0);
        tsr_sse_free(&p);
    }
    events ev = {{0}, 0};
    tsr_sse p;
    tsr_error err;
    tsr_sse_init(&p, collect, &ev);
    for (size_t i = 0; i < n; i++) assert_int_equal(tsr_sse_feed(&p, stream + i, 1, &err), TSR_OK);
    assert_string_equal(ev.buf, want);
    tsr_sse_free(&p);
}

static void test_sse_pending_and_limits(void **st) {
    (void)st;
    events ev = {{0}, 0};
    tsr_sse p;
    tsr_error err;
    tsr_sse_init(&p, collect, &ev);
    assert_int_equal(tsr_sse_feed(&p, "data: cut", 9, &err), TSR_OK);
    assert_int_equal(ev.n, 0);
    assert_int_equal(tsr_sse_pending(&p), 1);
    assert_int_equal(tsr_sse_feed(&p, "\n", 1, &err), TSR_OK);
    assert_int_equal(tsr_sse_pending(&p), 1); /* data not yet dispatched */
    assert_int_equal(tsr_sse_feed(&p, "\n", 1, &err), TSR_OK);
    assert_int_equal(ev.n, 1);
    assert_int_equal(tsr_sse_pending(&p), 0);
    tsr_sse_free(&p);
    /* an event over the limit is an error, not a crash */
    tsr_sse_init(&p, collect, &ev);
    size_t big = TSR_SSE_MAX_EVENT / 2 + 10;
    char *line = malloc(big + 8);
    assert_non_null(line);
    memcpy(line, "data: ", 6);
    memset(line + 6, 'x', big);
    line[6 + big] = '\n';
    assert_int_equal(tsr_sse_feed(&p, line, big + 7, &err), TSR_OK);
    assert_int_equal(tsr_sse_feed(&p, line, big + 7, &err), TSR_ERR_RANGE);
    free(line);
    tsr_sse_free(&p);
}

static int stop_first(void *ud, const char *type, const char *data, size_t len) {
    (void)type, (void)data, (void)len;
    (*(int *)ud)++;
    return 1;
}

static void test_sse_stop(void **st) {
    (void)st;
    int n = 0;
    tsr_sse p;
    tsr_error err;
    tsr_sse_init(&p, stop_first, &n);
    assert_int_equal(tsr_sse_feed(&p, "data: a\n\ndata: b\n\n", 18, &err), TSR_ERR_CANCELLED);
    assert_int_equal(n, 1);
    tsr_sse_free(&p);
}

/* ---- workloads ---- */

static void expect_bad(const char *json, const char *needle) {
    tsr_workload *w = (tsr_workload *)1;
    tsr_error e;
    tsr_error_clear(&e);
    int rc = tsr_workload_parse(json, strlen(json), "w.json", &w, &e);
    if (rc == TSR_OK || !strstr(e.msg, needle)) fail_msg("'%s': got %d '%s', want '%s'", json, rc, e.msg, needle);
    assert_null(w);
    assert_string_equal(e.file, "w.json");
}

static void test_workload_errors(void **st) {
    (void)st;
    expect_bad("{", "");
    expect_bad("[]", "JSON object");
    expect_bad("{\"schema\": \"x\"}", "schema");
    expect_bad("{\"schema\": \"tessera.workload/1\", \"name\": \"a\", \"version\": 1, \"cases\": []}", "cases");
    expect_bad("{\"schema\": \"tessera.workload/1\", \"name\": \"a\", \"version\": 1, \"bogus\": 1}", "bogus");
    expect_bad("{\"schema\": \"tessera.workload/1\", \"name\": \"a\", \"cases\": []}", "version");
    const char *head = "{\"schema\": \"tessera.workload/1\", \"name\": \"a\", \"version\": 1, \"cases\": [";
    char buf[1024];
    snprintf(buf, sizeof buf, "%s{\"name\": \"c\", \"kind\": \"chat\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}]}", head);
    expect_bad(buf, "cases[0].max_tokens");
    snprintf(buf, sizeof buf, "%s{\"name\": \"c\", \"kind\": \"poem\", \"max_tokens\": 3, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}]}", head);
    expect_bad(buf, "cases[0].kind");
    snprintf(buf, sizeof buf, "%s{\"name\": \"c\", \"kind\": \"chat\", \"max_tokens\": 0, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}]}", head);
    expect_bad(buf, "cases[0].max_tokens");
    snprintf(buf, sizeof buf, "%s{\"name\": \"c\", \"kind\": \"chat\", \"max_tokens\": 3, \"messages\": [{\"role\": \"user\"}]}]}", head);
    expect_bad(buf, "cases[0].messages[0]");
    snprintf(buf, sizeof buf, "%s{\"name\": \"c\", \"kind\": \"chat\", \"max_tokens\": 3, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}, {\"name\": \"c\", \"kind\": \"chat\", \"max_tokens\": 3, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}]}", head);
    expect_bad(buf, "used twice");
    /* malformed JSON gives line and column */
    tsr_workload *w;
    tsr_error e;
    tsr_error_clear(&e);
    assert_int_equal(tsr_workload_parse("{\n  \"a\": ,\n}", 12, "w.json", &w, &e), TSR_ERR_FORMAT);
    assert_int_equal(e.line, 2);
    assert_true(e.col > 0);
}

static void test_workload_files(void **st) {
    (void)st;
    const char *src = getenv("TESSERA_SOURCE_DIR");
    const char *names[] = {"ablation/workloads/ci.json", "ablation/workloads/full.json",
                           "tests/ablation/data/tiny.json"};
    for (int i = 0; i < 3; i++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", src ? src : ".", names[i]);
        tsr_workload *w;
        tsr_error e;
        tsr_error_clear(&e);
        if (tsr_workload_load(p, &w, &e) != TSR_OK) fail_msg("%s: %s", p, e.msg);
        assert_true(w->n_cases >= 2);
        assert_true(strlen(w->score_text) > 0);
        if (i < 2) { /* every kind the issue names */
            const char *kinds[] = {"chat", "code", "math", "tool_call", "summary", "agent"};
            for (int k = 0; k < 6; k++) {
                int found = 0;
                for (int c = 0; c < w->n_cases; c++) found |= !strcmp(w->cases[c].kind, kinds[k]);
                if (!found) fail_msg("%s: no %s case", p, kinds[k]);
            }
        }
        tsr_workload_free(w);
    }
    tsr_workload *w;
    tsr_error e;
    assert_int_equal(tsr_workload_load("/nonexistent/w.json", &w, &e), TSR_ERR_IO);
}

/* ---- Prometheus, statistics, ceilings ---- */

static void test_prom_stats(void **st) {
    (void)st;
    const char *t = "# HELP x y\n# TYPE tessera_a counter\ntessera_a 12\ntessera_ab 3\n"
                    "tessera_l{result=\"hit\"} 4.5\ntessera_l{result=\"miss\"} 2\n";
    double v = 0;
    assert_int_equal(tsr_prom_value(t, "tessera_a", &v), 0);
    assert_near(v, 12, 0);
    assert_int_equal(tsr_prom_value(t, "tessera_ab", &v), 0);
    assert_near(v, 3, 0);
    assert_int_equal(tsr_prom_value(t, "tessera_l{result=\"hit\"}", &v), 0);
    assert_near(v, 4.5, 0);
    assert_int_equal(tsr_prom_value(t, "tessera_b", &v), -1);
    double x[] = {5, 1, 4, 2, 3};
    tsr_stat3 s = tsr_stat3_of(x, 5);
    assert_near(s.med, 3, 0);
    assert_near(s.min, 1, 0);
    assert_near(s.max, 5, 0);
    double y[] = {4, 1, 3, 2};
    s = tsr_stat3_of(y, 4);
    assert_near(s.med, 2.5, 0);
    /* 1 GB/s, 1e6 weight bytes, 1e3 KV bytes per token: at context 100 + 20/2,
     * decode <= 1e9 / (1e6 + 110 * 1e3) */
    tsr_engine_figures f = {.known = 1, .weight_bytes_per_token = 1e6, .kv_bytes_per_token = 1e3,
                            .flops_per_token = 2e6, .attn_flops_per_ctx_token = 1e3};
    tsr_probe_result d = {.read_gbs = 1, .gemm_gflops = 10};
    double dc, pc;
    tsr_bench_ceilings(&f, &d, 100, 20, &dc, &pc);
    assert_near(dc, 1e9 / (1e6 + 110e3), 1e-6);
    assert_near(pc, 10e9 / (2e6 + 1e3 * 50), 1e-6);
    /* a CUDA engine: the GPU's read rate and bf16 matmul, never the host's */
    f.device = TSR_DEVICE_CUDA;
    tsr_bench_ceilings(&f, &d, 100, 20, &dc, &pc);
    assert_near(dc, 0, 0); /* no GPU probed: unknown */
    assert_near(pc, 0, 0);
    d.have_gpu = 1, d.gpu_read_gbs = 4000, d.gpu_bf16_tflops = 700;
    tsr_bench_ceilings(&f, &d, 100, 20, &dc, &pc);
    assert_near(dc, 4000e9 / (1e6 + 110e3), 1e-3);
    assert_near(pc, 700e12 / (2e6 + 1e3 * 50), 1e-3);
    d.gpu_read_gbs = d.gpu_bf16_tflops = NAN; /* probed, not measured */
    tsr_bench_ceilings(&f, &d, 100, 20, &dc, &pc);
    assert_near(dc, 0, 0);
    assert_near(pc, 0, 0);
    f.device = TSR_DEVICE_CPU;
    tsr_bench_ceilings(&f, &d, 100, 20, &dc, &pc);
    assert_near(dc, 1e9 / (1e6 + 110e3), 1e-6);
    f.known = 0;
    tsr_bench_ceilings(&f, &d, 100, 20, &dc, &pc);
    assert_near(dc, 0, 0);
}

/* ---- attribution and reports on a hand-made result ---- */

static tsr_abl_result *fake_result(void) {
    tsr_abl_result *r = calloc(1, sizeof *r);
    snprintf(r->assembly_name, sizeof r->assembly_name, "fake<&>");
    snprintf(r->assembly_path, sizeof r->assembly_path, "fake.yaml");
    snprintf(r->commit, sizeof r->commit, "unknown");
    r->n_plugins = 2;
    snprintf(r->plugins[0].name, 64, "fast_gemv");
    snprintf(r->plugins[1].name, 64, "slow_drafter");
    r->plugins[0].exact = r->plugins[1].exact = 1;
    r->dev.read_gbs = 10;
    r->n_variants = 4;
    r->variants = calloc(4, sizeof *r->variants);
    /* end-to-end medians per case (2 cases): baseline 1.0 and 2.0 s; the
     * others scale both by a factor, so speedup = 1 / factor */
    const double factor[4] = {1.0, 0.5, 2.0, 0.8}; /* masks 0, 1, 2, 3 */
    const char *names[4] = {"baseline", "alone:fast_gemv", "alone:slow_drafter", "full"};
    for (int k = 0; k < 4; k++) {
        tsr_abl_variant *v = &r->variants[k];
        v->mask = (unsigned)k;
        v->rounds_done = 1; /* measured (status "ran") */
        snprintf(v->name, sizeof v->name, "%s", names[k]);
        v->bench.n_cases = 2;
        v->bench.cases = calloc(2, sizeof *v->bench.cases);
        for (int c = 0; c < 2; c++) {
            tsr_bench_case *bc = &v->bench.cases[c];
            snprintf(bc->name, sizeof bc->name, "case%d", c);
            snprintf(bc->kind, sizeof bc->kind, "chat");
            bc->e2e_s.med = bc->e2e_s.min = bc->e2e_s.max = (c + 1) * factor[k];
            bc->decode_tps.med = bc->decode_tps.min = bc->decode_tps.max = 100 / factor[k];
            bc->n_samples = 1;
            bc->samples = calloc(1, sizeof *bc->samples);
            bc->samples[0].e2e_s = bc->e2e_s.med;
            bc->draft_accept_per_pass = k & 2 ? 0.5 * (c + 1) : -1; /* the drafter on: 0.5, 1.0 */
            bc->expert_hit_rate = -1;
            bc->tokens = json_pack("[s,s]", "a", "b");
            bc->text = strdup("ab");
        }
        v->decode_tps = 100 / factor[k]; /* as summarised from the cases */
        v->quality_ok = 1;
        snprintf(v->verdict, sizeof v->verdict, "exact: greedy tokens identical");
    }
    return r;
}

static char *slurp(FILE *f) {
    fflush(f);
    long n = ftell(f);
    rewind(f);
    char *b = calloc(1, (size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    return b;
}

/* Rounds pooled: samples appended, medians over all of them, rates averaged
 * where known; mismatched workloads refused (and the second result freed). */
static tsr_bench_result one_case(const char *name, const double *e2e, int n, double acc) {
    tsr_bench_result r = {0};
    r.cases = calloc(1, sizeof *r.cases);
    assert_non_null(r.cases);
    r.n_cases = 1;
    snprintf(r.cases[0].name, sizeof r.cases[0].name, "%s", name);
    r.cases[0].samples = calloc((size_t)n, sizeof *r.cases[0].samples);
    assert_non_null(r.cases[0].samples);
    for (int i = 0; i < n; i++) r.cases[0].samples[i] = (tsr_bench_sample){.e2e_s = e2e[i], .decode_tps = 1 / e2e[i]};
    r.cases[0].n_samples = n;
    r.cases[0].draft_accept_per_pass = acc;
    r.cases[0].expert_hit_rate = -1;
    return r;
}

static void test_bench_merge(void **st) {
    (void)st;
    const double a[] = {3, 1, 2}, b[] = {10, 20, 30};
    tsr_bench_result r1 = one_case("chat", a, 3, 0.5), r2 = one_case("chat", b, 3, -1);
    tsr_error err;
    tsr_error_clear(&err);
    assert_int_equal(tsr_bench_merge(&r1, &r2, &err), TSR_OK);
    assert_int_equal(r1.cases[0].n_samples, 6);
    assert_near(r1.cases[0].e2e_s.med, 6.5, 1e-12); /* of 1 2 3 10 20 30 */
    assert_near(r1.cases[0].e2e_s.min, 1, 0);
    assert_near(r1.cases[0].e2e_s.max, 30, 0);
    assert_near(r1.cases[0].decode_tps.max, 1, 0);
    assert_near(r1.cases[0].draft_accept_per_pass, 0.5, 0); /* the unknown one does not count */
    tsr_bench_result r3 = one_case("code", a, 3, 1.5);
    assert_int_equal(tsr_bench_merge(&r1, &r3, &err), TSR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "'code'"));
    assert_int_equal(r1.cases[0].n_samples, 6);
    tsr_bench_result_free(&r1);
}

static void test_attribution_and_reports(void **st) {
    (void)st;
    tsr_abl_result *r = fake_result();
    tsr_abl_attribute(r);
    /* v = speedups: {} 1, {gemv} 2, {drafter} 0.5, {both} 1.25.
     * phi_gemv = ((2 - 1) + (1.25 - 0.5)) / 2 = 0.875
     * phi_drafter = ((0.5 - 1) + (1.25 - 2)) / 2 = -0.625 */
    assert_true(r->has_shapley);
    assert_near(r->plugins[0].shapley, 0.875, 1e-12);
    assert_near(r->plugins[1].shapley, -0.625, 1e-12);
    assert_near(r->shapley_sum, 0.25, 1e-12);
    assert_near(r->full_minus_baseline, 0.25, 1e-12);
    assert_near(r->plugins[0].off, 1.25 - 0.5, 1e-12);
    assert_near(r->plugins[0].alone, 1.0, 1e-12);
    assert_near(r->plugins[1].alone, -0.5, 1e-12);

    /* a refused variant: no Shapley values, the reason reported everywhere */
    r->variants[2].refused = 1;
    snprintf(r->variants[2].reason, sizeof r->variants[2].reason, "plugin x requires kv_dtype f16 | y");
    tsr_abl_attribute(r);
    assert_false(r->has_shapley);
    assert_non_null(strstr(r->shapley_note, "alone:slow_drafter was refused"));
    assert_true(isnan(r->plugins[1].shapley));
    assert_true(isnan(r->plugins[1].alone));

    FILE *f = tmpfile();
    assert_int_equal(tsr_abl_write_md(r, f), 0);
    char *md = slurp(f);
    fclose(f);
    assert_non_null(strstr(md, "| alone:slow_drafter | - | - | - | - | - | - | - | - | - | refused: "));
    assert_non_null(strstr(md, "refused: plugin x requires kv_dtype f16 \\| y"));
    assert_non_null(strstr(md, "| full | 125.0 |"));
    assert_non_null(strstr(md, "1.250x"));
    assert_non_null(strstr(md, "| 0.75 | - |")); /* mean drafts per pass of the full variant */
    free(md);

    f = tmpfile();
    assert_int_equal(tsr_abl_write_csv(r, f), 0);
    char *csv = slurp(f);
    fclose(f);
    int lines = 0;
    for (char *p = csv; *p; p++) lines += *p == '\n';
    assert_int_equal(lines, 1 + 2 + 2 + 1 + 2); /* header, 2 cases each, 1 row for the refused */
    assert_non_null(strstr(csv, "\"alone:slow_drafter\",refused,\"\""));
    assert_non_null(strstr(csv, "\"full\",ran,\"case1\",0,0,125,125,125"));
    free(csv);

    r->variants[2].refused = 0;
    tsr_abl_attribute(r);
    f = tmpfile();
    assert_int_equal(tsr_abl_write_svg(r, f), 0);
    char *svg = slurp(f);
    fclose(f);
    assert_non_null(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_non_null(strstr(svg, "fake&lt;&amp;&gt;"));
    assert_non_null(strstr(svg, "slow_drafter Shapley -0.6250"));
    assert_non_null(strstr(svg, "fast_gemv Shapley +0.8750"));
    assert_non_null(strstr(svg, "</svg>"));
    free(svg);

    json_t *j = tsr_abl_result_json(r);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "schema")), TSR_ABL_RESULT_SCHEMA);
    json_t *at = json_object_get(j, "attribution");
    assert_true(json_is_true(json_object_get(at, "exact_shapley")));
    assert_near(json_real_value(json_object_get(at, "shapley_sum")), 0.25, 1e-12);
    json_t *v0 = json_array_get(json_object_get(j, "variants"), 3);
    assert_string_equal(json_string_value(json_object_get(v0, "name")), "full");
    json_t *c1 = json_array_get(json_object_get(v0, "cases"), 1);
    assert_int_equal(json_array_size(json_object_get(c1, "samples")), 1);
    assert_true(json_is_null(json_object_get(c1, "decode_ceiling_tps")));
    json_decref(j);
    tsr_abl_result_free(r);
}

/* The paired reader (`tessera passes --floor`): bad sizes and thread counts
 * refused by name; passes read at a finite, positive rate, window after
 * window through the buffer and round again, with one of the probe's
 * loops. */
static void test_probe_reader(void **state) {
    (void)state;
    tsr_probe_reader *rd = NULL;
    tsr_error err;
    tsr_error_clear(&err);
    assert_int_equal(tsr_probe_reader_new(0, 1 << 20, 0, &rd, &err), TSR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "0 threads"));
    assert_null(rd);
    assert_int_equal(tsr_probe_reader_new(1, 100, 0, &rd, &err), TSR_ERR_INVALID);
    assert_non_null(strstr(err.msg, "window"));
    assert_int_equal(tsr_probe_reader_new(2, 64 << 10, 256 << 10, &rd, &err), TSR_OK);
    assert_non_null(rd);
    assert_true(strlen(tsr_probe_reader_loop(rd)) > 0);
    for (int i = 0; i < 9; i++) { /* more passes than the four windows */
        const double g = tsr_probe_reader_pass(rd);
        assert_true(isfinite(g) && g > 0);
    }
    tsr_probe_reader_free(rd);
}

/* A device record written and read back keeps what says how its ceilings
 * were measured: the read loop taken and the FMA loop's ISA (records
 * without them read back as "" and AVX2). */
static void test_probe_record_roundtrip(void **state) {
    (void)state;
    tsr_probe_result r = {.read_gbs = 36.5, .read_gbs_sustained = 36.0, .gemm_gflops = 300, .fma_gflops = 470,
                          .fma_avx512 = 1, .n_threads = 2, .n_cores = 2, .repeats = 5, .gemm_n = 1024};
    snprintf(r.read_loop, sizeof r.read_loop, "%s", "32-byte loads, two chains of float adds");
    snprintf(r.cpu_model, sizeof r.cpu_model, "%s", "test cpu");
    r.gpu_read_gbs = r.gpu_read_gbs_min = r.gpu_read_gbs_max = r.gpu_bf16_tflops = r.gpu_fp8_tflops = NAN;
    r.fma_gflops_min = r.fma_gflops_max = NAN;
    for (int avx512 = 0; avx512 < 2; avx512++) {
        r.fma_avx512 = avx512;
        json_t *j = tsr_probe_to_json(&r);
        assert_non_null(j);
        tsr_probe_result b;
        tsr_error err;
        tsr_error_clear(&err);
        assert_int_equal(tsr_probe_from_json(j, &b, &err), TSR_OK);
        assert_near(b.read_gbs, 36.5, 1e-9);
        assert_near(b.fma_gflops, 470, 1e-9);
        assert_string_equal(b.read_loop, r.read_loop);
        assert_int_equal(b.fma_avx512, avx512);
        json_object_del(json_object_get(j, "fma"), "isa");
        json_object_del(json_object_get(j, "memory_read"), "loop");
        assert_int_equal(tsr_probe_from_json(j, &b, &err), TSR_OK);
        assert_string_equal(b.read_loop, "");
        assert_int_equal(b.fma_avx512, 0);
        assert_int_equal(b.have_gpu, 0); /* no GPU probed */
        assert_true(isnan(b.gpu_read_gbs));
        json_decref(j);
    }
    /* a probed GPU: its figures come back (a CUDA engine's ceilings) */
    r.have_gpu = 1;
    snprintf(r.gpu_name, sizeof r.gpu_name, "%s", "test gpu");
    r.gpu_read_gbs = 4290, r.gpu_read_gbs_min = 4200, r.gpu_read_gbs_max = 4300, r.gpu_bf16_tflops = 700;
    json_t *j = tsr_probe_to_json(&r);
    tsr_probe_result b;
    tsr_error err;
    tsr_error_clear(&err);
    assert_int_equal(tsr_probe_from_json(j, &b, &err), TSR_OK);
    assert_int_equal(b.have_gpu, 1);
    assert_string_equal(b.gpu_name, "test gpu");
    assert_near(b.gpu_read_gbs, 4290, 1e-9);
    assert_near(b.gpu_read_gbs_min, 4200, 1e-9);
    assert_near(b.gpu_bf16_tflops, 700, 1e-9);
    assert_true(isnan(b.gpu_fp8_tflops));
    json_decref(j);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapley_two),
        cmocka_unit_test(test_shapley_three),
        cmocka_unit_test(test_shapley_glove),
        cmocka_unit_test(test_shapley_five_efficiency),
        cmocka_unit_test(test_shapley_missing),
        cmocka_unit_test(test_sse_splits),
        cmocka_unit_test(test_sse_pending_and_limits),
        cmocka_unit_test(test_sse_stop),
        cmocka_unit_test(test_workload_errors),
        cmocka_unit_test(test_workload_files),
        cmocka_unit_test(test_prom_stats),
        cmocka_unit_test(test_bench_merge),
        cmocka_unit_test(test_attribution_and_reports),
        cmocka_unit_test(test_probe_record_roundtrip),
        cmocka_unit_test(test_probe_reader),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
