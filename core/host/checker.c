#include "checker.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>

#include "halloc.h"
#include "sha256.h"

const char *tsr_dtype_short_name(uint32_t dtype) {
    static const char *const names[TSR_DTYPE_COUNT] = {"f32",  "f16",  "bf16", "f8_e4m3", "q8_0", "q4_0",
                                                       "q4_k", "q6_k", "i8",   "i32",     "i64"};
    return dtype < TSR_DTYPE_COUNT ? names[dtype] : "?";
}

int tsr_model_field(const tsr_model_config *c, const char *f, char *buf, size_t size) {
    int64_t v;
    if (!strcmp(f, "arch")) {
        snprintf(buf, size, "%s", c->arch_name);
        return 1;
    }
    if (!strcmp(f, "moe")) {
        snprintf(buf, size, "%s", c->n_experts > 0 ? "true" : "false");
        return 1;
    }
    if (!strcmp(f, "dtype")) {
        snprintf(buf, size, "%s", tsr_dtype_short_name(c->dtype));
        return 1;
    }
    if (!strcmp(f, "n_experts")) v = c->n_experts;
    else if (!strcmp(f, "n_experts_used")) v = c->n_experts_used;
    else if (!strcmp(f, "n_layers")) v = c->n_layers;
    else if (!strcmp(f, "hidden")) v = c->hidden;
    else if (!strcmp(f, "n_heads")) v = c->n_heads;
    else if (!strcmp(f, "n_kv_heads")) v = c->n_kv_heads;
    else if (!strcmp(f, "head_dim")) v = c->head_dim;
    else if (!strcmp(f, "vocab")) v = c->vocab;
    else if (!strcmp(f, "max_ctx")) v = c->max_ctx;
    else if (!strcmp(f, "ffn")) v = c->ffn;
    else if (!strcmp(f, "expert_ffn")) v = c->expert_ffn;
    else return 0;
    snprintf(buf, size, "%" PRId64, v);
    return 1;
}

void tsr_plan_provided(const tsr_plan_slot *s, const tsr_mcap *cap, int j, char *buf, size_t size) {
    const char *v = cap->values[j];
    if (v[0] == '$') {
        for (int i = 0; i < s->n_params; i++)
            if (!strcmp(s->params[i].name, v + 1)) {
                tsr_param_format(&s->params[i], buf, size);
                return;
            }
    }
    snprintf(buf, size, "%s", v);
}

int tsr_check_library(const tsr_manifest *m, tsr_diag *d) {
    int before = tsr_diag_count(d), line, col;
    const char *lib = m->library_path;
    tsr_manifest_pos(m, "library", &line, &col);
    struct stat st;
    if (stat(lib, &st) != 0) {
        tsr_diag_add(d, TSR_ERR_IO, m->path, line, col, "plugin %s: library %s: %s", m->name, lib, strerror(errno));
        return tsr_diag_count(d) - before;
    }
    if (!S_ISREG(st.st_mode)) {
        tsr_diag_add(d, TSR_ERR_REFUSED, m->path, line, col, "plugin %s: library %s is not a regular file", m->name, lib);
        return tsr_diag_count(d) - before;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        tsr_diag_add(d, TSR_ERR_REFUSED, m->path, line, col,
                     "plugin %s: library %s is writable by %s (refused; chmod go-w)", m->name, lib,
                     st.st_mode & S_IWOTH ? "others" : "group");
    char dir[1024];
    const char *slash = strrchr(lib, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - lib) : 1, slash ? lib : ".");
    if (!dir[0]) snprintf(dir, sizeof dir, "/");
    struct stat dst;
    if (stat(dir, &dst) != 0)
        tsr_diag_add(d, TSR_ERR_IO, m->path, line, col, "plugin %s: folder %s: %s", m->name, dir, strerror(errno));
    else if (dst.st_mode & (S_IWGRP | S_IWOTH))
        tsr_diag_add(d, TSR_ERR_REFUSED, m->path, line, col,
                     "plugin %s: the library's folder %s is writable by %s (refused; chmod go-w)", m->name,
                     dir, dst.st_mode & S_IWOTH ? "others" : "group");
    char hex[65];
    tsr_manifest_pos(m, "sha256", &line, &col);
    if (tsr_sha256_file(lib, hex) != 0)
        tsr_diag_add(d, TSR_ERR_IO, m->path, line, col, "plugin %s: cannot read %s: %s", m->name, lib, strerror(errno));
    else if (strcmp(hex, m->sha256))
        tsr_diag_add(d, TSR_ERR_REFUSED, m->path, line, col,
                     "plugin %s: sha256 mismatch: the manifest says %s, %s is %s", m->name, m->sha256, lib, hex);
    return tsr_diag_count(d) - before;
}

