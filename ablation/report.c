#include "report.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "../core/host/manifest.h"

static json_t *stat_json(tsr_stat3 s) {
    return json_pack("{s:o, s:o, s:o}", "median", tsr_jnum(s.med), "min", tsr_jnum(s.min), "max", tsr_jnum(s.max));
}

static json_t *case_json(const tsr_bench_case *c) {
    json_t *samples = json_array();
    for (int i = 0; i < c->n_samples; i++) {
        const tsr_bench_sample *s = &c->samples[i];
        json_array_append_new(samples, json_pack("{s:o, s:o, s:o, s:o, s:i, s:i}", "decode_tps",
                                                 tsr_jnum(s->decode_tps), "prefill_tps", tsr_jnum(s->prefill_tps),
                                                 "ttft_s", tsr_jnum(s->ttft_s), "e2e_s", tsr_jnum(s->e2e_s),
                                                 "prompt_tokens", s->n_prompt, "generated_tokens", s->n_gen));
    }
    return json_pack(
        "{s:s, s:s, s:i, s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:s}", "name", c->name,
        "kind", c->kind, "prompt_tokens", c->n_prompt, "generated_tokens", c->n_gen, "decode_tps",
        stat_json(c->decode_tps), "prefill_tps", stat_json(c->prefill_tps), "ttft_s", stat_json(c->ttft_s),
        "e2e_s", stat_json(c->e2e_s), "decode_ceiling_tps",
        tsr_jnum(c->decode_ceiling_tps > 0 ? c->decode_ceiling_tps : NAN),
        "prefill_ceiling_tps", tsr_jnum(c->prefill_ceiling_tps > 0 ? c->prefill_ceiling_tps : NAN),
        "draft_accepted_per_pass", tsr_jnum(c->draft_accept_per_pass >= 0 ? c->draft_accept_per_pass : NAN),
        "expert_hit_rate", tsr_jnum(c->expert_hit_rate >= 0 ? c->expert_hit_rate : NAN), "samples", samples,
        "tokens", c->tokens ? json_incref(c->tokens) : json_array(), "text", c->text ? c->text : "");
}

static const char *status_of(const tsr_abl_variant *v) {
    return v->refused ? "refused" : v->failed ? "failed" : v->rounds_done ? "ran" : "pending";
}

static tsr_stat3 stat_of(const json_t *o, const char *key) {
    const json_t *s = json_object_get(o, key);
    return (tsr_stat3){tsr_jnum_at(s, "median"), tsr_jnum_at(s, "min"), tsr_jnum_at(s, "max")};
}

