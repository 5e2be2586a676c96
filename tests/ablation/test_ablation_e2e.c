/* tessera probe and tessera ablate end to end with the embedded model: all
 * outputs written, Shapley values against an independent computation (the
 * mean marginal contribution over every order of the plugins), a sleeping
 * plugin's negative share, a perturbing "exact" plugin flagged, a refused
 * variant reported with the checker's reason, bad input refused. Needs
 * TESSERA_BIN, TESSERA_CATALOG and TESSERA_BUILD_DIR (ctest sets them); skips
 * plainly without them. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

static char g_tmp[256], g_bin[1024], g_cat[1024], g_mixed[512], g_src[1024], g_dev[512];
static int g_ready;

/* Run argv (NULL-terminated) with stdout and stderr into g_tmp/out.txt;
 * returns the exit status. */
static int run(const char *const *argv) {
    char out[512];
    snprintf(out, sizeof out, "%s/out.txt", g_tmp);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(out, "w", stdout);
        (void)f;
        dup2(1, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *b = calloc(1, (size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
    fclose(f);
    return b;
}

static void print_output(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/out.txt", g_tmp);
    char *t = read_text(p);
    fprintf(stderr, "---- output ----\n%s\n----\n", t ? t : "(none)");
    free(t);
}

static int link_all(const char *from, const char *to, const char *prefix) {
    DIR *d = opendir(from);
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (prefix && strncmp(e->d_name, prefix, strlen(prefix)) && strncmp(e->d_name + 3, prefix, strlen(prefix)))
            continue;
        char a[1200], b[1200];
        snprintf(a, sizeof a, "%s/%s", from, e->d_name);
        snprintf(b, sizeof b, "%s/%s", to, e->d_name);
        if (symlink(a, b) && errno != EEXIST) {
            closedir(d);
            return -1;
        }
    }
    closedir(d);
    return 0;
}

static int setup(void **st) {
    (void)st;
    const char *bin = getenv("TESSERA_BIN"), *cat = getenv("TESSERA_CATALOG"), *bd = getenv("TESSERA_BUILD_DIR"),
               *src = getenv("TESSERA_SOURCE_DIR");
    if (!bin || !cat || !bd || access(bin, X_OK)) {
        fprintf(stderr, "skipping: TESSERA_BIN, TESSERA_CATALOG and TESSERA_BUILD_DIR are needed (run under ctest)\n");
        return 0;
    }
    snprintf(g_bin, sizeof g_bin, "%s", bin);
    snprintf(g_cat, sizeof g_cat, "%s", cat);
    snprintf(g_src, sizeof g_src, "%s", src ? src : ".");
    snprintf(g_tmp, sizeof g_tmp, "/tmp/tessera-abl-XXXXXX");
    if (!mkdtemp(g_tmp)) return -1;
    /* the engine's catalog plus the ablation test plugins, in one folder */
    snprintf(g_mixed, sizeof g_mixed, "%s/catalog", g_tmp);
    char tc[1200];
    snprintf(tc, sizeof tc, "%s/tests/catalog", bd);
    if (mkdir(g_mixed, 0755) || link_all(cat, g_mixed, NULL) || link_all(tc, g_mixed, "abl_")) {
        fprintf(stderr, "cannot build the mixed catalog in %s\n", g_mixed);
        return -1;
    }
    /* one probe for every ablate run (and the probe test) */
    snprintf(g_dev, sizeof g_dev, "%s/device.json", g_tmp);
    const char *argv[] = {g_bin, "probe", "--buffer-mib", "16", "--repeats", "3", "--gemm-n", "128",
                          "--threads", "1", "--out", g_dev, NULL};
    if (run(argv) != 0) {
        print_output();
        return -1;
    }
    g_ready = 1;
    return 0;
}

static int teardown(void **st) {
    (void)st;
    if (g_tmp[0]) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
        if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_tmp);
    }
    return 0;
}

#define NEED_READY()                                                                              \
    do {                                                                                          \
        if (!g_ready) skip();                                                                     \
    } while (0)

