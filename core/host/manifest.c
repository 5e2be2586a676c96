#include "manifest.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "halloc.h"

/* --- names ------------------------------------------------------------------ */

static const char *const slot_names[TSR_SLOT_COUNT] = {"attention", "kv_cache", "drafter",
                                                       "expert_cache", "gemv"};

const char *tsr_slot_name(tsr_slot s) {
    return (unsigned)s < TSR_SLOT_COUNT ? slot_names[s] : "?";
}

int tsr_slot_from_name(const char *s) {
    for (int i = 0; i < TSR_SLOT_COUNT; i++)
        if (!strcmp(slot_names[i], s)) return i;
    return -1;
}

const char *tsr_device_name(int dev) {
    return dev == TSR_DEVICE_CPU ? "cpu" : dev == TSR_DEVICE_CUDA ? "cuda" : "?";
}

int tsr_device_from_name(const char *s) {
    if (!strcmp(s, "cpu")) return TSR_DEVICE_CPU;
    if (!strcmp(s, "cuda")) return TSR_DEVICE_CUDA;
    return -1;
}

void tsr_devmask_format(unsigned mask, char *buf, size_t size) {
    snprintf(buf, size, "%s%s%s", mask & TSR_DEVMASK_CPU ? "cpu" : "",
             (mask & TSR_DEVMASK_CPU) && (mask & TSR_DEVMASK_CUDA) ? ", " : "",
             mask & TSR_DEVMASK_CUDA ? "cuda" : "");
}

void tsr_param_format(const tsr_param *p, char *buf, size_t size) {
    switch (p->type) {
    case TSR_PARAM_INT: snprintf(buf, size, "%" PRId64, p->v.i); break;
    case TSR_PARAM_FLOAT: snprintf(buf, size, "%.17g", p->v.f); break;
    case TSR_PARAM_BOOL: snprintf(buf, size, "%s", p->v.b ? "true" : "false"); break;
    case TSR_PARAM_STRING: snprintf(buf, size, "%s", p->v.s ? p->v.s : ""); break;
    }
}

/* Model fields a manifest may require (model.FIELD). */
static const char *const model_fields[] = {"arch",  "moe",        "n_experts", "n_experts_used",
                                           "n_layers", "hidden",  "n_heads",   "n_kv_heads",
                                           "head_dim", "vocab",   "max_ctx",   "dtype",
                                           "ffn",   "expert_ffn", NULL};

/* --- reading ---------------------------------------------------------------- */

typedef struct mctx {
    const char *file;
    tsr_diag *d;
    int rc;
    int nomem; /* a partial manifest: skip the cross-checks */
} mctx;

__attribute__((format(printf, 4, 5))) static void merr(mctx *c, const tsr_ynode *at, int code,
                                                       const char *fmt, ...) {
    char buf[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    tsr_diag_add(c->d, code, c->file, at ? at->line : 0, at ? at->col : 0, "%s", buf);
    if (!c->rc) c->rc = code;
}

static void mnomem(mctx *c) {
    c->nomem = 1;
    merr(c, NULL, TSR_ERR_NOMEM, "out of memory");
}

static int is_ident(const char *s, size_t max) {
    size_t n = strlen(s);
    if (n == 0 || n > max) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_')) return 0;
    return 1;
}

/* "N.N.N" (count parts), each a run of digits without leading zeros. */
static int is_dotted(const char *s, int parts, int *vals) {
    for (int i = 0; i < parts; i++) {
        if (!(*s >= '0' && *s <= '9')) return 0;
        if (*s == '0' && s[1] >= '0' && s[1] <= '9') return 0;
        long v = 0;
        while (*s >= '0' && *s <= '9') {
            v = v * 10 + (*s - '0');
            if (v > 1000000) return 0;
            s++;
        }
        if (vals) vals[i] = (int)v;
        if (i + 1 < parts) {
            if (*s != '.') return 0;
            s++;
        }
    }
    return *s == '\0';
}

static char *get_str(mctx *c, const tsr_ynode *v, const char *what) {
    const char *s;
    if (!tsr_ynode_as_str(v, &s)) {
        merr(c, v, TSR_ERR_FORMAT, "%s must be a string, not a %s", what, tsr_ynode_kind_name(v));
        return NULL;
    }
    char *r = tsr_hstrdup(s);
    if (!r) mnomem(c);
    return r;
}

static int get_bool(mctx *c, const tsr_ynode *v, const char *what, int *out) {
    if (!tsr_ynode_as_bool(v, out)) {
        merr(c, v, TSR_ERR_FORMAT, "%s must be true or false, not a %s", what, tsr_ynode_kind_name(v));
        return -1;
    }
    return 0;
}

/* A device list: [cpu, cuda] (a single scalar is accepted too). */
static int get_devices(mctx *c, const tsr_ynode *v, const char *what, unsigned *out) {
    *out = 0;
    if (v->kind == TSR_YNODE_MAP) {
        merr(c, v, TSR_ERR_FORMAT, "%s must be a list of devices (cpu, cuda)", what);
        return -1;
    }
    int n = v->kind == TSR_YNODE_SEQ ? v->n : 1;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        const tsr_ynode *it = v->kind == TSR_YNODE_SEQ ? v->items[i] : v;
        const char *s;
        int dev;
        if (!tsr_ynode_as_str(it, &s) || (dev = tsr_device_from_name(s)) < 0) {
            merr(c, it, TSR_ERR_FORMAT, "%s: unknown device '%s' (cpu or cuda)", what,
                 it->kind == TSR_YNODE_SCALAR ? it->str : tsr_ynode_kind_name(it));
            bad = 1;
            continue;
        }
        if (*out & (1u << dev)) {
            merr(c, it, TSR_ERR_FORMAT, "%s: device '%s' listed twice", what, s);
            bad = 1;
        }
        *out |= 1u << dev;
    }
    return bad ? -1 : 0;
}

