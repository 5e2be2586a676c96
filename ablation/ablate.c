#include "ablate.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../core/host/assembly.h"
#include "../core/host/catalog.h"
#include "../core/host/checker.h"
#include "../core/util/checked.h"
#include "../core/runtime/runtime.h"
#include "report.h"
#include "shapley.h"
#include "tsr_build_info.h" /* TSR_BUILD_COMMIT: build/generated, cmake/build_info.cmake */

void tsr_abl_result_free(tsr_abl_result *r) {
    if (!r) return;
    for (int i = 0; i < r->n_variants; i++) tsr_bench_result_free(&r->variants[i].bench);
    free(r->variants);
    free(r->assembly_text);
    free(r);
}

/* ---- assemblies of the variants ---- */

static void emit_node(FILE *f, const tsr_ynode *n) {
    if (!n) {
        fputs("null", f);
        return;
    }
    if (n->kind == TSR_YNODE_SCALAR) {
        if (!n->quoted) {
            fputs(n->str, f);
            return;
        }
        fputc('"', f);
        for (const char *p = n->str; *p; p++) {
            if (*p == '"' || *p == '\\') fputc('\\', f);
            if ((unsigned char)*p < 0x20) fprintf(f, "\\x%02x", (unsigned char)*p);
            else fputc(*p, f);
        }
        fputc('"', f);
        return;
    }
    int map = n->kind == TSR_YNODE_MAP;
    fputc(map ? '{' : '[', f);
    for (int i = 0; i < n->n; i += map ? 2 : 1) {
        if (i) fputs(", ", f);
        emit_node(f, n->items[i]);
        if (map) {
            fputs(": ", f);
            emit_node(f, n->items[i + 1]);
        }
    }
    fputc(map ? '}' : ']', f);
}

typedef struct abl_ctx {
    const tsr_ablate_opts *o;
    tsr_catalog *cat;
    tsr_assembly *as;
    tsr_plan *plan;
    int np;
    int pslot[TSR_ABL_MAX_PLUGINS];           /* slot of plugin i; -1: a runtime switch */
    int sw[TSR_RT_COUNT];                     /* factor index of each runtime switch the assembly sets, or -1 */
    const tsr_manifest *base[TSR_SLOT_COUNT]; /* each slot's baseline */
    int vi, nv;                               /* progress: the variant, of nv */
    int round, rounds;                        /* in round (of rounds; odd rounds run in reverse) */
    const tsr_probe_result *dev;              /* the machine's ceilings */
} abl_ctx;

/* A runtime switch the assembly turns on, as factor r->n_plugins: exact (the
 * same kernels, replayed, launched early or queued ahead; attention's key
 * splits reorder float sums, which the quality check would show). */
static int add_switch(tsr_abl_result *r, abl_ctx *c, tsr_rt_switch s) {
    tsr_abl_plugin *p = &r->plugins[r->n_plugins];
    c->pslot[r->n_plugins] = -1;
    snprintf(p->name, sizeof p->name, "runtime.%s", tsr_rt_switch_name(s));
    snprintf(p->slot, sizeof p->slot, "runtime");
    snprintf(p->baseline, sizeof p->baseline, "off");
    p->exact = 1;
    p->max_mean_kl = 0;
    p->max_ppl_ratio = 1;
    return r->n_plugins++;
}

static int write_variant(abl_ctx *c, tsr_abl_result *r, tsr_abl_variant *v, tsr_error *err) {
    snprintf(v->assembly_file, sizeof v->assembly_file, "%s/assemblies/%s.yaml", c->o->out_dir, v->name);
    for (char *p = strrchr(v->assembly_file, '/') + 1; *p; p++)
        if (*p == ':' || *p == '+') *p = '_';
    FILE *f = fopen(v->assembly_file, "w");
    if (!f) return tsr_error_set(err, TSR_ERR_IO, "cannot write %s: %s", v->assembly_file, strerror(errno));
    fprintf(f, "# written by tessera ablate from %s: variant %s\n", r->assembly_path, v->name);
    fprintf(f, "name: \"%s-%s\"\ndevice: %s\nslots:\n", r->assembly_name, v->name,
            tsr_device_name(c->plan->device));
    for (int s = 0; s < TSR_SLOT_COUNT; s++) {
        const tsr_plan_slot *ps = &c->plan->slots[s];
        int on = 1, pi = -1;
        for (int i = 0; i < c->np; i++)
            if (c->pslot[i] == s) pi = i;
        if (pi >= 0) on = (v->mask >> pi) & 1;
        const tsr_aslot *as = &c->as->slots[s];
        if (on && pi >= 0) {
            fprintf(f, "  %s: {plugin: %s", tsr_slot_name((tsr_slot)s), ps->m->name);
            if (as->given && as->params) {
                fputs(", params: ", f);
                emit_node(f, as->params);
            }
            fputs("}\n", f);
        } else if (pi < 0 && as->given) { /* a baseline the assembly names: as written */
            fprintf(f, "  %s: {plugin: %s", tsr_slot_name((tsr_slot)s), ps->m->name);
            if (as->params) {
                fputs(", params: ", f);
                emit_node(f, as->params);
            }
            fputs("}\n", f);
        } else {
            fprintf(f, "  %s: %s\n", tsr_slot_name((tsr_slot)s), c->base[s]->name);
        }
    }
    int any = 0;
    for (int s = 0; s < TSR_RT_COUNT; s++) {
        if (c->sw[s] < 0 || !(v->mask >> c->sw[s] & 1)) continue;
        if (!any++) fputs("runtime:\n", f);
        fprintf(f, "  %s: true\n", tsr_rt_switch_name((tsr_rt_switch)s));
    }
    if (fclose(f)) return tsr_error_set(err, TSR_ERR_IO, "cannot write %s", v->assembly_file);
    return TSR_OK;
}