/* workload: a path under the source tree */
static json_t *ablate_args(const char *assembly_rel, const char *workload, const char *catalog,
                           const char *out_name, int want_rc, const char *rounds, const char *extra) {
    char asmb[1200], wl[1200], out[600];
    snprintf(asmb, sizeof asmb, "%s/tests/ablation/data/%s", g_src, assembly_rel);
    snprintf(wl, sizeof wl, "%s/%s", g_src, workload);
    snprintf(out, sizeof out, "%s/%s", g_tmp, out_name);
    const char *argv[] = {g_bin, "ablate", asmb, "--workload", wl, "--out", out, "--device", g_dev,
                          "--catalog", catalog, "--threads", "1", "--rounds", rounds, "--quiet", extra, NULL};
    int rc = run(argv);
    if (rc != want_rc) {
        print_output();
        fail_msg("tessera ablate %s: exit %d, want %d", assembly_rel, rc, want_rc);
    }
    const char *files[] = {"result.json", "result.csv", "report.md", "speedup.svg"};
    for (int i = 0; i < 4; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s/%s", out, files[i]);
        struct stat s;
        if (stat(p, &s) || s.st_size < 50) fail_msg("%s missing or nearly empty", p);
    }
    char p[700];
    snprintf(p, sizeof p, "%s/result.json", out);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!j) fail_msg("%s: %s", p, je.text);
    assert_string_equal(json_string_value(json_object_get(j, "schema")), "tessera.ablation/1");
    assert_true(json_is_string(json_object_get(j, "git_commit")));
    assert_true(json_is_object(json_object_get(j, "device")));
    char *text = read_text(asmb);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "assembly"), "text")), text);
    free(text);
    return j;
}

static json_t *ablate_rounds(const char *assembly_rel, const char *workload, const char *catalog,
                             const char *out_name, int want_rc, const char *rounds) {
    return ablate_args(assembly_rel, workload, catalog, out_name, want_rc, rounds, NULL);
}

static json_t *ablate(const char *assembly_rel, const char *workload, const char *catalog, const char *out_name,
                      int want_rc) {
    return ablate_rounds(assembly_rel, workload, catalog, out_name, want_rc, "1");
}

static json_t *variant(json_t *j, const char *name) {
    json_t *vs = json_object_get(j, "variants");
    for (size_t i = 0; i < json_array_size(vs); i++) {
        json_t *v = json_array_get(vs, i);
        if (!strcmp(json_string_value(json_object_get(v, "name")), name)) return v;
    }
    fail_msg("no variant %s", name);
    return NULL;
}

static json_t *plugin(json_t *j, const char *name) {
    json_t *ps = json_object_get(j, "plugins");
    for (size_t i = 0; i < json_array_size(ps); i++) {
        json_t *p = json_array_get(ps, i);
        if (!strcmp(json_string_value(json_object_get(p, "name")), name)) return p;
    }
    fail_msg("no plugin %s", name);
    return NULL;
}