/* Normalised text of a capability scalar: strings as written, ints in
 * decimal, bools as true/false. Floats and nulls are refused. */
static char *cap_scalar(mctx *c, const tsr_ynode *v, const char *what) {
    int b;
    int64_t i;
    char buf[32];
    if (v->kind != TSR_YNODE_SCALAR) {
        merr(c, v, TSR_ERR_FORMAT, "%s: values must be scalars (string, integer or bool), not a %s",
             what, tsr_ynode_kind_name(v));
        return NULL;
    }
    const char *text = v->str;
    if (!v->quoted) {
        if (tsr_ynode_is_null(v)) {
            merr(c, v, TSR_ERR_FORMAT, "%s: value is empty", what);
            return NULL;
        }
        if (tsr_ynode_as_bool(v, &b)) {
            text = b ? "true" : "false";
        } else if (tsr_ynode_as_int(v, &i)) {
            snprintf(buf, sizeof buf, "%" PRId64, i);
            text = buf;
        } else {
            double f;
            if (tsr_ynode_as_float(v, &f)) {
                merr(c, v, TSR_ERR_FORMAT, "%s: floats are not capability values (quote it)", what);
                return NULL;
            }
        }
    }
    char *r = tsr_hstrdup(text);
    if (!r) mnomem(c);
    return r;
}

static void cap_free(tsr_mcap *cap) {
    tsr_hfree(cap->key);
    for (int i = 0; i < cap->n_values; i++) tsr_hfree(cap->values[i]);
    tsr_hfree(cap->values);
}

/* A map of key -> scalar or list of scalars. */
static int get_caps(mctx *c, const tsr_ynode *v, const char *what, tsr_mcap **out, int *n_out) {
    *out = NULL;
    *n_out = 0;
    if (v->kind != TSR_YNODE_MAP) {
        if (tsr_ynode_is_null(v)) return 0;
        merr(c, v, TSR_ERR_FORMAT, "%s must be a mapping", what);
        return -1;
    }
    int n = tsr_ynode_pairs(v);
    if (n == 0) return 0;
    tsr_mcap *caps = tsr_hcalloc((size_t)n, sizeof *caps);
    if (!caps) {
        mnomem(c);
        return -1;
    }
    *out = caps;
    for (int i = 0; i < n; i++) {
        const tsr_ynode *k = tsr_ynode_key(v, i), *val = tsr_ynode_val(v, i);
        tsr_mcap *cap = &caps[(*n_out)++];
        cap->line = k->line;
        cap->col = k->col;
        cap->key = tsr_hstrdup(k->str);
        if (!cap->key) {
            mnomem(c);
            return -1;
        }
        int nv = val->kind == TSR_YNODE_SEQ ? val->n : 1;
        if (nv == 0) {
            merr(c, val, TSR_ERR_FORMAT, "%s.%s: empty list", what, k->str);
            continue;
        }
        cap->values = tsr_hcalloc((size_t)nv, sizeof *cap->values);
        if (!cap->values) {
            mnomem(c);
            return -1;
        }
        char label[200];
        snprintf(label, sizeof label, "%s.%s", what, k->str);
        for (int j = 0; j < nv; j++) {
            const tsr_ynode *it = val->kind == TSR_YNODE_SEQ ? val->items[j] : val;
            char *s = cap_scalar(c, it, label);
            if (s) cap->values[cap->n_values++] = s;
        }
    }
    return 0;
}