/* The checker's verdict on a variant (no model: the model is checked by serve). */
static int check_variant(abl_ctx *c, tsr_abl_variant *v) {
    tsr_diag d;
    tsr_diag_init(&d);
    tsr_assembly *a = NULL;
    tsr_plan *p = NULL;
    tsr_assembly_env env = {.catalog = c->cat, .device = c->plan->device};
    int rc = tsr_assembly_load(v->assembly_file, &env, &a, &d);
    tsr_check_opts co = {0};
    if (rc == TSR_OK) rc = tsr_check(c->cat, a, &co, &p, &d);
    if (rc != TSR_OK) {
        size_t n = 0;
        v->reason[0] = 0;
        for (int i = 0; i < d.n_errors && n + 8 < sizeof v->reason; i++) {
            char buf[1200];
            tsr_error e = d.errors[i];
            e.file[0] = 0; /* the generated file's name says nothing */
            e.line = e.col = 0;
            n += (size_t)snprintf(v->reason + n, sizeof v->reason - n, "%s%s", i ? "; " : "",
                                  tsr_error_format(&e, buf, sizeof buf));
        }
        if (!d.n_errors) snprintf(v->reason, sizeof v->reason, "refused by the checker");
        v->refused = 1;
    }
    tsr_plan_free(p);
    tsr_assembly_free(a);
    tsr_diag_free(&d);
    return rc;
}

/* ---- progress ---- */

typedef struct prog { abl_ctx *c; const char *variant; } prog;

static void on_progress(void *ud, int ci, int nc, const char *name, int rep, int nrep) {
    prog *p = ud;
    const abl_ctx *c = p->c;
    char where[48] = ""; /* "round 2/3 " with more than one round */
    if (c->rounds > 1) snprintf(where, sizeof where, "round %d/%d ", c->round + 1, c->rounds);
    if (!isatty(2)) { /* a log: one line per case */
        if (rep == 0)
            fprintf(stderr, "ablate: %svariant %d/%d %s: case %d/%d %s\n", where, c->vi + 1, c->nv, p->variant, ci + 1,
                    nc, name);
        return;
    }
    const int rounds = c->rounds > 1 ? c->rounds : 1;
    const int step = c->round % 2 ? c->nv - 1 - c->vi : c->vi; /* its place in this round's order */
    double frac = ((double)c->round * c->nv + step + (double)ci / nc) / ((double)rounds * c->nv);
    char bar[21];
    int fill = (int)(frac * 20);
    for (int i = 0; i < 20; i++) bar[i] = i < fill ? '#' : '.';
    bar[20] = 0;
    if (nrep == 0) /* starting the server */
        fprintf(stderr, "\r\033[K[%s] %svariant %d/%d %s  %s", bar, where, c->vi + 1, c->nv, p->variant, name);
    else
        fprintf(stderr, "\r\033[K[%s] %svariant %d/%d %s  case %d/%d %s (%s %d/%d)", bar, where, c->vi + 1, c->nv,
                p->variant, ci + 1, nc, name, rep < 0 ? "warm-up" : "run", rep < 0 ? 1 : rep + 1, nrep);
    fflush(stderr);
}

/* ---- quality through the score path ---- */

typedef struct score_ref {
    int32_t *ids;
    int n;
    float *logits; /* [n, vocab] */
    int vocab;
} score_ref;

static int score_logits(const tsr_ablate_opts *o, const char *assembly, score_ref *ref, const char *encode,
                        float **logits, tsr_error *err) {
    tsr_model_opts mo = {.model_path = o->model, .assembly_path = assembly, .catalog_dir = o->catalog,
                         .n_threads = o->n_threads};
    tsr_model *m = NULL;
    int rc = tsr_model_load(&mo, &m, err);
    if (rc) return rc;
    if (encode) {
        const tsr_tokenizer *t = tsr_model_get_tokenizer(m);
        if (!t) rc = tsr_error_set(err, TSR_ERR_UNSUPPORTED, "quality: the model has no tokenizer");
        else
            rc = tsr_tokenizer_encode(t, encode, strlen(encode), tsr_tokenizer_adds_bos(t), 0, &ref->ids,
                                      &ref->n, err);
        if (!rc && ref->n < 2) rc = tsr_error_set(err, TSR_ERR_INVALID, "quality: score_text gives < 2 tokens");
        if (!rc && ref->n > tsr_model_ctx(m)) ref->n = tsr_model_ctx(m);
        ref->vocab = tsr_model_get_config(m)->vocab;
    }
    float *lg = NULL;
    tsr_seq *s = NULL;
    if (!rc) {
        uint64_t bytes;
        if (tsr_mul_u64((uint64_t)ref->n, (uint64_t)ref->vocab * sizeof(float), &bytes) ||
            !(lg = malloc(bytes)))
            rc = tsr_error_set(err, TSR_ERR_NOMEM, "quality: no memory for %d x %d logits", ref->n, ref->vocab);
    }
    if (!rc) rc = tsr_seq_new(m, ref->n, &s, err);
    if (!rc) rc = tsr_seq_forward(s, ref->ids, ref->n, lg, 1, err);
    tsr_seq_free(s);
    tsr_model_free(m);
    if (rc) {
        free(lg);
        return rc;
    }
    *logits = lg;
    return TSR_OK;
}