/* cmocka's assert_float_equal compares floats: doubles need their own. */
#define assert_near(a, b, tol)                                                                   \
    do {                                                                                          \
        double a_ = (a), b_ = (b);                                                                \
        if (!(fabs(a_ - b_) <= (tol))) fail_msg("%s = %.17g, want %.17g", #a, a_, b_);           \
    } while (0)

static double num(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    if (!json_is_number(v)) fail_msg("%s is not a number", k);
    return json_number_value(v);
}

/* The speedup of the variant whose plugins_on is exactly the set mask. */
static double speedup_of(json_t *j, unsigned mask, const char *const *names, int n) {
    json_t *vs = json_object_get(j, "variants");
    for (size_t i = 0; i < json_array_size(vs); i++) {
        json_t *v = json_array_get(vs, i), *on = json_object_get(v, "plugins_on");
        unsigned m = 0;
        for (size_t k = 0; k < json_array_size(on); k++)
            for (int p = 0; p < n; p++)
                if (!strcmp(json_string_value(json_array_get(on, k)), names[p])) m |= 1u << p;
        if (m == mask && json_array_size(on) == (size_t)__builtin_popcount(mask)) return num(v, "speedup");
    }
    fail_msg("no variant for mask %x", mask);
    return NAN;
}

static void test_probe(void **st) {
    (void)st;
    NEED_READY();
    json_error_t je;
    json_t *j = json_load_file(g_dev, 0, &je);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "schema")), "tessera.device/1");
    json_t *mr = json_object_get(j, "memory_read"), *g = json_object_get(j, "gemm"),
           *m = json_object_get(j, "machine"), *gpu = json_object_get(j, "gpu");
    double gbs = num(mr, "gbs");
    assert_true(gbs > 0.05 && gbs < 10000);
    assert_true(num(mr, "gbs_min") <= gbs && gbs <= num(mr, "gbs_max"));
    assert_int_equal((int)num(mr, "buffer_bytes"), 16 << 20);
    assert_true(json_is_true(json_object_get(g, "available")));
    assert_true(num(g, "gflops") > 0.01);
    json_t *f = json_object_get(j, "fma"); /* the multiply-add ceiling: measured, or null with the reason */
    assert_true(json_is_object(f));
    if (json_is_null(json_object_get(f, "gflops"))) {
        assert_non_null(strstr(json_string_value(json_object_get(f, "method")), "not measured"));
    } else {
        assert_true(num(f, "gflops") > 0.1);
        assert_true(num(f, "gflops_min") <= num(f, "gflops") && num(f, "gflops") <= num(f, "gflops_max"));
    }
    assert_true(num(m, "cores") >= 1);
    assert_true(num(m, "memory_bytes") > 1e8);
    if (json_is_null(json_object_get(gpu, "name"))) { /* no device (or no CUDA build): said why */
        assert_true(json_is_null(json_object_get(gpu, "read_gbs")));
        assert_non_null(strstr(json_string_value(json_object_get(gpu, "note")), "CUDA"));
    } else { /* a device: its bandwidth is measured */
        assert_true(num(gpu, "read_gbs") > 10 && num(gpu, "read_gbs") < 100000);
    }
    json_decref(j);
    const char *bad[] = {g_bin, "probe", "--repeats", "0", NULL};
    assert_int_equal(run(bad), 2);
}

static void test_ablate_exact3(void **st) {
    (void)st;
    NEED_READY();
    json_t *j = ablate("exact3.yaml", "ablation/workloads/ci.json", g_cat, "exact3", 0);
    json_t *vs = json_object_get(j, "variants");
    assert_int_equal(json_array_size(vs), 8); /* 3 plugins: every subset */
    for (size_t i = 0; i < 8; i++) {
        json_t *v = json_array_get(vs, i);
        if (strcmp(json_string_value(json_object_get(v, "status")), "ran"))
            fail_msg("%s: %s", json_string_value(json_object_get(v, "name")),
                     json_string_value(json_object_get(v, "reason")));
        /* exact plugins reproduce the baseline's greedy tokens */
        assert_true(json_is_true(json_object_get(json_object_get(v, "quality"), "ok")));
        json_t *c0 = json_array_get(json_object_get(v, "cases"), 0);
        assert_int_equal(json_array_size(json_object_get(c0, "samples")), 3);
        assert_true(json_array_size(json_object_get(c0, "tokens")) >= 1);
        assert_true(num(json_object_get(c0, "e2e_s"), "median") > 0);
    }
    json_t *at = json_object_get(j, "attribution");
    assert_true(json_is_true(json_object_get(at, "exact_shapley")));
    double full = num(variant(j, "full"), "speedup"), base = num(variant(j, "baseline"), "speedup");
    assert_near(base, 1.0, 1e-12);
    assert_near(num(at, "full_minus_baseline"), full - 1, 1e-8);
    assert_near(num(at, "shapley_sum"), full - 1, 1e-8);
    /* independent reference: the mean marginal contribution over all 3! orders */
    const char *names[3] = {"cpu_attention", "drafter_ngram", "cpu_gemv"};
    const int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int p = 0; p < 3; p++) {
        double s = 0;
        for (int o = 0; o < 6; o++) {
            unsigned before = 0;
            for (int k = 0; orders[o][k] != p; k++) before |= 1u << orders[o][k];
            s += speedup_of(j, before | 1u << p, names, 3) - speedup_of(j, before, names, 3);
        }
        assert_near(num(plugin(j, names[p]), "shapley"), s / 6, 1e-8);
        assert_near(num(plugin(j, names[p]), "alone"), speedup_of(j, 1u << p, names, 3) - 1, 1e-8);
        assert_near(num(plugin(j, names[p]), "off"), full - speedup_of(j, 7u & ~(1u << p), names, 3), 1e-8);
    }
    json_decref(j);
    char p[700];
    snprintf(p, sizeof p, "%s/exact3/result.csv", g_tmp);
    char *csv = read_text(p);
    int lines = 0;
    for (char *c = csv; *c; c++) lines += *c == '\n';
    assert_int_equal(lines, 1 + 8 * 6); /* ci.json: six cases */
    free(csv);
    snprintf(p, sizeof p, "%s/exact3/speedup.svg", g_tmp);
    char *svg = read_text(p);
    for (int i = 0; i < 3; i++) assert_non_null(strstr(svg, names[i]));
    free(svg);
    snprintf(p, sizeof p, "%s/exact3/report.md", g_tmp);
    char *md = read_text(p);
    assert_non_null(strstr(md, "| off:cpu_gemv |"));
    assert_non_null(strstr(md, "| alone:drafter_ngram |"));
    free(md);
}