static void param_free(tsr_mparam *p) {
    tsr_hfree(p->name);
    if (p->type == TSR_PARAM_STRING) tsr_hfree((char *)p->def.v.s);
    for (int i = 0; i < p->n_values; i++) tsr_hfree(p->values[i]);
    tsr_hfree(p->values);
    tsr_hfree(p->description);
}

int tsr_mparam_check(const tsr_mparam *p, const tsr_ynode *v, tsr_param *out, char *msg, size_t size) {
    memset(out, 0, sizeof *out);
    out->name = p->name;
    out->type = p->type;
    switch (p->type) {
    case TSR_PARAM_INT: {
        int64_t i;
        if (!tsr_ynode_as_int(v, &i)) {
            snprintf(msg, size, "param '%s' must be an integer, not a %s", p->name, tsr_ynode_kind_name(v));
            return TSR_ERR_INVALID;
        }
        if ((p->has_min && (double)i < p->min) || (p->has_max && (double)i > p->max)) {
            snprintf(msg, size, "param '%s' = %" PRId64 " is out of range [%.17g, %.17g]", p->name, i,
                     p->has_min ? p->min : -INFINITY, p->has_max ? p->max : INFINITY);
            return TSR_ERR_INVALID;
        }
        out->v.i = i;
        return TSR_OK;
    }
    case TSR_PARAM_FLOAT: {
        double f;
        if (!tsr_ynode_as_float(v, &f)) {
            snprintf(msg, size, "param '%s' must be a finite number, not a %s", p->name,
                     tsr_ynode_kind_name(v));
            return TSR_ERR_INVALID;
        }
        if ((p->has_min && f < p->min) || (p->has_max && f > p->max)) {
            snprintf(msg, size, "param '%s' = %.17g is out of range [%.17g, %.17g]", p->name, f,
                     p->has_min ? p->min : -INFINITY, p->has_max ? p->max : INFINITY);
            return TSR_ERR_INVALID;
        }
        out->v.f = f;
        return TSR_OK;
    }
    case TSR_PARAM_BOOL: {
        int b;
        if (!tsr_ynode_as_bool(v, &b)) {
            snprintf(msg, size, "param '%s' must be true or false, not a %s", p->name,
                     tsr_ynode_kind_name(v));
            return TSR_ERR_INVALID;
        }
        out->v.b = b;
        return TSR_OK;
    }
    case TSR_PARAM_STRING: {
        const char *s;
        if (!tsr_ynode_as_str(v, &s)) {
            snprintf(msg, size, "param '%s' must be a string, not a %s", p->name, tsr_ynode_kind_name(v));
            return TSR_ERR_INVALID;
        }
        if (p->n_values) {
            int ok = 0;
            for (int i = 0; i < p->n_values; i++) ok |= !strcmp(p->values[i], s);
            if (!ok) {
                char list[400];
                size_t o = 0;
                list[0] = '\0';
                for (int i = 0; i < p->n_values && o < sizeof list; i++)
                    o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "", p->values[i]);
                snprintf(msg, size, "param '%s' = '%s' is not one of [%s]", p->name, s, list);
                return TSR_ERR_INVALID;
            }
        }
        out->v.s = s;
        return TSR_OK;
    }
    }
    snprintf(msg, size, "param '%s' has no type", p->name);
    return TSR_ERR_INVALID;
}