int tsr_abl_case_from_json(const json_t *j, tsr_bench_case *c, tsr_error *err) {
    memset(c, 0, sizeof *c);
    const json_t *name = json_object_get(j, "name"), *kind = json_object_get(j, "kind");
    const json_t *samples = json_object_get(j, "samples"), *tokens = json_object_get(j, "tokens");
    const json_t *text = json_object_get(j, "text");
    if (!json_is_string(name) || !json_is_string(kind) || !json_is_array(samples) || !json_is_array(tokens) ||
        !json_is_string(text))
        return tsr_error_set(err, TSR_ERR_FORMAT, "a case without name, kind, samples, tokens or text");
    snprintf(c->name, sizeof c->name, "%s", json_string_value(name));
    snprintf(c->kind, sizeof c->kind, "%s", json_string_value(kind));
    c->n_prompt = (int)json_integer_value(json_object_get(j, "prompt_tokens"));
    c->n_gen = (int)json_integer_value(json_object_get(j, "generated_tokens"));
    c->decode_tps = stat_of(j, "decode_tps"), c->prefill_tps = stat_of(j, "prefill_tps");
    c->ttft_s = stat_of(j, "ttft_s"), c->e2e_s = stat_of(j, "e2e_s");
    /* unknown ceilings are 0, unmeasured drafting and expert rates -1 (case_json writes them null) */
    double d = tsr_jnum_at(j, "decode_ceiling_tps"), p = tsr_jnum_at(j, "prefill_ceiling_tps");
    double a = tsr_jnum_at(j, "draft_accepted_per_pass"), h = tsr_jnum_at(j, "expert_hit_rate");
    c->decode_ceiling_tps = isnan(d) ? 0 : d, c->prefill_ceiling_tps = isnan(p) ? 0 : p;
    c->draft_accept_per_pass = isnan(a) ? -1 : a, c->expert_hit_rate = isnan(h) ? -1 : h;
    size_t n = json_array_size(samples);
    c->samples = calloc(n ? n : 1, sizeof *c->samples);
    c->text = strdup(json_string_value(text));
    if (!c->samples || !c->text) {
        free(c->samples), free(c->text);
        c->samples = NULL, c->text = NULL;
        return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *o = json_array_get(samples, i);
        tsr_bench_sample *s = &c->samples[i];
        s->decode_tps = tsr_jnum_at(o, "decode_tps"), s->prefill_tps = tsr_jnum_at(o, "prefill_tps");
        s->ttft_s = tsr_jnum_at(o, "ttft_s"), s->e2e_s = tsr_jnum_at(o, "e2e_s");
        s->n_prompt = (int)json_integer_value(json_object_get(o, "prompt_tokens"));
        s->n_gen = (int)json_integer_value(json_object_get(o, "generated_tokens"));
    }
    c->n_samples = (int)n;
    c->tokens = json_deep_copy(tokens);
    return TSR_OK;
}