static void test_ablate_perturbing_plugins(void **st) {
    (void)st;
    NEED_READY();
    /* exit 1: a variant fails its quality check */
    json_t *j = ablate("perturb.yaml", "tests/ablation/data/tiny.json", g_mixed, "perturb", 1);
    json_t *bias = plugin(j, "abl_bias_gemv"), *sleepy = plugin(j, "abl_sleep_drafter");
    assert_true(json_is_true(json_object_get(bias, "exactness_broken")));
    assert_false(json_is_true(json_object_get(sleepy, "exactness_broken")));
    json_t *q = json_object_get(variant(j, "alone:abl_bias_gemv"), "quality");
    assert_false(json_is_true(json_object_get(q, "ok")));
    json_t *fd = json_object_get(q, "first_difference");
    assert_string_equal(json_string_value(json_object_get(fd, "case")), "chat");
    assert_true(num(fd, "token") >= 0);
    assert_non_null(strstr(json_string_value(json_object_get(variant(j, "alone:abl_bias_gemv"), "verdict")),
                           "breaks exactness"));
    /* the sleeping drafter keeps the tokens and costs time: a negative share */
    assert_true(json_is_true(json_object_get(json_object_get(variant(j, "alone:abl_sleep_drafter"), "quality"), "ok")));
    assert_true(num(sleepy, "shapley") < 0);
    assert_true(num(sleepy, "alone") < 0);
    assert_true(num(sleepy, "off") < 0);
    json_t *at = json_object_get(j, "attribution");
    assert_near(num(at, "shapley_sum"), num(at, "full_minus_baseline"), 1e-8);
    json_decref(j);
    char p[700];
    snprintf(p, sizeof p, "%s/perturb/report.md", g_tmp);
    char *md = read_text(p);
    assert_non_null(strstr(md, "BROKEN"));
    free(md);
}

/* A variant whose greedy text changes from request to request (the bias
 * gemv from its 30th classifier call: inside the case's third request)
 * fails as not deterministic; the baseline runs. The tokens come from the
 * warm-up run (asked with logprobs), the timed runs compared by text. */
static void test_ablate_not_deterministic(void **st) {
    (void)st;
    NEED_READY();
    json_t *j = ablate("drifting.yaml", "tests/ablation/data/tiny.json", g_mixed, "drifting", 1);
    assert_string_equal(json_string_value(json_object_get(variant(j, "baseline"), "status")), "ran");
    json_t *bc = json_array_get(json_object_get(variant(j, "baseline"), "cases"), 0);
    assert_true(json_array_size(json_object_get(bc, "tokens")) >= 1); /* from the warm-up */
    json_t *v = variant(j, "full");
    assert_string_equal(json_string_value(json_object_get(v, "status")), "failed");
    const char *why = json_string_value(json_object_get(v, "reason"));
    assert_non_null(strstr(why, "repetition 2's text differs from the first run's"));
    assert_non_null(strstr(why, "not deterministic"));
    json_decref(j);
}