static void get_param(mctx *c, const tsr_ynode *k, const tsr_ynode *v, tsr_mparam *p) {
    p->line = k->line;
    p->col = k->col;
    p->name = tsr_hstrdup(k->str);
    if (!p->name) return mnomem(c);
    if (!is_ident(k->str, 63))
        merr(c, k, TSR_ERR_FORMAT, "param name '%s' must match [a-z0-9_]{1,63}", k->str);
    if (v->kind != TSR_YNODE_MAP) {
        merr(c, v, TSR_ERR_FORMAT, "params.%s must be a mapping {type, default, ...}", k->str);
        return;
    }
    const tsr_ynode *type = tsr_ynode_get(v, "type");
    const tsr_ynode *def = tsr_ynode_get(v, "default");
    const char *ts;
    if (!type) {
        merr(c, v, TSR_ERR_FORMAT, "params.%s: missing 'type' (int, float, bool or string)", k->str);
        return;
    }
    if (!tsr_ynode_as_str(type, &ts) ||
        (strcmp(ts, "int") && strcmp(ts, "float") && strcmp(ts, "bool") && strcmp(ts, "string"))) {
        merr(c, type, TSR_ERR_FORMAT, "params.%s: unknown type '%s' (int, float, bool or string)",
             k->str, type->kind == TSR_YNODE_SCALAR ? type->str : tsr_ynode_kind_name(type));
        return;
    }
    p->type = !strcmp(ts, "int")     ? TSR_PARAM_INT
              : !strcmp(ts, "float") ? TSR_PARAM_FLOAT
              : !strcmp(ts, "bool")  ? TSR_PARAM_BOOL
                                     : TSR_PARAM_STRING;
    for (int i = 0; i < tsr_ynode_pairs(v); i++) {
        const tsr_ynode *kk = tsr_ynode_key(v, i), *vv = tsr_ynode_val(v, i);
        const char *key = kk->str;
        if (!strcmp(key, "type") || !strcmp(key, "default")) continue;
        if (!strcmp(key, "min") || !strcmp(key, "max")) {
            double f;
            int64_t iv;
            if (p->type != TSR_PARAM_INT && p->type != TSR_PARAM_FLOAT) {
                merr(c, kk, TSR_ERR_FORMAT, "params.%s: '%s' is only for int and float params", k->str, key);
                continue;
            }
            if (p->type == TSR_PARAM_INT ? !tsr_ynode_as_int(vv, &iv) : !tsr_ynode_as_float(vv, &f)) {
                merr(c, vv, TSR_ERR_FORMAT, "params.%s.%s must be %s, not a %s", k->str, key,
                     p->type == TSR_PARAM_INT ? "an integer" : "a number", tsr_ynode_kind_name(vv));
                continue;
            }
            if (p->type == TSR_PARAM_INT) f = (double)iv;
            if (key[1] == 'i') p->has_min = 1, p->min = f;
            else p->has_max = 1, p->max = f;
        } else if (!strcmp(key, "values")) {
            if (p->type != TSR_PARAM_STRING) {
                merr(c, kk, TSR_ERR_FORMAT, "params.%s: 'values' is only for string params", k->str);
                continue;
            }
            if (vv->kind != TSR_YNODE_SEQ || vv->n == 0) {
                merr(c, vv, TSR_ERR_FORMAT, "params.%s.values must be a non-empty list of strings", k->str);
                continue;
            }
            p->values = tsr_hcalloc((size_t)vv->n, sizeof *p->values);
            if (!p->values) return mnomem(c);
            for (int j = 0; j < vv->n; j++) {
                char *s = get_str(c, vv->items[j], "params value");
                if (s) p->values[p->n_values++] = s;
            }
        } else if (!strcmp(key, "description")) {
            tsr_hfree(p->description);
            p->description = get_str(c, vv, "description");
        } else {
            merr(c, kk, TSR_ERR_FORMAT,
                 "params.%s: unknown key '%s' (type, default, min, max, values, description)", k->str, key);
        }
    }
    if (p->has_min && p->has_max && p->min > p->max)
        merr(c, v, TSR_ERR_FORMAT, "params.%s: min %.17g is above max %.17g", k->str, p->min, p->max);
    if (!def) {
        merr(c, v, TSR_ERR_FORMAT, "params.%s: missing 'default'", k->str);
        return;
    }
    char msg[600];
    tsr_param val;
    if (tsr_mparam_check(p, def, &val, msg, sizeof msg)) {
        merr(c, def, TSR_ERR_FORMAT, "default: %s", msg);
        return;
    }
    p->def = val;
    p->def.name = p->name;
    if (p->type == TSR_PARAM_STRING) {
        p->def.v.s = tsr_hstrdup(val.v.s);
        if (!p->def.v.s) mnomem(c);
    }
}

static void get_params(mctx *c, const tsr_ynode *v, tsr_manifest *m) {
    if (v->kind != TSR_YNODE_MAP) {
        if (!tsr_ynode_is_null(v)) merr(c, v, TSR_ERR_FORMAT, "params must be a mapping of name -> {type, default, ...}");
        return;
    }
    int n = tsr_ynode_pairs(v);
    if (!n) return;
    m->params = tsr_hcalloc((size_t)n, sizeof *m->params);
    if (!m->params) return mnomem(c);
    for (int i = 0; i < n; i++) get_param(c, tsr_ynode_key(v, i), tsr_ynode_val(v, i), &m->params[m->n_params++]);
}