static void log_softmax(const float *x, int n, double *out) {
    double mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double s = 0;
    for (int i = 0; i < n; i++) s += exp(x[i] - mx);
    double l = mx + log(s);
    for (int i = 0; i < n; i++) out[i] = x[i] - l;
}

/* mean KL(base || var) over positions, and exp(mean NLL var - mean NLL base). */
static int kl_ppl(const score_ref *r, const float *var, double *kl, double *ppl) {
    double *lp = malloc(sizeof(double) * (size_t)r->vocab), *lq = malloc(sizeof(double) * (size_t)r->vocab);
    if (!lp || !lq) {
        free(lp), free(lq);
        return -1;
    }
    double skl = 0, nb = 0, nv = 0;
    for (int t = 0; t < r->n; t++) {
        log_softmax(r->logits + (size_t)t * r->vocab, r->vocab, lp);
        log_softmax(var + (size_t)t * r->vocab, r->vocab, lq);
        double k = 0;
        for (int i = 0; i < r->vocab; i++) k += exp(lp[i]) * (lp[i] - lq[i]);
        skl += k;
        if (t + 1 < r->n) {
            nb -= lp[r->ids[t + 1]];
            nv -= lq[r->ids[t + 1]];
        }
    }
    *kl = skl / r->n;
    *ppl = exp((nv - nb) / (r->n - 1));
    free(lp), free(lq);
    return 0;
}

/* ---- attribution ---- */

/* Geometric mean over cases of base e2e / variant e2e (median end-to-end
 * times): robust where token chunks reach the client in bursts, and it
 * counts prefill and decode as the client sees them. */
static double geomean_ratio(const tsr_abl_variant *v, const tsr_abl_variant *b) {
    double s = 0;
    int n = 0;
    for (int i = 0; i < v->bench.n_cases && i < b->bench.n_cases; i++) {
        double x = v->bench.cases[i].e2e_s.med, y = b->bench.cases[i].e2e_s.med;
        if (!(x > 0) || !(y > 0)) return NAN;
        s += log(y / x);
        n++;
    }
    return n ? exp(s / n) : NAN;
}

static tsr_abl_variant *by_mask(tsr_abl_result *r, unsigned m) {
    for (int i = 0; i < r->n_variants; i++)
        if (r->variants[i].mask == m) return &r->variants[i];
    return NULL;
}

static int ran(const tsr_abl_variant *v) { return v && !v->refused && !v->failed && v->bench.n_cases > 0; }

void tsr_abl_attribute(tsr_abl_result *r) {
    tsr_abl_variant *base = by_mask(r, 0);
    unsigned all = (1u << r->n_plugins) - 1;
    for (int i = 0; i < r->n_variants; i++) {
        tsr_abl_variant *v = &r->variants[i];
        v->speedup = ran(v) && ran(base) ? geomean_ratio(v, base) : NAN;
    }
    tsr_abl_variant *full = by_mask(r, all);
    for (int i = 0; i < r->n_plugins; i++) {
        tsr_abl_variant *off = by_mask(r, all & ~(1u << i)), *alone = by_mask(r, 1u << i);
        r->plugins[i].off = full && off ? full->speedup - off->speedup : NAN;
        r->plugins[i].alone = alone ? alone->speedup - 1 : NAN;
        r->plugins[i].shapley = NAN;
    }
    r->has_shapley = 0;
    r->full_minus_baseline = full ? full->speedup - 1 : NAN;
    r->shapley_sum = NAN;
    if (r->n_plugins > TSR_ABL_MAX_SUBSETS) {
        snprintf(r->shapley_note, sizeof r->shapley_note,
                 "%d non-baseline plugins: more than %d, so not every subset was run", r->n_plugins,
                 TSR_ABL_MAX_SUBSETS);
        return;
    }
    double v[1u << TSR_ABL_MAX_SUBSETS];
    unsigned char known[1u << TSR_ABL_MAX_SUBSETS];
    for (unsigned m = 0; m <= all; m++) {
        tsr_abl_variant *x = by_mask(r, m);
        known[m] = x && isfinite(x->speedup);
        v[m] = known[m] ? x->speedup : 0;
    }
    double phi[TSR_ABL_MAX_SUBSETS];
    tsr_error e;
    tsr_error_clear(&e);
    if (tsr_shapley(r->n_plugins, v, known, phi, &e) != TSR_OK) {
        unsigned miss = 0;
        while (miss <= all && known[miss]) miss++;
        tsr_abl_variant *x = miss <= all ? by_mask(r, miss) : NULL;
        snprintf(r->shapley_note, sizeof r->shapley_note, "no exact Shapley values: variant %s %s",
                 x ? x->name : "?", x && x->refused ? "was refused" : "has no measurement");
        return;
    }
    r->has_shapley = 1;
    r->shapley_sum = 0;
    for (int i = 0; i < r->n_plugins; i++) {
        r->plugins[i].shapley = phi[i];
        r->shapley_sum += phi[i];
    }
    snprintf(r->shapley_note, sizeof r->shapley_note, "exact over all %u subsets", all + 1);
}