static void test_ablate_refused_variant(void **st) {
    (void)st;
    NEED_READY();
    /* two rounds: every variant that runs measured twice, its samples pooled */
    json_t *j = ablate_rounds("refused.yaml", "tests/ablation/data/tiny.json", g_mixed, "refused", 0, "2");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(json_object_get(j, "settings"), "workload"),
                                                        "rounds")), 2);
    json_t *fc = json_array_get(json_object_get(variant(j, "full"), "cases"), 0);
    assert_int_equal(json_array_size(json_object_get(fc, "samples")), 2 * 3); /* tiny.json: 3 repeats */
    json_t *v = variant(j, "alone:abl_compact_attention");
    assert_string_equal(json_string_value(json_object_get(v, "status")), "refused");
    const char *why = json_string_value(json_object_get(v, "reason"));
    assert_non_null(strstr(why, "abl_compact_attention requires kv_cache.kv_dtype"));
    const char *ran[] = {"baseline", "full", "alone:cpu_kv_cache"};
    for (int i = 0; i < 3; i++)
        assert_string_equal(json_string_value(json_object_get(variant(j, ran[i]), "status")), "ran");
    /* the lossy KV cache: KL and perplexity ratio against its declared bound */
    json_t *q = json_object_get(variant(j, "full"), "quality");
    assert_string_equal(json_string_value(json_object_get(q, "kind")), "lossy");
    double kl = num(q, "mean_kl"), ppl = num(q, "ppl_ratio");
    assert_true(kl >= 0 && kl < num(q, "max_mean_kl"));
    assert_true(ppl > 0.9 && ppl < 1.1);
    /* the bound is the one the catalog's manifest declares */
    char mp[1200];
    snprintf(mp, sizeof mp, "%s/cpu_kv_cache.yaml", g_cat);
    char *man = read_text(mp);
    assert_non_null(man);
    char *b = strstr(man, "max_mean_kl:");
    assert_non_null(b);
    assert_near(num(q, "max_mean_kl"), strtod(b + strlen("max_mean_kl:"), NULL), 1e-12);
    free(man);
    /* per-token figures come from the server's GET /v1/engine; f16 KV holds
     * half the bytes of the baseline's f32 */
    json_t *eb = json_object_get(variant(j, "baseline"), "engine"), *ef = json_object_get(variant(j, "full"), "engine");
    assert_string_equal(json_string_value(json_object_get(eb, "source")), "GET /v1/engine");
    assert_string_equal(json_string_value(json_object_get(eb, "device")), "cpu");
    assert_true(num(eb, "kv_bytes_per_token") > 0);
    assert_near(num(ef, "kv_bytes_per_token"), num(eb, "kv_bytes_per_token") / 2, 1e-9);
    assert_near(num(ef, "weight_bytes_per_token"), num(eb, "weight_bytes_per_token"), 1e-9);
    json_t *at = json_object_get(j, "attribution");
    assert_false(json_is_true(json_object_get(at, "exact_shapley")));
    assert_non_null(strstr(json_string_value(json_object_get(at, "note")), "alone:abl_compact_attention was refused"));
    json_decref(j);
    char p[700];
    snprintf(p, sizeof p, "%s/refused/report.md", g_tmp);
    char *md = read_text(p);
    assert_non_null(strstr(md, "refused: error: plugin abl_compact_attention requires kv_cache.kv_dtype"));
    free(md);
    /* --no-kl: the lossy variants not scored, and said so; exit 0 */
    j = ablate_args("refused.yaml", "tests/ablation/data/tiny.json", g_mixed, "refused-nokl", 0, "1", "--no-kl");
    q = json_object_get(variant(j, "full"), "quality");
    assert_string_equal(json_string_value(json_object_get(q, "kind")), "lossy, not scored");
    assert_true(json_is_true(json_object_get(q, "ok")));
    assert_null(json_object_get(q, "mean_kl"));
    assert_non_null(strstr(json_string_value(json_object_get(variant(j, "full"), "verdict")), "not scored (--no-kl)"));
    json_decref(j);
}