json_t *tsr_abl_result_json(const tsr_abl_result *r) {
    json_t *plugins = json_array(), *variants = json_array();
    for (int i = 0; i < r->n_plugins; i++) {
        const tsr_abl_plugin *p = &r->plugins[i];
        json_array_append_new(
            plugins, json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:b}", "name", p->name, "slot",
                               p->slot, "baseline", p->baseline, "exactness", p->exact ? "exact" : "lossy",
                               "max_mean_kl", p->exact ? json_null() : tsr_jnum(p->max_mean_kl), "max_ppl_ratio",
                               p->exact ? json_null() : tsr_jnum(p->max_ppl_ratio), "off", tsr_jnum(p->off), "alone",
                               tsr_jnum(p->alone), "shapley", tsr_jnum(p->shapley), "exactness_broken",
                               p->exact_broken));
    }
    for (int i = 0; i < r->n_variants; i++) {
        const tsr_abl_variant *v = &r->variants[i];
        json_t *on = json_array(), *cases = json_array();
        for (int k = 0; k < r->n_plugins; k++)
            if (v->mask >> k & 1) json_array_append_new(on, json_string(r->plugins[k].name));
        for (int k = 0; k < v->bench.n_cases; k++) json_array_append_new(cases, case_json(&v->bench.cases[k]));
        json_t *q = json_pack("{s:s, s:b}", "kind",
                              v->quality_kind == 1   ? "exact"
                              : v->quality_kind == 2 ? "lossy"
                              : v->quality_kind == 3 ? "lossy, not scored"
                                                     : "reference",
                              "ok", v->quality_ok);
        if (v->quality_kind == 1 && v->diverge_pos >= 0)
            json_object_set_new(q, "first_difference",
                                json_pack("{s:s, s:i}", "case", v->diverge_case, "token", v->diverge_pos));
        if (v->quality_kind == 2) {
            json_object_set_new(q, "mean_kl", tsr_jnum(v->mean_kl));
            json_object_set_new(q, "ppl_ratio", tsr_jnum(v->ppl_ratio));
            json_object_set_new(q, "max_mean_kl", tsr_jnum(v->kl_bound));
            json_object_set_new(q, "max_ppl_ratio", tsr_jnum(v->ppl_bound));
        }
        const tsr_engine_figures *f = &v->bench.fig;
        json_t *fig = f->known ? tsr_engine_figures_to_json(f) : json_null();
        if (fig && f->known) json_object_set_new(fig, "source", json_string(f->source));
        json_t *vj =
            json_pack("{s:s, s:o, s:s, s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:s}", "name",
                      v->name, "plugins_on", on, "assembly_file", v->assembly_file, "status", status_of(v),
                      "reason", v->reason, "engine", fig, "decode_tps", tsr_jnum(v->decode_tps), "prefill_tps",
                      tsr_jnum(v->prefill_tps), "ttft_s", tsr_jnum(v->ttft_s), "e2e_s", tsr_jnum(v->e2e_s), "speedup",
                      tsr_jnum(v->speedup), "decode_ceiling_fraction", tsr_jnum(v->decode_ceiling_frac),
                      "prefill_ceiling_fraction", tsr_jnum(v->prefill_ceiling_frac), "quality", q, "cases", cases,
                      "verdict", v->verdict);
        /* what --resume reads back: which plugins, how many rounds measured, when */
        if (vj) {
            json_object_set_new(vj, "mask", json_integer(v->mask));
            json_object_set_new(vj, "rounds_done", json_integer(v->rounds_done));
            json_object_set_new(vj, "measured", json_string(v->measured));
        }
        json_array_append_new(variants, vj);
    }
    json_t *dev = tsr_probe_to_json(&r->dev);
    json_t *wl = r->w ? json_pack("{s:s, s:s, s:i, s:i, s:i, s:i}", "path", r->w->path, "name", r->w->name,
                                  "version", r->w->version, "warmup", r->w->warmup, "repeats", r->w->repeats,
                                  "rounds", r->rounds > 1 ? r->rounds : 1)
                      : json_null();
    return json_pack("{s:s, s:s, s:s, s:s, s:{s:s, s:s, s:o, s:i, s:s}, s:o, s:{s:s, s:s, s:s*}, s:o, s:{s:b, s:s, "
                     "s:o, s:o}, s:o, s:i}",
                     "schema", TSR_ABL_RESULT_SCHEMA, "created", r->created, "git_commit", r->commit,
                     "built_from", r->built_from,
                     "settings", "metric", "speedup = geometric mean over cases of the all-baseline variant's median end-to-end time "
                     "over the variant's", "model", r->model[0] ? r->model : "(embedded stories260K)",
                     "workload", wl, "threads", r->n_threads, "sampling", "greedy (temperature 0), streamed",
                     "device", dev, "assembly", "path", r->assembly_path, "name", r->assembly_name, "text",
                     r->assembly_text, "plugins",
                     plugins, "attribution", "exact_shapley", r->has_shapley, "note", r->shapley_note,
                     "shapley_sum", tsr_jnum(r->shapley_sum), "full_minus_baseline", tsr_jnum(r->full_minus_baseline),
                     "variants", variants, "resumed_variants", r->resumed);
}

static void csv_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void csv_num(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, ",%.6g", x);
    else fputs(",", f);
}

int tsr_abl_write_csv(const tsr_abl_result *r, FILE *f) {
    fputs("variant,status,case,prompt_tokens,generated_tokens,decode_tps_median,decode_tps_min,decode_tps_max,"
          "prefill_tps_median,prefill_tps_min,prefill_tps_max,ttft_s_median,ttft_s_min,ttft_s_max,e2e_s_median,"
          "e2e_s_min,e2e_s_max,decode_ceiling_tps,prefill_ceiling_tps,speedup,quality_ok,verdict\n",
          f);
    for (int i = 0; i < r->n_variants; i++) {
        const tsr_abl_variant *v = &r->variants[i];
        int has = !v->refused && v->bench.n_cases > 0;
        int n = has ? v->bench.n_cases : 1;
        for (int k = 0; k < n; k++) {
            const tsr_bench_case *c = has ? &v->bench.cases[k] : NULL;
            csv_str(f, v->name);
            fprintf(f, ",%s,", status_of(v));
            csv_str(f, c ? c->name : "");
            if (c) {
                fprintf(f, ",%d,%d", c->n_prompt, c->n_gen);
                const tsr_stat3 *st[] = {&c->decode_tps, &c->prefill_tps, &c->ttft_s, &c->e2e_s};
                for (int j = 0; j < 4; j++) csv_num(f, st[j]->med), csv_num(f, st[j]->min), csv_num(f, st[j]->max);
                csv_num(f, c->decode_ceiling_tps > 0 ? c->decode_ceiling_tps : NAN);
                csv_num(f, c->prefill_ceiling_tps > 0 ? c->prefill_ceiling_tps : NAN);
            } else
                fputs(",,,,,,,,,,,,,,,,", f);
            csv_num(f, v->speedup);
            fprintf(f, ",%d,", v->quality_ok);
            csv_str(f, v->refused ? v->reason : v->verdict);
            fputc('\n', f);
        }
    }
    return ferror(f) ? -1 : 0;
}