static void summarize(tsr_abl_variant *v) {
    double ld = 0, lp = 0, lt = 0, le = 0, fd = 0, fp = 0;
    int n = v->bench.n_cases, nfd = 0, nfp = 0;
    for (int i = 0; i < n; i++) {
        const tsr_bench_case *c = &v->bench.cases[i];
        ld += log(c->decode_tps.med > 0 ? c->decode_tps.med : 1e-9);
        lp += log(c->prefill_tps.med > 0 ? c->prefill_tps.med : 1e-9);
        lt += log(c->ttft_s.med > 0 ? c->ttft_s.med : 1e-9);
        le += log(c->e2e_s.med > 0 ? c->e2e_s.med : 1e-9);
        if (c->decode_ceiling_tps > 0) fd += c->decode_tps.med / c->decode_ceiling_tps, nfd++;
        if (c->prefill_ceiling_tps > 0) fp += c->prefill_tps.med / c->prefill_ceiling_tps, nfp++;
    }
    v->decode_tps = n ? exp(ld / n) : NAN;
    v->prefill_tps = n ? exp(lp / n) : NAN;
    v->ttft_s = n ? exp(lt / n) : NAN;
    v->e2e_s = n ? exp(le / n) : NAN;
    v->decode_ceiling_frac = nfd ? fd / nfd : NAN;
    v->prefill_ceiling_frac = nfp ? fp / nfp : NAN;
}

/* ---- the whole run ---- */

/* The first line git prints for `git -C dir ARGS` ("" if none or no git). */
static void git_line(const char *dir, const char *args, char *buf, size_t size) {
    buf[0] = 0;
    if (dir && strchr(dir, '\'')) return;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "git -C '%s' %s 2>/dev/null", dir ? dir : ".", args);
    FILE *p = popen(cmd, "r");
    if (!p) return;
    if (!fgets(buf, (int)size, p)) buf[0] = 0;
    buf[strcspn(buf, "\r\n")] = 0;
    pclose(p);
}

/* HEAD of the source tree, "+modified" where tracked files differ from it
 * (what was measured is then not that commit), "unknown" without git. */
static void git_commit(const char *dir, char *out, size_t size) {
    char head[128], changed[256];
    git_line(dir, "rev-parse HEAD", head, sizeof head);
    if (strlen(head) != 40) {
        snprintf(out, size, "unknown");
        return;
    }
    git_line(dir, "status --porcelain --untracked-files=no", changed, sizeof changed);
    snprintf(out, size, "%s%s", head, changed[0] ? "+modified" : "");
}

static int mkdir_p(const char *d) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", d);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}

static int load_device(const tsr_ablate_opts *o, tsr_probe_result *d, tsr_error *err) {
    if (!o->device_json) return tsr_probe_run(&o->probe, d, err);
    json_error_t je;
    json_t *j = json_load_file(o->device_json, 0, &je);
    if (!j) return tsr_error_set_at(err, TSR_ERR_FORMAT, o->device_json, je.line, je.column, "%s", je.text);
    int rc = tsr_probe_from_json(j, d, err);
    json_decref(j);
    if (rc) tsr_error_prefix(err, "%s", o->device_json);
    return rc;
}

static void name_variant(const tsr_abl_result *r, unsigned mask, char *buf, size_t size) {
    unsigned all = (1u << r->n_plugins) - 1;
    if (mask == all) snprintf(buf, size, "full");
    else if (mask == 0) snprintf(buf, size, "baseline");
    else if (__builtin_popcount(mask) == 1 && r->n_plugins > 1)
        snprintf(buf, size, "alone:%s", r->plugins[__builtin_ctz(mask)].name);
    else if (__builtin_popcount(all & ~mask) == 1)
        snprintf(buf, size, "off:%s", r->plugins[__builtin_ctz(all & ~mask)].name);
    else {
        size_t n = (size_t)snprintf(buf, size, "subset:");
        for (int i = 0, first = 1; i < r->n_plugins && n < size; i++)
            if (mask >> i & 1) {
                n += (size_t)snprintf(buf + n, size - n, "%s%s", first ? "" : "+", r->plugins[i].name);
                first = 0;
            }
    }
}