/* How many variants of result.json j have status st. */
static int count_status(json_t *j, const char *st) {
    json_t *vs = json_object_get(j, "variants");
    int n = 0;
    for (size_t i = 0; i < json_array_size(vs); i++)
        n += !strcmp(json_string_value(json_object_get(json_array_get(vs, i), "status")), st);
    return n;
}

/* Whether a process runs with `needle` in its command line (a server an
 * ablation started: its assembly's path). */
static int process_with(const char *needle) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char p[300], buf[4096];
        snprintf(p, sizeof p, "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(p, "rb");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        for (size_t i = 0; i < n; i++)
            if (!buf[i]) buf[i] = ' ';
        buf[n] = 0;
        found = strstr(buf, needle) != NULL;
    }
    if (d) closedir(d);
    return found;
}

/* `tessera ablate ASMB --workload WL --out OUT --resume` is refused, its
 * message naming --resume and containing want. */
static void resume_refused(const char *asmb, const char *wl, const char *out, const char *want) {
    const char *argv[] = {g_bin, "ablate", asmb, "--workload", wl, "--out", out, "--catalog", g_cat,
                          "--threads", "1", "--quiet", "--resume", NULL};
    assert_int_not_equal(run(argv), 0);
    char p[700];
    snprintf(p, sizeof p, "%s/out.txt", g_tmp);
    char *o = read_text(p);
    assert_non_null(o);
    if (!strstr(o, "--resume") || !strstr(o, want)) fail_msg("--resume refusal without \"%s\": %s", want, o);
    free(o);
}

/* An ablation killed (SIGKILL) once result.json shows a measured variant
 * leaves that file with its measured and pending variants and no server
 * running; --resume measures the pending ones alone and keeps the others'
 * samples as they were; a resume of another workload, or with nothing to
 * resume, is refused. */