typedef struct cctx {
    const tsr_assembly *a;
    tsr_diag *d;
} cctx;

/* Where an error about slot s is reported: the slot's entry in the
 * assembly, or (baseline) the assembly itself. */
static void slot_pos(const tsr_assembly *a, int s, int *line, int *col) {
    if (a->slots[s].given) {
        *line = a->slots[s].line;
        *col = a->slots[s].col;
    } else {
        *line = a->line;
        *col = a->col;
    }
}

static void join(char *const *v, int n, char *buf, size_t size) {
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && o < size; i++) o += (size_t)snprintf(buf + o, size - o, "%s%s", i ? ", " : "", v[i]);
}

static void resolve_slot(cctx *c, const tsr_catalog *cat, const tsr_check_opts *o, tsr_plan *p, int s) {
    const tsr_assembly *a = c->a;
    int line, col;
    slot_pos(a, s, &line, &col);
    const char *sname = tsr_slot_name((tsr_slot)s);
    const char *dev = tsr_device_name(a->device);
    if (a->slots[s].given) {
        const tsr_manifest *m = tsr_catalog_find(cat, a->slots[s].plugin);
        if (!m) {
            tsr_diag_add(c->d, TSR_ERR_REFUSED, a->path, line, col, "slot %s: no plugin '%s' in the catalog %s",
                         sname, a->slots[s].plugin, cat->dir);
            return;
        }
        p->slots[s].m = m;
        p->slots[s].given = 1;
        if ((int)m->slot != s)
            tsr_diag_add(c->d, TSR_ERR_REFUSED, a->path, line, col, "slot %s: plugin %s fills slot %s (%s)",
                         sname, m->name, tsr_slot_name(m->slot), m->path);
        return;
    }
    const tsr_manifest *found = NULL;
    char names[512];
    size_t o_ = 0;
    int n = 0;
    names[0] = '\0';
    for (int i = 0; i < cat->n; i++) {
        const tsr_manifest *m = cat->items[i];
        if ((int)m->slot != s || !(m->baseline & (1u << a->device))) continue;
        if (m->test && !o->allow_test) continue;
        found = m;
        n++;
        if (o_ < sizeof names) o_ += (size_t)snprintf(names + o_, sizeof names - o_, "%s%s", n > 1 ? ", " : "", m->name);
    }
    if (n == 0)
        tsr_diag_add(c->d, TSR_ERR_REFUSED, a->path, line, col,
                     "slot %s is not named and the catalog %s has no baseline %s plugin for device %s", sname,
                     cat->dir, sname, dev);
    else if (n > 1)
        tsr_diag_add(c->d, TSR_ERR_REFUSED, a->path, line, col,
                     "slot %s is not named and the catalog has %d baselines for device %s (%s): name one",
                     sname, n, dev, names);
    else
        p->slots[s].m = found;
}

static void check_params(cctx *c, tsr_plan_slot *ps, const tsr_aslot *as, int s) {
    const tsr_manifest *m = ps->m;
    if (m->n_params) {
        ps->params = tsr_hcalloc((size_t)m->n_params, sizeof *ps->params);
        if (!ps->params) {
            tsr_diag_add(c->d, TSR_ERR_NOMEM, c->a->path, 0, 0, "out of memory");
            return;
        }
        ps->n_params = m->n_params;
        for (int i = 0; i < m->n_params; i++) ps->params[i] = m->params[i].def;
    }
    if (!as->given || !as->params) return;
    for (int i = 0; i < tsr_ynode_pairs(as->params); i++) {
        const tsr_ynode *k = tsr_ynode_key(as->params, i), *v = tsr_ynode_val(as->params, i);
        const tsr_mparam *mp = tsr_manifest_param(m, k->str);
        if (!mp) {
            char list[400];
            size_t o = 0;
            list[0] = '\0';
            for (int j = 0; j < m->n_params && o < sizeof list; j++)
                o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", j ? ", " : "", m->params[j].name);
            tsr_diag_add(c->d, TSR_ERR_INVALID, c->a->path, k->line, k->col,
                         "slot %s: unknown param '%s' for plugin %s (declared: %s)", tsr_slot_name((tsr_slot)s),
                         k->str, m->name, m->n_params ? list : "none");
            continue;
        }
        char msg[700];
        tsr_param val;
        if (tsr_mparam_check(mp, v, &val, msg, sizeof msg)) {
            tsr_diag_add(c->d, TSR_ERR_INVALID, c->a->path, v->line, v->col, "slot %s: plugin %s: %s",
                         tsr_slot_name((tsr_slot)s), m->name, msg);
            continue;
        }
        ps->params[mp - m->params] = val;
    }
}

static int value_in(const char *v, char *const *set, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(v, set[i])) return 1;
    return 0;
}