static void quality(abl_ctx *c, tsr_abl_result *r, tsr_abl_variant *v, tsr_abl_variant *base, score_ref *ref,
                    int *have_ref) {
    if (v->mask == 0) {
        v->quality_kind = 0;
        v->quality_ok = 1;
        snprintf(v->verdict, sizeof v->verdict, "reference");
        return;
    }
    int lossy = 0;
    v->kl_bound = 0;
    v->ppl_bound = 1;
    for (int i = 0; i < r->n_plugins; i++)
        if ((v->mask >> i & 1) && !r->plugins[i].exact) {
            lossy = 1;
            v->kl_bound += r->plugins[i].max_mean_kl;
            v->ppl_bound *= r->plugins[i].max_ppl_ratio;
        }
    v->diverge_pos = -1;
    v->diverge_case[0] = 0;
    if (!lossy) {
        v->quality_kind = 1;
        if (!ran(base)) {
            v->quality_ok = 0;
            snprintf(v->verdict, sizeof v->verdict, "quality unknown: the all-baseline variant did not run");
            return;
        }
        for (int i = 0; i < v->bench.n_cases && i < base->bench.n_cases; i++) {
            const json_t *a = v->bench.cases[i].tokens, *b = base->bench.cases[i].tokens;
            size_t na = json_array_size(a), nb = json_array_size(b), k = 0;
            while (k < na && k < nb &&
                   !strcmp(json_string_value(json_array_get(a, k)), json_string_value(json_array_get(b, k))))
                k++;
            if (k < na || k < nb) {
                snprintf(v->diverge_case, sizeof v->diverge_case, "%s", v->bench.cases[i].name);
                v->diverge_pos = (int)k;
                break;
            }
        }
        v->quality_ok = v->diverge_pos < 0;
        if (v->quality_ok) snprintf(v->verdict, sizeof v->verdict, "exact: greedy tokens identical");
        else
            snprintf(v->verdict, sizeof v->verdict,
                     "FAIL: breaks exactness (declared exact): case '%s' differs at token %d", v->diverge_case,
                     v->diverge_pos);
        return;
    }
    if (c->o->no_kl) { /* asked not to load the model in-process for the score path */
        v->quality_kind = 3;
        v->quality_ok = 1;
        snprintf(v->verdict, sizeof v->verdict,
                 "not scored (--no-kl): lossy, declared bounds mean KL %.3g, perplexity ratio %.4f", v->kl_bound,
                 v->ppl_bound);
        return;
    }
    v->quality_kind = 2;
    tsr_error e;
    tsr_error_clear(&e);
    if (!*have_ref) {
        const char *text = r->w->score_text;
        if (!text[0]) {
            v->quality_ok = 0;
            snprintf(v->verdict, sizeof v->verdict, "quality unknown: the workload has no score_text");
            return;
        }
        tsr_abl_variant *b = by_mask(r, 0);
        float *lg = NULL;
        if (score_logits(c->o, b->assembly_file, ref, text, &lg, &e) != TSR_OK) {
            char buf[1200];
            v->quality_ok = 0;
            snprintf(v->verdict, sizeof v->verdict, "quality unknown: baseline score: %s",
                     tsr_error_format(&e, buf, sizeof buf));
            return;
        }
        ref->logits = lg;
        *have_ref = 1;
    }
    float *lg = NULL;
    if (score_logits(c->o, v->assembly_file, ref, NULL, &lg, &e) != TSR_OK) {
        char buf[1200];
        v->quality_ok = 0;
        snprintf(v->verdict, sizeof v->verdict, "quality unknown: score: %s", tsr_error_format(&e, buf, sizeof buf));
        return;
    }
    if (kl_ppl(ref, lg, &v->mean_kl, &v->ppl_ratio)) {
        free(lg);
        v->quality_ok = 0;
        snprintf(v->verdict, sizeof v->verdict, "quality unknown: out of memory");
        return;
    }
    free(lg);
    v->quality_ok = v->mean_kl <= v->kl_bound && v->ppl_ratio <= v->ppl_bound;
    snprintf(v->verdict, sizeof v->verdict, "%s: mean KL %.3g (bound %.3g), perplexity ratio %.5f (bound %.4f)",
             v->quality_ok ? "within bound" : "FAIL: over the declared bound", v->mean_kl, v->kl_bound,
             v->ppl_ratio, v->ppl_bound);
}

/* One round of a variant: serve it, run the workload, stop the server; the
 * first round's measurement becomes v->bench, later ones are pooled into it.
 * A variant whose server will not start is refused (failed, if it started in
 * an earlier round), one whose requests fail or whose server exits badly has
 * failed; neither is measured again. */
static void measure_variant(abl_ctx *c, tsr_abl_variant *v, const tsr_workload *w, int round) {
    const tsr_ablate_opts *o = c->o;
    char logp[1200];
    snprintf(logp, sizeof logp, "%s.log", v->assembly_file);
    tsr_serve_spec spec = {.exe = o->exe, .assembly = v->assembly_file, .model = o->model,
                           .catalog = o->catalog, .chat_format = o->chat_format,
                           .n_threads = o->n_threads, .ctx = o->ctx, .log_path = logp};
    tsr_served sv;
    tsr_error e;
    tsr_error_clear(&e);
    if (o->progress) on_progress(&(prog){c, v->name}, 0, w->n_cases, "(starting tessera serve)", -1, 0);
    if (tsr_serve_spawn(&spec, &sv, &e) != TSR_OK) { /* refused; after a round that ran, failed */
        snprintf(v->reason, sizeof v->reason, "%s", e.msg);
        if (round) {
            v->failed = 1;
            snprintf(v->verdict, sizeof v->verdict, "FAIL: %.480s", e.msg);
        } else {
            v->refused = 1;
            snprintf(v->verdict, sizeof v->verdict, "refused");
        }
        if (o->progress) fprintf(stderr, "%svariant %s: %s: %s\n", isatty(2) ? "\r\033[K" : "", v->name,
                                 round ? "failed" : "refused", v->reason);
        return;
    }
    tsr_engine_figures fig;
    tsr_error fe;
    tsr_error_clear(&fe);
    if (tsr_engine_figures_http(sv.url, &fig, &fe) != TSR_OK || !fig.known)
        tsr_engine_figures_local(&spec, &fig, &fe);
    prog pg = {c, v->name};
    tsr_bench_opts bo = {.url = sv.url, .w = w, .dev = c->dev, .fig = &fig,
                         .progress = o->progress ? on_progress : NULL, .progress_ud = &pg};
    tsr_bench_result one;
    if (tsr_bench_run(&bo, round ? &one : &v->bench, &e) != TSR_OK ||
        (round && tsr_bench_merge(&v->bench, &one, &e) != TSR_OK)) {
        v->failed = 1;
        snprintf(v->reason, sizeof v->reason, "%s", e.msg);
        snprintf(v->verdict, sizeof v->verdict, "FAIL: %.480s", e.msg);
    }
    int st = tsr_serve_stop(&sv);
    if (st != 0 && !v->failed) { /* a crash or a leak report at shutdown is a failure too */
        v->failed = 1;
        snprintf(v->reason, sizeof v->reason, "tessera serve exited with status %d at shutdown (see %.900s)", st,
                 logp);
        snprintf(v->verdict, sizeof v->verdict, "FAIL: tessera serve exited with status %d", st);
    }
}