static void test_ablate_resume(void **st) {
    (void)st;
    NEED_READY();
    char asmb[1200], wl[1200], out[600], rj[700], servers[700];
    snprintf(asmb, sizeof asmb, "%s/tests/ablation/data/exact3.yaml", g_src);
    snprintf(wl, sizeof wl, "%s/ablation/workloads/ci.json", g_src);
    snprintf(out, sizeof out, "%s/resume", g_tmp);
    snprintf(rj, sizeof rj, "%s/result.json", out);
    snprintf(servers, sizeof servers, "%s/assemblies/", out);
    const char *argv[] = {g_bin, "ablate", asmb, "--workload", wl, "--out", out, "--device", g_dev,
                          "--catalog", g_cat, "--threads", "1", "--quiet", NULL};
    pid_t pid = fork();
    if (pid == 0) {
        int nul = open("/dev/null", O_WRONLY);
        dup2(nul, 1), dup2(nul, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    /* killed while it serves a variant after the first it measured */
    json_t *j = NULL;
    for (int i = 0; i < 6000 && !j; i++) { /* up to 120 s */
        usleep(20000);
        json_t *t = json_load_file(rj, 0, NULL); /* renamed into place: whole or absent */
        if (t && count_status(t, "ran") > 0 && process_with(servers)) j = t;
        else json_decref(t);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_non_null(j);
    json_decref(j);
    j = json_load_file(rj, 0, NULL); /* what the killed run left */
    assert_non_null(j);
    const int ran = count_status(j, "ran");
    assert_true(ran >= 1);
    assert_int_equal(ran + count_status(j, "pending"), 8);
    assert_true(ran < 8);
    for (int i = 0; i < 750 && process_with(servers); i++) usleep(20000); /* SIGTERM: up to 15 s to stop */
    assert_false(process_with(servers));

    json_t *r = ablate_args("exact3.yaml", "ablation/workloads/ci.json", g_cat, "resume", 0, "1", "--resume");
    assert_int_equal((int)num(r, "resumed_variants"), ran);
    assert_string_equal(json_string_value(json_object_get(r, "created")),
                        json_string_value(json_object_get(j, "created")));
    json_t *vs = json_object_get(r, "variants");
    for (size_t i = 0; i < json_array_size(vs); i++) {
        json_t *a = json_array_get(vs, i), *b = json_array_get(json_object_get(j, "variants"), i);
        const char *name = json_string_value(json_object_get(a, "name"));
        assert_string_equal(json_string_value(json_object_get(a, "status")), "ran");
        assert_int_equal((int)num(a, "rounds_done"), 1);
        assert_int_equal(json_array_size(json_object_get(a, "cases")), 6);
        assert_true(json_is_true(json_object_get(json_object_get(a, "quality"), "ok"))); /* exact plugins */
        if (!strcmp(json_string_value(json_object_get(b, "status")), "ran") &&
            !json_equal(json_object_get(a, "cases"), json_object_get(b, "cases")))
            fail_msg("variant %s: measured before the kill, its cases changed on --resume", name);
    }
    json_t *at = json_object_get(r, "attribution");
    assert_true(json_is_true(json_object_get(at, "exact_shapley")));
    assert_near(num(at, "shapley_sum"), num(at, "full_minus_baseline"), 1e-8);
    json_decref(r);
    json_decref(j);
    char p[700], want[100];
    snprintf(p, sizeof p, "%s/report.md", out);
    char *md = read_text(p);
    snprintf(want, sizeof want, "resumed: %d of the 8 variants", ran);
    assert_non_null(strstr(md, want));
    free(md);

    /* refused: a run measured by a binary built from another commit */
    snprintf(rj, sizeof rj, "%s/result.json", out);
    json_t *saved = json_load_file(rj, 0, NULL);
    assert_non_null(saved);
    assert_true(json_is_string(json_object_get(saved, "built_from")));
    json_t *built = json_incref(json_object_get(saved, "built_from"));
    assert_int_equal(json_object_set_new(saved, "built_from", json_string("0123456789abcdef+other")), 0);
    assert_int_equal(json_dump_file(saved, rj, 0), 0);
    resume_refused(asmb, wl, out, "measured by a binary built from 0123456789abcdef+other");
    assert_int_equal(json_object_set_new(saved, "built_from", built), 0); /* as it was */
    assert_int_equal(json_dump_file(saved, rj, 0), 0);
    json_decref(saved);

    /* refused: another workload; nothing to resume */
    snprintf(wl, sizeof wl, "%s/tests/ablation/data/tiny.json", g_src);
    resume_refused(asmb, wl, out, "workload ci version 1, not test-tiny");
    snprintf(out, sizeof out, "%s/resume-none", g_tmp);
    resume_refused(asmb, wl, out, "no earlier run to continue");
}

static void test_bench(void **st) {
    (void)st;
    NEED_READY();
    char wl[1200], asmb[1200];
    snprintf(wl, sizeof wl, "%s/tests/ablation/data/tiny.json", g_src);
    snprintf(asmb, sizeof asmb, "%s/tests/ablation/data/exact3.yaml", g_src);
    const char *argv[] = {g_bin, "bench", asmb, "--workload", wl, "--device", g_dev, "--catalog", g_cat,
                          "--threads", "1", NULL};
    if (run(argv) != 0) {
        print_output();
        fail_msg("tessera bench failed");
    }
    char p[512];
    snprintf(p, sizeof p, "%s/out.txt", g_tmp);
    char *t = read_text(p);
    assert_non_null(strstr(t, "engine abl-exact3"));
    /* a row per case: name, prompt and generated tokens, then figures */
    const char *names[] = {"\nchat ", "\nagent "};
    for (int i = 0; i < 2; i++) {
        const char *r = strstr(t, names[i]);
        if (!r) fail_msg("no row for %s in:\n%s", names[i] + 1, t);
        int in = 0, out = 0;
        double dec = 0;
        assert_int_equal(sscanf(strchr(r + 1, ' '), "%d %d %lf", &in, &out, &dec), 3);
        assert_true(in > 0 && out >= 1 && out <= 12 && dec >= 0);
    }
    free(t);
    /* nothing listening: a clear error, not a hang */
    const char *dead[] = {g_bin, "bench", "--workload", wl, "--device", g_dev, "--url", "http://127.0.0.1:1", NULL};
    assert_int_equal(run(dead), 1);
    t = read_text(p);
    assert_non_null(strstr(t, "127.0.0.1:1"));
    free(t);
}

/* result.json's git_commit: the source tree's HEAD, "+modified" while a
 * tracked file differs from it (a throwaway repository as the source tree). */
static void test_ablate_commit_record(void **st) {
    (void)st;
    NEED_READY();
    char repo[400], cmd[1400], head[64] = "";
    snprintf(repo, sizeof repo, "%s/gitsrc", g_tmp);
    snprintf(cmd, sizeof cmd,
             "set -e; mkdir -p '%s'; cd '%s'; git init -q .; echo a > f; git add f;"
             " git -c user.email=t@t -c user.name=t commit -qm one; git rev-parse HEAD > head.txt; echo b > f",
             repo, repo);
    if (system(cmd)) skip(); /* no git here: nothing to record */
    snprintf(cmd, sizeof cmd, "%s/head.txt", repo);
    char *h = read_text(cmd);
    assert_non_null(h);
    snprintf(head, sizeof head, "%.40s", h);
    free(h);
    const char *old = getenv("TESSERA_SOURCE_DIR");
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", old ? old : "");
    setenv("TESSERA_SOURCE_DIR", repo, 1);
    for (int clean = 0; clean < 2; clean++) {
        if (clean) {
            snprintf(cmd, sizeof cmd, "cd '%s' && git checkout -q -- f", repo);
            assert_int_equal(system(cmd), 0);
        }
        const char *out = clean ? "commit-clean" : "commit-mod";
        json_t *j = ablate("exact3.yaml", "tests/ablation/data/tiny.json", g_cat, out, 0);
        char want[80];
        snprintf(want, sizeof want, "%s%s", head, clean ? "" : "+modified");
        assert_string_equal(json_string_value(json_object_get(j, "git_commit")), want);
        json_decref(j);
    }
    if (old) setenv("TESSERA_SOURCE_DIR", keep, 1);
    else unsetenv("TESSERA_SOURCE_DIR");
}

static void test_ablate_bad_input(void **st) {
    (void)st;
    NEED_READY();
    char out[600], wl[1200], asmb[1200];
    snprintf(out, sizeof out, "%s/bad", g_tmp);
    snprintf(wl, sizeof wl, "%s/tests/ablation/data/tiny.json", g_src);
    snprintf(asmb, sizeof asmb, "%s/tests/ablation/data/exact3.yaml", g_src);
    const char *a1[] = {g_bin, "ablate", "/nonexistent.yaml", "--workload", wl, "--out", out, "--device", g_dev,
                        "--catalog", g_cat, "--quiet", NULL};
    assert_int_equal(run(a1), 2);
    const char *a2[] = {g_bin, "ablate", asmb, "--workload", asmb, "--out", out, "--device", g_dev,
                        "--catalog", g_cat, "--quiet", NULL};
    assert_int_equal(run(a2), 2); /* YAML is not a JSON workload: file:line:col */
    char p[512];
    snprintf(p, sizeof p, "%s/out.txt", g_tmp);
    char *t = read_text(p);
    assert_non_null(strstr(t, "exact3.yaml:"));
    free(t);
    const char *a3[] = {g_bin, "ablate", asmb, "--workload", wl, "--out", out, "--device", wl, "--catalog", g_cat,
                        "--quiet", NULL};
    assert_int_equal(run(a3), 2); /* not a device record */
    const char *a4[] = {g_bin, "ablate", "--quiet", NULL};
    assert_int_equal(run(a4), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe),
        cmocka_unit_test(test_ablate_exact3),
        cmocka_unit_test(test_ablate_perturbing_plugins),
        cmocka_unit_test(test_ablate_not_deterministic),
        cmocka_unit_test(test_ablate_refused_variant),
        cmocka_unit_test(test_ablate_resume),
        cmocka_unit_test(test_bench),
        cmocka_unit_test(test_ablate_commit_record),
        cmocka_unit_test(test_ablate_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