static void md_num(FILE *f, const char *fmt, double x) {
    if (isfinite(x)) fprintf(f, fmt, x);
    else fputs("n/a", f);
}

static void md_cell(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '|') fputs("\\|", f);
        else if (*s == '\n') fputc(' ', f);
        else fputc(*s, f);
    }
}

/* The device the measured variants ran on (their engines' figures), CPU if
 * none was measured. */
static int engine_device(const tsr_abl_result *r) {
    for (int i = 0; i < r->n_variants; i++)
        if (r->variants[i].bench.fig.known) return r->variants[i].bench.fig.device;
    return TSR_DEVICE_CPU;
}

int tsr_abl_write_md(const tsr_abl_result *r, FILE *f) {
    fprintf(f, "# Ablation of `%s` (%s)\n\n", r->assembly_name, r->assembly_path);
    fprintf(f, "- model: %s\n- workload: %s (version %d, %d warm-up, median of %d", r->model[0] ? r->model : "embedded stories260K",
            r->w ? r->w->name : "?", r->w ? r->w->version : 0, r->w ? r->w->warmup : 0, r->w ? r->w->repeats : 0);
    if (r->rounds > 1) /* the rounds' samples pooled */
        fprintf(f, " x %d rounds, every variant once a round, the order reversed every other round", r->rounds);
    fputs(")\n", f);
    fprintf(f, "- machine: %s, %d cores; read bandwidth ", r->dev.cpu_model, r->dev.n_cores);
    md_num(f, "%.2f GB/s", r->dev.read_gbs);
    fputs(", sgemm ", f);
    md_num(f, "%.1f GFLOP/s", r->dev.gemm_gflops);
    if (r->dev.have_gpu) {
        fprintf(f, "\n- GPU: %s; read bandwidth ", r->dev.gpu_name);
        md_num(f, "%.1f GB/s", r->dev.gpu_read_gbs);
        fputs(", bf16 matmul ", f);
        md_num(f, "%.1f TFLOP/s", r->dev.gpu_bf16_tflops);
    }
    fprintf(f, "\n- git commit: %s (the source tree); binary built from %s; created %s\n", r->commit, r->built_from,
            r->created);
    if (r->resumed) /* continued with --resume: when each was measured is in result.json */
        fprintf(f, "- resumed: %d of the %d variants were measured by an earlier run of this ablation that was "
                   "interrupted (each variant's `measured` time in result.json)\n",
                r->resumed, r->n_variants);
    fputs("\n", f);
    fprintf(f, "Speedup: geometric mean over cases of the all-baseline variant's median end-to-end time over this "
               "variant's. Ceiling share: measured over the bandwidth (decode) or matmul (prefill) ceiling of the "
               "%s, mean over cases.\n\n",
            engine_device(r) == TSR_DEVICE_CUDA ? "GPU (its read bandwidth, bf16 matmul)" : "host (read bandwidth, sgemm)");
    fputs("| variant | decode tok/s | prefill tok/s | TTFT ms | speedup | decode / ceiling | prefill / ceiling | "
          "drafts / pass | expert hits | quality | verdict |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
          f);
    for (int i = 0; i < r->n_variants; i++) {
        const tsr_abl_variant *v = &r->variants[i];
        fprintf(f, "| %s | ", v->name);
        if (v->refused || v->failed) {
            fputs("- | - | - | - | - | - | - | - | - | ", f);
            fputs(v->refused ? "refused: " : "failed: ", f);
            md_cell(f, v->reason);
            fputs(" |\n", f);
            continue;
        }
        md_num(f, "%.1f", v->decode_tps), fputs(" | ", f);
        md_num(f, "%.1f", v->prefill_tps), fputs(" | ", f);
        md_num(f, "%.2f", v->ttft_s * 1e3), fputs(" | ", f);
        md_num(f, "%.3fx", v->speedup), fputs(" | ", f);
        md_num(f, "%.1f%%", v->decode_ceiling_frac * 100), fputs(" | ", f);
        md_num(f, "%.1f%%", v->prefill_ceiling_frac * 100), fputs(" | ", f);
        double acc = 0, hit = 0;
        int nacc = 0, nhit = 0;
        for (int k = 0; k < v->bench.n_cases; k++) {
            const tsr_bench_case *c = &v->bench.cases[k];
            if (c->draft_accept_per_pass >= 0) acc += c->draft_accept_per_pass, nacc++;
            if (c->expert_hit_rate >= 0) hit += c->expert_hit_rate, nhit++;
        }
        if (nacc) fprintf(f, "%.2f", acc / nacc);
        else fputs("-", f);
        fputs(" | ", f);
        if (nhit) fprintf(f, "%.1f%%", 100 * hit / nhit);
        else fputs("-", f);
        fputs(" | ", f);
        if (v->quality_kind == 2) {
            md_num(f, "KL %.3g", v->mean_kl);
            md_num(f, ", ppl x%.4f", v->ppl_ratio);
        } else if (v->quality_kind == 3)
            fputs("not scored", f);
        else
            fputs(v->quality_kind == 1 ? (v->quality_ok ? "tokens identical" : "tokens differ") : "reference", f);
        fputs(" | ", f);
        md_cell(f, v->verdict);
        fputs(" |\n", f);
    }
    fputs("\n## Each plugin's share of the speedup\n\n", f);
    fputs("| plugin | slot | exactness | off | alone | Shapley |\n|---|---|---|---|---|---|\n", f);
    for (int i = 0; i < r->n_plugins; i++) {
        const tsr_abl_plugin *p = &r->plugins[i];
        fprintf(f, "| %s | %s (baseline %s) | %s%s | ", p->name, p->slot, p->baseline, p->exact ? "exact" : "lossy",
                p->exact_broken ? " — **BROKEN: its greedy tokens differ**" : "");
        md_num(f, "%+.3f", p->off), fputs(" | ", f);
        md_num(f, "%+.3f", p->alone), fputs(" | ", f);
        md_num(f, "%+.3f", p->shapley), fputs(" |\n", f);
    }
    fprintf(f, "\nShapley values: %s.", r->shapley_note);
    if (r->has_shapley) {
        md_num(f, " Their sum %+.4f", r->shapley_sum);
        md_num(f, " equals full minus baseline %+.4f.", r->full_minus_baseline);
    }
    fputs("\n\n![attributed speedup](speedup.svg)\n", f);
    return ferror(f) ? -1 : 0;
}