/* Now, UTC, ISO 8601 (result.json's created and measured). */
static void utc_now(char *buf, size_t size) {
    time_t t = time(NULL);
    strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
}

static const char *str_at(const json_t *o, const char *a, const char *b) {
    const json_t *v = json_object_get(o, a);
    if (b) v = json_object_get(v, b);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* --resume: what out_dir/result.json (left by an interrupted run) measured,
 * where it is the same ablation: schema, git commit, the binary's build
 * commit, model, workload (name
 * and version), rounds, assembly text and variants. Its device record is
 * reused (the ceilings stay those of one probe) and its variants that ran
 * keep their rounds; refused, failed and pending ones are measured again. */
static int resume_from(const tsr_ablate_opts *o, tsr_abl_result *r, tsr_error *err) {
    char p[1200];
    snprintf(p, sizeof p, "%s/result.json", o->out_dir);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!j) {
        if (access(p, F_OK))
            return tsr_error_set(err, TSR_ERR_INVALID, "--resume: %s: no earlier run to continue", p);
        return tsr_error_set_at(err, TSR_ERR_FORMAT, p, je.line, je.column, "%s", je.text);
    }
    int rc = TSR_OK;
    const char *sch = str_at(j, "schema", NULL), *commit = str_at(j, "git_commit", NULL);
    const char *built = str_at(j, "built_from", NULL);
    const char *model = str_at(j, "settings", "model"), *text = str_at(j, "assembly", "text");
    const json_t *wl = json_object_get(json_object_get(j, "settings"), "workload");
    const char *wname = str_at(wl, "name", NULL);
    const json_t *vs = json_object_get(j, "variants");
    const char *want_model = r->model[0] ? r->model : "(embedded stories260K)";
    if (!sch || strcmp(sch, TSR_ABL_RESULT_SCHEMA))
        rc = tsr_error_set(err, TSR_ERR_FORMAT, "schema is not \"%s\"", TSR_ABL_RESULT_SCHEMA);
    else if (!commit || strcmp(commit, r->commit))
        rc = tsr_error_set(err, TSR_ERR_REFUSED, "measured at commit %s, this is %s", commit ? commit : "?",
                           r->commit);
    else if (!built || strcmp(built, r->built_from))
        rc = tsr_error_set(err, TSR_ERR_REFUSED, "measured by a binary built from %s, this one is built from %s",
                           built ? built : "?", r->built_from);
    else if (!model || strcmp(model, want_model))
        rc = tsr_error_set(err, TSR_ERR_REFUSED, "model %s, not %s", model ? model : "?", want_model);
    else if (!wname || strcmp(wname, r->w->name) || json_integer_value(json_object_get(wl, "version")) != r->w->version)
        rc = tsr_error_set(err, TSR_ERR_REFUSED, "workload %s version %d, not %s version %d", wname ? wname : "?",
                           (int)json_integer_value(json_object_get(wl, "version")), r->w->name, r->w->version);
    else if (json_integer_value(json_object_get(wl, "rounds")) != r->rounds)
        rc = tsr_error_set(err, TSR_ERR_REFUSED, "%d rounds, not %d",
                           (int)json_integer_value(json_object_get(wl, "rounds")), r->rounds);
    else if (!text || !r->assembly_text || strcmp(text, r->assembly_text))
        rc = tsr_error_set(err, TSR_ERR_REFUSED, "the assembly %s has changed since", r->assembly_path);
    else if (json_array_size(vs) != (size_t)r->n_variants)
        rc = tsr_error_set(err, TSR_ERR_REFUSED, "%zu variants, not %d", json_array_size(vs), r->n_variants);
    else if ((rc = tsr_probe_from_json(json_object_get(j, "device"), &r->dev, err)) == TSR_OK) {
        const char *cr = str_at(j, "created", NULL);
        if (cr) snprintf(r->created, sizeof r->created, "%s", cr);
    }
    for (int k = 0; k < r->n_variants && rc == TSR_OK; k++) {
        const json_t *vj = json_array_get(vs, (size_t)k);
        tsr_abl_variant *v = &r->variants[k];
        const char *name = str_at(vj, "name", NULL), *st = str_at(vj, "status", NULL), *at = str_at(vj, "measured", NULL);
        const json_t *cases = json_object_get(vj, "cases");
        if (!name || strcmp(name, v->name) || json_integer_value(json_object_get(vj, "mask")) != v->mask) {
            rc = tsr_error_set(err, TSR_ERR_REFUSED, "variant %d is %s, not %s", k, name ? name : "?", v->name);
            break;
        }
        if (!st || strcmp(st, "ran")) continue; /* refused, failed or pending: measured again */
        int done = (int)json_integer_value(json_object_get(vj, "rounds_done"));
        if (done < 1 || done > r->rounds || json_array_size(cases) != (size_t)r->w->n_cases) {
            rc = tsr_error_set(err, TSR_ERR_FORMAT, "variant %s: rounds_done or cases do not fit the workload", name);
            break;
        }
        v->bench.cases = calloc((size_t)r->w->n_cases, sizeof *v->bench.cases);
        if (!v->bench.cases) {
            rc = tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
            break;
        }
        for (int i = 0; i < r->w->n_cases && rc == TSR_OK; i++) {
            rc = tsr_abl_case_from_json(json_array_get(cases, (size_t)i), &v->bench.cases[i], err);
            if (!rc) v->bench.n_cases = i + 1;
            if (!rc && strcmp(v->bench.cases[i].name, r->w->cases[i].name))
                rc = tsr_error_set(err, TSR_ERR_FORMAT, "case %d is %s, not %s", i, v->bench.cases[i].name,
                                   r->w->cases[i].name);
        }
        /* the engine's figures (null where the run could not read them) */
        const json_t *eng = json_object_get(vj, "engine");
        if (!rc && json_is_object(eng) && !(rc = tsr_engine_figures_from_json(eng, &v->bench.fig, err))) {
            const char *src = str_at(eng, "source", NULL);
            snprintf(v->bench.fig.source, sizeof v->bench.fig.source, "%s", src ? src : "");
        }
        if (rc) {
            tsr_error_prefix(err, "variant %s", name);
            break;
        }
        v->rounds_done = done;
        snprintf(v->measured, sizeof v->measured, "%s", at ? at : "");
        r->resumed++;
    }
    json_decref(j);
    if (rc) tsr_error_prefix(err, "--resume: %s", p);
    return rc;
}