static void check_requires(cctx *c, const tsr_check_opts *o, tsr_plan *p, int s) {
    const tsr_manifest *m = p->slots[s].m;
    int line, col;
    slot_pos(c->a, s, &line, &col);
    for (int i = 0; i < m->n_requires; i++) {
        const tsr_mcap *r = &m->requires[i];
        char want[512], have[512];
        join(r->values, r->n_values, want, sizeof want);
        if (!strcmp(r->key, "device")) {
            if (!value_in(tsr_device_name(p->device), r->values, r->n_values))
                tsr_diag_add(c->d, TSR_ERR_REFUSED, c->a->path, line, col,
                             "plugin %s requires device in [%s], the assembly's device is %s (%s:%d:%d)", m->name,
                             want, tsr_device_name(p->device), m->path, r->line, r->col);
            continue;
        }
        if (!strncmp(r->key, "model.", 6)) {
            if (!o->model) {
                tsr_diag_note(c->d, "not checked: no model: plugin %s requires %s in [%s]", m->name, r->key, want);
                continue;
            }
            if (!tsr_model_field(o->model, r->key + 6, have, sizeof have)) continue;
            if (!value_in(have, r->values, r->n_values))
                tsr_diag_add(c->d, TSR_ERR_REFUSED, c->a->path, line, col,
                             "plugin %s requires %s in [%s], the model has %s (%s:%d:%d)", m->name, r->key, want,
                             have, m->path, r->line, r->col);
            continue;
        }
        const char *dot = strchr(r->key, '.');
        char sname[32];
        snprintf(sname, sizeof sname, "%.*s", (int)(dot - r->key) < 31 ? (int)(dot - r->key) : 31, r->key);
        int t = tsr_slot_from_name(sname);
        if (t < 0 || !p->slots[t].m) continue; /* reported already */
        const tsr_plan_slot *ts = &p->slots[t];
        const tsr_mcap *cap = tsr_manifest_provides(ts->m, dot + 1);
        if (!cap) {
            tsr_diag_add(c->d, TSR_ERR_REFUSED, c->a->path, line, col,
                         "plugin %s requires %s in [%s], but %s plugin %s provides no '%s' (%s:%d:%d)", m->name,
                         r->key, want, sname, ts->m->name, dot + 1, m->path, r->line, r->col);
            continue;
        }
        int ok = 0;
        size_t off = 0;
        have[0] = '\0';
        for (int j = 0; j < cap->n_values; j++) {
            char v[256];
            tsr_plan_provided(ts, cap, j, v, sizeof v);
            ok |= value_in(v, r->values, r->n_values);
            if (off < sizeof have) off += (size_t)snprintf(have + off, sizeof have - off, "%s%s", j ? ", " : "", v);
        }
        if (!ok)
            tsr_diag_add(c->d, TSR_ERR_REFUSED, c->a->path, line, col,
                         "plugin %s requires %s in [%s], but %s plugin %s provides %s = [%s] (%s:%d:%d)", m->name,
                         r->key, want, sname, ts->m->name, dot + 1, have, m->path, r->line, r->col);
    }
}

/* runtime.cuda_graphs: every plugin on the forward pass (gemv, attention,
 * kv_cache) provides cuda_graph: true. */
static void check_graphs(cctx *c, const tsr_plan *p, const tsr_rt_value *v) {
    const int slots[] = {TSR_SLOT_GEMV, TSR_SLOT_ATTENTION, TSR_SLOT_KV_CACHE};
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++) {
        const tsr_manifest *m = p->slots[slots[i]].m;
        if (!m) continue;
        const tsr_mcap *g = tsr_manifest_provides(m, "cuda_graph");
        if (!g || g->n_values != 1 || strcmp(g->values[0], "true"))
            tsr_diag_add(c->d, TSR_ERR_REFUSED, c->a->path, v->line, v->col,
                         "runtime.cuda_graphs: plugin %s (slot %s) does not provide cuda_graph: true, so "
                         "its calls cannot be replayed (%s)",
                         m->name, tsr_slot_name((tsr_slot)slots[i]), m->path);
    }
}

/* runtime.pipeline: a drafter that proposes nothing (provides max_draft:
 * 0), since the next pass is queued before the token it follows is known
 * to the host. */
static void check_pipeline(cctx *c, const tsr_plan *p, const tsr_rt_value *v) {
    const tsr_plan_slot *ds = &p->slots[TSR_SLOT_DRAFTER];
    if (!ds->m) return;
    const tsr_mcap *cap = tsr_manifest_provides(ds->m, "max_draft");
    char val[64] = "nothing";
    if (cap && cap->n_values == 1) tsr_plan_provided(ds, cap, 0, val, sizeof val);
    if (strcmp(val, "0"))
        tsr_diag_add(c->d, TSR_ERR_REFUSED, c->a->path, v->line, v->col,
                     "runtime.pipeline queues each decode pass before the token it follows is read, so it "
                     "needs a drafter that proposes nothing (max_draft: 0); plugin %s provides max_draft = %s (%s)",
                     ds->m->name, val, ds->m->path);
}