static void svg_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

int tsr_abl_write_svg(const tsr_abl_result *r, FILE *f) {
    const int row = 3 * 18 + 16, top = 50, left = 200, width = 420;
    int h = top + r->n_plugins * row + 40;
    double lim = 1e-9;
    for (int i = 0; i < r->n_plugins; i++) {
        double v[3] = {r->plugins[i].off, r->plugins[i].alone, r->plugins[i].shapley};
        for (int k = 0; k < 3; k++)
            if (isfinite(v[k]) && fabs(v[k]) > lim) lim = fabs(v[k]);
    }
    const int x0 = left + width / 2;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n", left + width + 80, h);
    fprintf(f, "<text x=\"10\" y=\"20\" font-size=\"14\">Attributed speedup of ");
    svg_text(f, r->assembly_name);
    fprintf(f, " (end-to-end, over all-baseline; scale &#177;%.3g)</text>\n", lim);
    const char *names[3] = {"off", "alone", "Shapley"}, *colors[3] = {"#8fb3d9", "#f2b872", "#5a9e6f"};
    for (int k = 0; k < 3; k++)
        fprintf(f, "<rect x=\"%d\" y=\"28\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%d\" y=\"37\">%s</text>\n",
                10 + k * 80, colors[k], 24 + k * 80, names[k]);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#333\"/>\n", x0, top - 4, x0, h - 30);
    for (int i = 0; i < r->n_plugins; i++) {
        const tsr_abl_plugin *p = &r->plugins[i];
        int y = top + i * row;
        fprintf(f, "<text x=\"10\" y=\"%d\">", y + 30);
        svg_text(f, p->name);
        fprintf(f, "</text>\n");
        double v[3] = {p->off, p->alone, p->shapley};
        for (int k = 0; k < 3; k++) {
            int yy = y + k * 18;
            if (!isfinite(v[k])) {
                fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#999\">%s: n/a</text>\n", x0 + 4, yy + 13, names[k]);
                continue;
            }
            double wpx = fabs(v[k]) / lim * (width / 2 - 10);
            double x = v[k] >= 0 ? x0 : x0 - wpx;
            fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"14\" fill=\"%s\"><title>%s %s %+.4f</title></rect>\n",
                    x, yy, wpx, colors[k], p->name, names[k], v[k]);
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"%s\">%+.3f</text>\n",
                    v[k] >= 0 ? x + wpx + 4 : x - 4, yy + 12, v[k] >= 0 ? "start" : "end", v[k]);
        }
    }
    fprintf(f, "<text x=\"10\" y=\"%d\" fill=\"#555\">", h - 10);
    svg_text(f, r->shapley_note);
    fprintf(f, "</text>\n</svg>\n");
    return ferror(f) ? -1 : 0;
}