int tsr_ablate_run(const tsr_ablate_opts *o, tsr_abl_result **out, tsr_error *err) {
    if (out) *out = NULL;
    if (!o->assembly || !o->workload || !o->out_dir)
        return tsr_error_set(err, TSR_ERR_INVALID, "ablate: assembly, workload and output folder are required");
    abl_ctx c = {.o = o};
    tsr_workload *w = NULL;
    tsr_abl_result *r = calloc(1, sizeof *r);
    score_ref ref = {0};
    int have_ref = 0;
    tsr_diag d;
    tsr_diag_init(&d);
    int rc;
    if (!r) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    if ((rc = tsr_workload_load(o->workload, &w, err))) goto done;
    r->w = w;
    if (mkdir_p(o->out_dir) ) {
        rc = tsr_error_set(err, TSR_ERR_IO, "cannot create %s: %s", o->out_dir, strerror(errno));
        goto done;
    }
    char sub[1100];
    snprintf(sub, sizeof sub, "%s/assemblies", o->out_dir);
    if (mkdir_p(sub)) {
        rc = tsr_error_set(err, TSR_ERR_IO, "cannot create %s: %s", sub, strerror(errno));
        goto done;
    }
    snprintf(r->assembly_path, sizeof r->assembly_path, "%s", o->assembly);
    snprintf(r->model, sizeof r->model, "%s", o->model ? o->model : "");
    FILE *af = fopen(o->assembly, "rb");
    if (af) { /* kept verbatim in result.json (assemblies are at most 1 MiB) */
        char *t = calloc(1, (1u << 20) + 1);
        if (t) {
            size_t n = fread(t, 1, 1u << 20, af);
            t[n] = 0;
            r->assembly_text = t;
        }
        fclose(af);
    }
    git_commit(o->source_dir, r->commit, sizeof r->commit);
    snprintf(r->built_from, sizeof r->built_from, "%s", TSR_BUILD_COMMIT);
    utc_now(r->created, sizeof r->created);
    r->n_threads = o->n_threads;

    /* the assembly, its plan, its non-baseline plugins and their baselines */
    if ((rc = tsr_catalog_load(o->catalog, &c.cat, &d))) goto diag_fail;
    tsr_assembly_env env = {.catalog = c.cat, .device = TSR_DEVICE_CPU};
    if ((rc = tsr_assembly_load(o->assembly, &env, &c.as, &d))) goto diag_fail;
    tsr_check_opts co = {0};
    if ((rc = tsr_check(c.cat, c.as, &co, &c.plan, &d))) goto diag_fail;
    snprintf(r->assembly_name, sizeof r->assembly_name, "%s", c.as->name);
    for (int s = 0; s < TSR_SLOT_COUNT; s++) {
        for (int i = 0; i < c.cat->n; i++) {
            const tsr_manifest *m = c.cat->items[i];
            if ((int)m->slot == s && (m->baseline >> c.plan->device & 1) && !m->test) {
                if (c.base[s]) {
                    rc = tsr_error_set(err, TSR_ERR_REFUSED, "slot %s has two baselines: %s and %s",
                                       tsr_slot_name((tsr_slot)s), c.base[s]->name, m->name);
                    goto done;
                }
                c.base[s] = m;
            }
        }
        if (!c.base[s]) {
            rc = tsr_error_set(err, TSR_ERR_REFUSED, "slot %s has no baseline plugin for %s in the catalog",
                               tsr_slot_name((tsr_slot)s), tsr_device_name(c.plan->device));
            goto done;
        }
        const tsr_manifest *m = c.plan->slots[s].m;
        if (m == c.base[s]) continue;
        tsr_abl_plugin *p = &r->plugins[r->n_plugins];
        c.pslot[r->n_plugins++] = s;
        snprintf(p->name, sizeof p->name, "%s", m->name);
        snprintf(p->slot, sizeof p->slot, "%s", tsr_slot_name((tsr_slot)s));
        snprintf(p->baseline, sizeof p->baseline, "%s", c.base[s]->name);
        p->exact = m->exact;
        p->max_mean_kl = m->has_quality ? m->max_mean_kl : 0;
        p->max_ppl_ratio = m->has_quality ? m->max_ppl_ratio : 1;
    }
    /* a runtime switch is a factor like a plugin: off is its baseline */
    for (int s = 0; s < TSR_RT_COUNT; s++)
        c.sw[s] = c.as->runtime[s].on ? add_switch(r, &c, (tsr_rt_switch)s) : -1;
    c.np = r->n_plugins;

    r->rounds = o->rounds > 1 ? o->rounds : 1;
    c.rounds = r->rounds;

    /* the variants */
    unsigned all = (1u << r->n_plugins) - 1;
    unsigned masks[1u << TSR_ABL_MAX_SUBSETS > 2 + 2 * TSR_ABL_MAX_PLUGINS ? 1u << TSR_ABL_MAX_SUBSETS
                                                                         : 2 + 2 * TSR_ABL_MAX_PLUGINS];
    int nm = 0;
    masks[nm++] = all;
    if (all) masks[nm++] = 0;
    if (r->n_plugins <= TSR_ABL_MAX_SUBSETS) {
        for (unsigned m = 1; m < all; m++) masks[nm++] = m;
    } else {
        for (int i = 0; i < r->n_plugins; i++) {
            masks[nm++] = all & ~(1u << i);
            masks[nm++] = 1u << i;
        }
    }
    if (!(r->variants = calloc((size_t)nm, sizeof *r->variants))) {
        rc = tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* the baseline runs first so that every later variant can be compared */
    if (nm > 1) masks[0] = 0, masks[1] = all;
    c.nv = nm;
    for (int k = 0; k < nm; k++) {
        tsr_abl_variant *v = &r->variants[r->n_variants++];
        v->mask = masks[k];
        v->speedup = v->decode_tps = v->prefill_tps = v->ttft_s = v->e2e_s = NAN;
        v->decode_ceiling_frac = v->prefill_ceiling_frac = NAN;
        name_variant(r, v->mask, v->name, sizeof v->name);
        if ((rc = write_variant(&c, r, v, err))) goto done;
    }
    for (int k = 0; k < r->n_variants; k++) {
        tsr_abl_variant *v = &r->variants[k];
        c.vi = k;
        if (check_variant(&c, v) != TSR_OK) {
            if (o->progress) fprintf(stderr, "%svariant %s: refused: %s\n", isatty(2) ? "\r\033[K" : "", v->name, v->reason);
            snprintf(v->verdict, sizeof v->verdict, "refused");
        }
    }
    /* the machine's ceilings: those of the run resumed, a record, or probed now */
    if ((rc = o->resume ? resume_from(o, r, err) : load_device(o, &r->dev, err))) goto done;
    c.dev = &r->dev;
    for (int k = 0; k < r->n_variants; k++)
        if (r->variants[k].rounds_done) summarize(&r->variants[k]);
    if ((rc = tsr_abl_write_result_json(r, o->out_dir, err))) goto done;
    /* Rounds: every variant measured once per round, the order reversed on
     * every other round (a machine whose speed drifts then favours no
     * variant), the rounds' samples pooled per case. After each variant
     * result.json is written again, so that an interrupted run keeps what it
     * measured (--resume continues it). */
    for (int round = 0; round < r->rounds; round++)
        for (int i = 0; i < r->n_variants; i++) {
            const int k = round % 2 ? r->n_variants - 1 - i : i;
            tsr_abl_variant *v = &r->variants[k];
            if (v->refused || v->failed || v->rounds_done > round) continue;
            c.vi = k, c.round = round;
            measure_variant(&c, v, w, round);
            if (!v->refused && !v->failed) {
                v->rounds_done = round + 1;
                utc_now(v->measured, sizeof v->measured);
                summarize(v);
            }
            if ((rc = tsr_abl_write_result_json(r, o->out_dir, err))) goto done;
        }
    if (o->progress && isatty(2)) fprintf(stderr, "\r\033[K");
    tsr_abl_attribute(r);
    tsr_abl_variant *base = by_mask(r, 0);
    for (int k = 0; k < r->n_variants; k++) {
        tsr_abl_variant *v = &r->variants[k];
        if (ran(v)) quality(&c, r, v, base, &ref, &have_ref);
    }
    for (int i = 0; i < r->n_plugins; i++) {
        tsr_abl_variant *alone = by_mask(r, 1u << i);
        r->plugins[i].exact_broken = r->plugins[i].exact && alone && alone->quality_kind == 1 &&
                                     ran(alone) && !alone->quality_ok && alone->diverge_pos >= 0;
    }
    rc = tsr_abl_write_reports(r, o->out_dir, err);
    goto done;
diag_fail:
    tsr_diag_to_error(&d, err);
done:
    free(ref.ids);
    if (have_ref) free(ref.logits);
    tsr_diag_free(&d);
    tsr_plan_free(c.plan);
    tsr_assembly_free(c.as);
    tsr_catalog_free(c.cat);
    if (rc == TSR_OK && out) {
        r->w = NULL; /* freed below */
        *out = r;
    } else
        tsr_abl_result_free(r);
    tsr_workload_free(w);
    return rc;
}