/* What each runtime switch needs (assembly.h): every one so far device
 * cuda (why: said after the device's name), then its own check, if any:
 * on any device where it asks nothing of the device (any_device), else
 * only on cuda (the plugins' cuda_graph of a CPU assembly say nothing new). */
static const struct {
    const char *why;
    void (*check)(cctx *c, const tsr_plan *p, const tsr_rt_value *v);
    int any_device;
} rt_needs[TSR_RT_COUNT] = {
    [TSR_RT_CUDA_GRAPHS] = {"", check_graphs, 0},
    [TSR_RT_PDL] = {" (launch attributes of CUDA kernels)", NULL, 0},
    [TSR_RT_PIPELINE] = {" (its passes end before the call returns: nothing can be queued ahead)", check_pipeline,
                         1},
};

static void check_runtime(cctx *c, const tsr_plan *p) {
    const tsr_assembly *a = c->a;
    for (int s = 0; s < TSR_RT_COUNT; s++) {
        const tsr_rt_value *v = &a->runtime[s];
        if (!v->on) continue;
        const int cuda = a->device == TSR_DEVICE_CUDA;
        if (!cuda)
            tsr_diag_add(c->d, TSR_ERR_REFUSED, a->path, v->line, v->col,
                         "runtime.%s needs device cuda, the assembly's device is %s%s",
                         tsr_rt_switch_name((tsr_rt_switch)s), tsr_device_name(a->device), rt_needs[s].why);
        if (rt_needs[s].check && (cuda || rt_needs[s].any_device)) rt_needs[s].check(c, p, v);
    }
}

int tsr_check(const tsr_catalog *cat, const tsr_assembly *a, const tsr_check_opts *opts, tsr_plan **out,
              tsr_diag *d) {
    *out = NULL;
    tsr_check_opts none = {0};
    if (!opts) opts = &none;
    int before = tsr_diag_count(d);
    tsr_plan *p = tsr_hcalloc(1, sizeof *p);
    if (!p) return tsr_diag_add(d, TSR_ERR_NOMEM, a->path, 0, 0, "out of memory");
    p->catalog = cat;
    p->assembly = a;
    p->device = a->device;
    cctx c = {.a = a, .d = d};
    for (int s = 0; s < TSR_SLOT_COUNT; s++) resolve_slot(&c, cat, opts, p, s);
    for (int s = 0; s < TSR_SLOT_COUNT; s++) {
        const tsr_manifest *m = p->slots[s].m;
        if (!m) continue;
        int line, col;
        slot_pos(a, s, &line, &col);
        if ((int)m->slot != s) continue;
        if (m->test && !opts->allow_test)
            tsr_diag_add(d, TSR_ERR_REFUSED, a->path, line, col,
                         "slot %s: %s is a test plugin (only tests may assemble test plugins)",
                         tsr_slot_name((tsr_slot)s), m->name);
        if (!(m->devices & (1u << a->device))) {
            char devs[32];
            tsr_devmask_format(m->devices, devs, sizeof devs);
            tsr_diag_add(d, TSR_ERR_REFUSED, a->path, line, col,
                         "slot %s: plugin %s runs on [%s], not on the assembly's device %s",
                         tsr_slot_name((tsr_slot)s), m->name, devs, tsr_device_name(a->device));
        }
        check_params(&c, &p->slots[s], &a->slots[s], s);
    }
    check_runtime(&c, p);
    /* params first: provides may name them ($param) */
    for (int s = 0; s < TSR_SLOT_COUNT; s++)
        if (p->slots[s].m && (int)p->slots[s].m->slot == s) check_requires(&c, opts, p, s);
    if (!opts->skip_files)
        for (int s = 0; s < TSR_SLOT_COUNT; s++) {
            const tsr_manifest *m = p->slots[s].m;
            int dup = 0;
            for (int t = 0; t < s; t++) dup |= p->slots[t].m == m;
            if (m && !dup) tsr_check_library(m, d);
        }
    if (tsr_diag_count(d) > before) {
        int rc = d->n_errors > before ? d->errors[before].code : TSR_ERR_REFUSED;
        tsr_plan_free(p);
        return rc;
    }
    *out = p;
    return TSR_OK;
}

void tsr_plan_free(tsr_plan *p) {
    if (!p) return;
    for (int s = 0; s < TSR_SLOT_COUNT; s++) tsr_hfree(p->slots[s].params);
    tsr_hfree(p);
}