int tsr_abl_write_result_json(const tsr_abl_result *r, const char *dir, tsr_error *err) {
    char p[1200], tmp[1220];
    json_t *j = tsr_abl_result_json(r);
    if (!j) return tsr_error_set(err, TSR_ERR_NOMEM, "result.json: out of memory");
    snprintf(p, sizeof p, "%s/result.json", dir);
    snprintf(tmp, sizeof tmp, "%s.partial", p); /* renamed over it: a kill leaves the old or the new */
    int rc = json_dump_file(j, tmp, JSON_INDENT(1) | JSON_REAL_PRECISION(17));
    json_decref(j);
    if (rc || rename(tmp, p)) return tsr_error_set(err, TSR_ERR_IO, "cannot write %s", p);
    return TSR_OK;
}

int tsr_abl_write_reports(const tsr_abl_result *r, const char *dir, tsr_error *err) {
    char p[1200];
    int rc = tsr_abl_write_result_json(r, dir, err);
    if (rc) return rc;
    int (*fns[3])(const tsr_abl_result *, FILE *) = {tsr_abl_write_csv, tsr_abl_write_md, tsr_abl_write_svg};
    const char *names[3] = {"result.csv", "report.md", "speedup.svg"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        FILE *f = fopen(p, "w");
        if (!f) return tsr_error_set(err, TSR_ERR_IO, "cannot write %s: %s", p, strerror(errno));
        int bad = fns[i](r, f);
        if (fclose(f) || bad) return tsr_error_set(err, TSR_ERR_IO, "cannot write %s", p);
    }
    return TSR_OK;
}