static void get_exports(mctx *c, const tsr_ynode *v, tsr_manifest *m) {
    if (v->kind != TSR_YNODE_SEQ) {
        if (!tsr_ynode_is_null(v)) merr(c, v, TSR_ERR_FORMAT, "exports must be a list of {name, signature}");
        return;
    }
    if (!v->n) return;
    m->exports = tsr_hcalloc((size_t)v->n, sizeof *m->exports);
    if (!m->exports) return mnomem(c);
    for (int i = 0; i < v->n; i++) {
        const tsr_ynode *it = v->items[i];
        tsr_mexport *e = &m->exports[m->n_exports++];
        e->line = it->line;
        e->col = it->col;
        if (it->kind != TSR_YNODE_MAP) {
            merr(c, it, TSR_ERR_FORMAT, "exports[%d] must be a mapping {name, signature}", i);
            continue;
        }
        for (int j = 0; j < tsr_ynode_pairs(it); j++) {
            const tsr_ynode *kk = tsr_ynode_key(it, j), *vv = tsr_ynode_val(it, j);
            if (!strcmp(kk->str, "name")) {
                e->name = get_str(c, vv, "exports name");
                if (e->name && (!is_ident(e->name, 127) && !(e->name[0] >= 'A' && e->name[0] <= 'Z'))) {
                    const char *q = e->name;
                    int ok = (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || *q == '_';
                    for (; *q && ok; q++)
                        ok = (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') || *q == '_';
                    if (!ok) merr(c, vv, TSR_ERR_FORMAT, "exports name '%s' is not a C identifier", e->name);
                }
            } else if (!strcmp(kk->str, "signature")) {
                e->signature = get_str(c, vv, "exports signature");
                if (e->signature) {
                    tsr_error err;
                    int off = 0;
                    tsr_error_clear(&err);
                    if (tsr_ffi_sig_parse(e->signature, &e->sig, &off, &err)) {
                        /* point at the bad type when the scalar sits on one line */
                        int col = vv->col + off + (vv->quoted ? 1 : 0);
                        tsr_diag_add(c->d, TSR_ERR_FORMAT, c->file, vv->line, col, "%s", err.msg);
                        if (!c->rc) c->rc = TSR_ERR_FORMAT;
                    }
                }
            } else {
                merr(c, kk, TSR_ERR_FORMAT, "exports[%d]: unknown key '%s' (name, signature)", i, kk->str);
            }
        }
        if (!e->name) merr(c, it, TSR_ERR_FORMAT, "exports[%d]: missing 'name'", i);
        if (!e->signature) merr(c, it, TSR_ERR_FORMAT, "exports[%d]: missing 'signature'", i);
        for (int j = 0; e->name && j + 1 < m->n_exports; j++)
            if (m->exports[j].name && !strcmp(m->exports[j].name, e->name))
                merr(c, it, TSR_ERR_FORMAT, "export '%s' listed twice", e->name);
    }
}

static void get_quality(mctx *c, const tsr_ynode *v, tsr_manifest *m) {
    if (v->kind != TSR_YNODE_MAP) {
        merr(c, v, TSR_ERR_FORMAT, "quality must be a mapping {max_mean_kl, max_ppl_ratio}");
        return;
    }
    int have_kl = 0, have_ppl = 0;
    for (int i = 0; i < tsr_ynode_pairs(v); i++) {
        const tsr_ynode *kk = tsr_ynode_key(v, i), *vv = tsr_ynode_val(v, i);
        double f;
        int kl = !strcmp(kk->str, "max_mean_kl"), ppl = !strcmp(kk->str, "max_ppl_ratio");
        if (!kl && !ppl) {
            merr(c, kk, TSR_ERR_FORMAT, "quality: unknown key '%s' (max_mean_kl, max_ppl_ratio)", kk->str);
            continue;
        }
        if (!tsr_ynode_as_float(vv, &f) || f < 0 || (ppl && f < 1.0)) {
            merr(c, vv, TSR_ERR_FORMAT, "quality.%s must be a number %s", kk->str, ppl ? ">= 1" : ">= 0");
            continue;
        }
        if (kl) m->max_mean_kl = f, have_kl = 1;
        else m->max_ppl_ratio = f, have_ppl = 1;
    }
    if (!have_kl) merr(c, v, TSR_ERR_FORMAT, "quality: missing 'max_mean_kl'");
    if (!have_ppl) merr(c, v, TSR_ERR_FORMAT, "quality: missing 'max_ppl_ratio'");
    m->has_quality = 1;
}

static int is_model_field(const char *f) {
    for (int i = 0; model_fields[i]; i++)
        if (!strcmp(model_fields[i], f)) return 1;
    return 0;
}

static void check_requires(mctx *c, tsr_manifest *m) {
    for (int i = 0; i < m->n_requires; i++) {
        tsr_mcap *r = &m->requires[i];
        const tsr_ynode at = {.line = r->line, .col = r->col};
        const char *dot = strchr(r->key, '.');
        if (!strcmp(r->key, "device")) {
            for (int j = 0; j < r->n_values; j++)
                if (tsr_device_from_name(r->values[j]) < 0)
                    merr(c, &at, TSR_ERR_FORMAT, "requires.device: unknown device '%s'", r->values[j]);
        } else if (!dot) {
            merr(c, &at, TSR_ERR_FORMAT,
                 "requires key '%s' must be SLOT.CAPABILITY, model.FIELD or device", r->key);
        } else if (!strncmp(r->key, "model.", 6)) {
            if (!is_model_field(dot + 1))
                merr(c, &at, TSR_ERR_FORMAT, "requires: unknown model field '%s'", dot + 1);
        } else {
            char slot[32];
            snprintf(slot, sizeof slot, "%.*s", (int)(dot - r->key) < 31 ? (int)(dot - r->key) : 31, r->key);
            if (tsr_slot_from_name(slot) < 0)
                merr(c, &at, TSR_ERR_FORMAT, "requires: unknown slot '%s' in '%s'", slot, r->key);
            else if (!is_ident(dot + 1, 63))
                merr(c, &at, TSR_ERR_FORMAT, "requires: bad capability name in '%s'", r->key);
        }
        for (int j = 0; j < r->n_values; j++)
            if (r->values[j][0] == '$')
                merr(c, &at, TSR_ERR_FORMAT, "requires.%s: '$' references are only for provides", r->key);
    }
}

static void check_provides(mctx *c, tsr_manifest *m) {
    for (int i = 0; i < m->n_provides; i++) {
        tsr_mcap *p = &m->provides[i];
        const tsr_ynode at = {.line = p->line, .col = p->col};
        if (!is_ident(p->key, 63))
            merr(c, &at, TSR_ERR_FORMAT, "provides: capability name '%s' must match [a-z0-9_]{1,63}", p->key);
        for (int j = 0; j < p->n_values; j++) {
            const char *v = p->values[j];
            if (v[0] != '$') continue;
            const tsr_mparam *par = tsr_manifest_param(m, v + 1);
            if (!par)
                merr(c, &at, TSR_ERR_FORMAT, "provides.%s: '%s' names no declared param", p->key, v);
            else if (par->type == TSR_PARAM_FLOAT)
                merr(c, &at, TSR_ERR_FORMAT, "provides.%s: '%s' is a float param (not a capability value)", p->key, v);
        }
    }
}

static const char *const top_keys[] = {"name",      "slot",     "version",  "abi",         "library",
                                       "sha256",    "devices",  "exactness", "quality",    "baseline",
                                       "test",      "description", "provides", "requires", "params",
                                       "exports",   NULL};

static void validate(mctx *c, const tsr_ynode *root, tsr_manifest *m) {
    if (root->kind != TSR_YNODE_MAP) {
        merr(c, root, TSR_ERR_FORMAT, "a manifest must be a mapping, not a %s", tsr_ynode_kind_name(root));
        return;
    }
    int have_exact = 0;
    for (int i = 0; i < tsr_ynode_pairs(root); i++) {
        const tsr_ynode *k = tsr_ynode_key(root, i), *v = tsr_ynode_val(root, i);
        const char *key = k->str;
        if (!strcmp(key, "name")) {
            m->name = get_str(c, v, "name");
            if (m->name && !is_ident(m->name, 63))
                merr(c, v, TSR_ERR_FORMAT, "name '%s' must match [a-z0-9_]{1,63}", m->name);
        } else if (!strcmp(key, "slot")) {
            const char *s;
            int sl;
            if (!tsr_ynode_as_str(v, &s) || (sl = tsr_slot_from_name(s)) < 0)
                merr(c, v, TSR_ERR_FORMAT,
                     "unknown slot '%s' (attention, kv_cache, drafter, expert_cache or gemv)",
                     v->kind == TSR_YNODE_SCALAR ? v->str : tsr_ynode_kind_name(v));
            else
                m->slot = (tsr_slot)sl;
        } else if (!strcmp(key, "version")) {
            m->version = get_str(c, v, "version");
            if (m->version && !is_dotted(m->version, 3, NULL))
                merr(c, v, TSR_ERR_FORMAT, "version '%s' must be MAJOR.MINOR.PATCH", m->version);
        } else if (!strcmp(key, "abi")) {
            int mm[2];
            if (v->kind != TSR_YNODE_SCALAR || !is_dotted(v->str, 2, mm)) {
                merr(c, v, TSR_ERR_FORMAT, "abi must be \"MAJOR.MINOR\" (quote it)");
            } else {
                m->abi_major = mm[0];
                m->abi_minor = mm[1];
                if (mm[0] != TSR_ABI_MAJOR || mm[1] > TSR_ABI_MINOR)
                    merr(c, v, TSR_ERR_REFUSED, "abi %d.%d is not supported by this host (abi %d.%d)",
                         mm[0], mm[1], TSR_ABI_MAJOR, TSR_ABI_MINOR);
            }
        } else if (!strcmp(key, "library")) {
            m->library = get_str(c, v, "library");
            if (m->library && (m->library[0] == '/' || !m->library[0] || strstr(m->library, "..")))
                merr(c, v, TSR_ERR_FORMAT, "library '%s' must be a path relative to the manifest's folder",
                     m->library);
        } else if (!strcmp(key, "sha256")) {
            const char *s;
            if (!tsr_ynode_as_str(v, &s)) {
                merr(c, v, TSR_ERR_FORMAT, "sha256 must be a string of 64 hex digits");
            } else if (!strcmp(s, "@SHA256@")) {
                merr(c, v, TSR_ERR_FORMAT, "sha256 is not filled in (a source manifest: use the built catalog)");
            } else {
                size_t n = strlen(s);
                int ok = n == 64;
                for (size_t j = 0; ok && j < n; j++) {
                    char ch = s[j];
                    ok = (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
                    m->sha256[j] = (char)(ch >= 'A' && ch <= 'F' ? ch - 'A' + 'a' : ch);
                }
                m->sha256[ok ? 64 : 0] = '\0';
                if (!ok) merr(c, v, TSR_ERR_FORMAT, "sha256 must be 64 hex digits");
            }
        } else if (!strcmp(key, "devices")) {
            if (!get_devices(c, v, "devices", &m->devices) && !m->devices)
                merr(c, v, TSR_ERR_FORMAT, "devices must not be empty");
        } else if (!strcmp(key, "exactness")) {
            const char *s;
            have_exact = 1;
            if (!tsr_ynode_as_str(v, &s) || (strcmp(s, "exact") && strcmp(s, "lossy")))
                merr(c, v, TSR_ERR_FORMAT, "exactness must be 'exact' or 'lossy'");
            else
                m->exact = !strcmp(s, "exact");
        } else if (!strcmp(key, "quality")) {
            get_quality(c, v, m);
        } else if (!strcmp(key, "baseline")) {
            get_devices(c, v, "baseline", &m->baseline);
        } else if (!strcmp(key, "test")) {
            get_bool(c, v, "test", &m->test);
        } else if (!strcmp(key, "description")) {
            m->description = get_str(c, v, "description");
        } else if (!strcmp(key, "provides")) {
            get_caps(c, v, "provides", &m->provides, &m->n_provides);
        } else if (!strcmp(key, "requires")) {
            get_caps(c, v, "requires", &m->requires, &m->n_requires);
        } else if (!strcmp(key, "params")) {
            get_params(c, v, m);
        } else if (!strcmp(key, "exports")) {
            get_exports(c, v, m);
        } else {
            merr(c, k, TSR_ERR_FORMAT,
                 "unknown key '%s' (name, slot, version, abi, library, sha256, devices, exactness, "
                 "quality, baseline, test, description, provides, requires, params, exports)",
                 key);
        }
    }
    if (c->nomem) return;
    static const char *const required[] = {"name", "slot", "version", "abi", "library",
                                           "sha256", "devices", "exactness", NULL};
    for (int i = 0; required[i]; i++)
        if (!tsr_ynode_get(root, required[i]))
            merr(c, root, TSR_ERR_FORMAT, "missing required key '%s'", required[i]);
    if (have_exact && m->exact && m->has_quality)
        merr(c, tsr_ynode_get(root, "quality"), TSR_ERR_FORMAT, "quality is forbidden for an exact plugin");
    if (have_exact && !m->exact && !m->has_quality)
        merr(c, tsr_ynode_get(root, "exactness"), TSR_ERR_FORMAT,
             "a lossy plugin must declare quality {max_mean_kl, max_ppl_ratio}");
    if (m->baseline & ~m->devices)
        merr(c, tsr_ynode_get(root, "baseline"), TSR_ERR_FORMAT,
             "baseline names a device the plugin does not run on");
    for (int i = 0; i < m->n_params; i++)
        for (int j = 0; j < i; j++)
            if (m->params[i].name && m->params[j].name && !strcmp(m->params[i].name, m->params[j].name))
                merr(c, NULL, TSR_ERR_FORMAT, "param '%s' declared twice", m->params[i].name);
    check_provides(c, m);
    check_requires(c, m);
    (void)top_keys;
}

static char *resolve_library(const char *manifest_path, const char *lib) {
    const char *slash = strrchr(manifest_path, '/');
    size_t dlen = slash ? (size_t)(slash - manifest_path) : 1;
    const char *dir = slash ? manifest_path : ".";
    size_t n = dlen + 1 + strlen(lib) + 1;
    char *p = tsr_halloc(n);
    if (p) snprintf(p, n, "%.*s/%s", (int)dlen, dir, lib);
    return p;
}

/* A manifest from its YAML tree (taken over, freed on failure). */
static int manifest_from_tree(tsr_ynode *root, const char *path, tsr_manifest **out, tsr_diag *d) {
    tsr_manifest *m = tsr_hcalloc(1, sizeof *m);
    if (!m) {
        tsr_ynode_free(root);
        return tsr_diag_add(d, TSR_ERR_NOMEM, path, 0, 0, "out of memory");
    }
    m->doc = root;
    m->path = tsr_hstrdup(path);
    mctx c = {.file = path, .d = d};
    if (!m->path) mnomem(&c);
    validate(&c, root, m);
    if (!c.rc && m->library) {
        m->library_path = resolve_library(path, m->library);
        if (!m->library_path) mnomem(&c);
    }
    if (c.rc) {
        tsr_manifest_free(m);
        return c.rc;
    }
    *out = m;
    return TSR_OK;
}

int tsr_manifest_parse(const char *buf, size_t len, const char *path, tsr_manifest **out, tsr_diag *d) {
    *out = NULL;
    if (!path) path = "<memory>";
    tsr_ynode *root = NULL;
    int rc = tsr_ydoc_parse(buf, len, path, &root, d);
    return rc ? rc : manifest_from_tree(root, path, out, d);
}

int tsr_manifest_load(const char *path, tsr_manifest **out, tsr_diag *d) {
    *out = NULL;
    tsr_ynode *root = NULL;
    /* read through ydoc_load for the size and file checks, then validate */
    int rc = tsr_ydoc_load(path, &root, d);
    return rc ? rc : manifest_from_tree(root, path, out, d);
}

void tsr_manifest_free(tsr_manifest *m) {
    if (!m) return;
    tsr_hfree(m->path);
    tsr_hfree(m->name);
    tsr_hfree(m->version);
    tsr_hfree(m->library);
    tsr_hfree(m->library_path);
    tsr_hfree(m->description);
    for (int i = 0; i < m->n_provides; i++) cap_free(&m->provides[i]);
    tsr_hfree(m->provides);
    for (int i = 0; i < m->n_requires; i++) cap_free(&m->requires[i]);
    tsr_hfree(m->requires);
    for (int i = 0; i < m->n_params; i++) param_free(&m->params[i]);
    tsr_hfree(m->params);
    for (int i = 0; i < m->n_exports; i++) {
        tsr_hfree(m->exports[i].name);
        tsr_hfree(m->exports[i].signature);
    }
    tsr_hfree(m->exports);
    tsr_ynode_free(m->doc);
    tsr_hfree(m);
}

void tsr_manifest_pos(const tsr_manifest *m, const char *key, int *line, int *col) {
    *line = *col = 0;
    if (!m || !m->doc || m->doc->kind != TSR_YNODE_MAP) return;
    for (int i = 0; i < tsr_ynode_pairs(m->doc); i++) {
        const tsr_ynode *k = tsr_ynode_key(m->doc, i);
        if (!strcmp(k->str, key)) {
            *line = k->line;
            *col = k->col;
            return;
        }
    }
}

const tsr_mparam *tsr_manifest_param(const tsr_manifest *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].name && !strcmp(m->params[i].name, name)) return &m->params[i];
    return NULL;
}

const tsr_mcap *tsr_manifest_provides(const tsr_manifest *m, const char *key) {
    for (int i = 0; i < m->n_provides; i++)
        if (m->provides[i].key && !strcmp(m->provides[i].key, key)) return &m->provides[i];
    return NULL;
}

const tsr_mexport *tsr_manifest_export(const tsr_manifest *m, const char *name) {
    for (int i = 0; i < m->n_exports; i++)
        if (m->exports[i].name && !strcmp(m->exports[i].name, name)) return &m->exports[i];
    return NULL;
}
