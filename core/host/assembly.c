#include "assembly.h"

#include <string.h>

#include "halloc.h"
#include "lua_assembly.h"

static int is_plugin_name(const char *s) {
    size_t n = strlen(s);
    if (!n || n > 63) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_')) return 0;
    return 1;
}

static int add(tsr_diag *d, int *rc, const char *file, const tsr_ynode *at, const char *fmt,
               const char *a, const char *b) {
    tsr_diag_add(d, TSR_ERR_FORMAT, file, at ? at->line : 0, at ? at->col : 0, fmt, a, b);
    if (!*rc) *rc = TSR_ERR_FORMAT;
    return *rc;
}

static char *dup_or(int *rc, const char *s) {
    char *r = tsr_hstrdup(s);
    if (!r && !*rc) *rc = TSR_ERR_NOMEM;
    return r;
}

static void read_slot(tsr_assembly *a, const char *file, const tsr_ynode *k, const tsr_ynode *v,
                      tsr_diag *d, int *rc) {
    int s = tsr_slot_from_name(k->str);
    if (s < 0) {
        add(d, rc, file, k, "unknown slot '%s'%s (attention, kv_cache, drafter, expert_cache, gemv)",
            k->str, "");
        return;
    }
    tsr_aslot *sl = &a->slots[s];
    sl->given = 1;
    sl->line = k->line;
    sl->col = k->col;
    const char *name;
    if (v->kind == TSR_YNODE_SCALAR) {
        if (!tsr_ynode_as_str(v, &name)) {
            add(d, rc, file, v, "slots.%s must name a plugin, not a %s", k->str, tsr_ynode_kind_name(v));
            return;
        }
    } else if (v->kind == TSR_YNODE_MAP) {
        const tsr_ynode *p = tsr_ynode_get(v, "plugin");
        for (int i = 0; i < tsr_ynode_pairs(v); i++) {
            const tsr_ynode *kk = tsr_ynode_key(v, i);
            if (strcmp(kk->str, "plugin") && strcmp(kk->str, "params"))
                add(d, rc, file, kk, "slots.%s: unknown key '%s' (plugin, params)", k->str, kk->str);
        }
        if (!p) {
            add(d, rc, file, v, "slots.%s: missing 'plugin'%s", k->str, "");
            return;
        }
        if (!tsr_ynode_as_str(p, &name)) {
            add(d, rc, file, p, "slots.%s.plugin must be a plugin name, not a %s", k->str,
                tsr_ynode_kind_name(p));
            return;
        }
        const tsr_ynode *params = tsr_ynode_get(v, "params");
        if (params && params->kind != TSR_YNODE_MAP && !tsr_ynode_is_null(params))
            add(d, rc, file, params, "slots.%s.params must be a mapping, not a %s", k->str,
                tsr_ynode_kind_name(params));
        else if (params && params->kind == TSR_YNODE_MAP)
            sl->params = params;
    } else {
        add(d, rc, file, v, "slots.%s must be a plugin name or {plugin, params}, not a %s", k->str,
            tsr_ynode_kind_name(v));
        return;
    }
    if (!is_plugin_name(name)) {
        add(d, rc, file, v, "slots.%s: '%s' is not a plugin name ([a-z0-9_]{1,63})", k->str, name);
        return;
    }
    sl->plugin = dup_or(rc, name);
}

static const char *const rt_names[TSR_RT_COUNT] = {
    [TSR_RT_CUDA_GRAPHS] = "cuda_graphs",
    [TSR_RT_PDL] = "pdl",
    [TSR_RT_PIPELINE] = "pipeline",
};

const char *tsr_rt_switch_name(tsr_rt_switch s) { return (unsigned)s < TSR_RT_COUNT ? rt_names[s] : NULL; }

/* runtime: {SWITCH: bool, ...} (rt_names) */
static void read_runtime(tsr_assembly *a, const char *path, const tsr_ynode *v, tsr_diag *d, int *rc) {
    if (tsr_ynode_is_null(v)) return;
    if (v->kind != TSR_YNODE_MAP) {
        add(d, rc, path, v, "runtime must be a mapping of switch -> value, not a %s", tsr_ynode_kind_name(v), "");
        return;
    }
    for (int i = 0; i < tsr_ynode_pairs(v); i++) {
        const tsr_ynode *k = tsr_ynode_key(v, i), *x = tsr_ynode_val(v, i);
        int s = 0;
        while (s < TSR_RT_COUNT && strcmp(k->str, rt_names[s])) s++;
        if (s == TSR_RT_COUNT) {
            char known[128] = "";
            for (int j = 0, off = 0; j < TSR_RT_COUNT && off < (int)sizeof known; j++)
                off += snprintf(known + off, sizeof known - (size_t)off, "%s%s", j ? ", " : "", rt_names[j]);
            add(d, rc, path, k, "runtime: unknown key '%s' (%s)", k->str, known);
            continue;
        }
        int b;
        if (!tsr_ynode_as_bool(x, &b)) {
            add(d, rc, path, x, "runtime.%s must be true or false, not '%s'", k->str,
                x->kind == TSR_YNODE_SCALAR ? x->str : tsr_ynode_kind_name(x));
            continue;
        }
        a->runtime[s] = (tsr_rt_value){.on = b, .line = x->line, .col = x->col};
    }
}

int tsr_assembly_from_tree(tsr_ynode *root, const char *path, tsr_assembly **out, tsr_diag *d) {
    *out = NULL;
    if (!path) path = "<memory>";
    int rc = 0;
    tsr_assembly *a = tsr_hcalloc(1, sizeof *a);
    if (!a) {
        tsr_ynode_free(root);
        return tsr_diag_add(d, TSR_ERR_NOMEM, path, 0, 0, "out of memory");
    }
    a->doc = root;
    a->path = dup_or(&rc, path);
    a->line = root->line;
    a->col = root->col;
    if (root->kind != TSR_YNODE_MAP) {
        add(d, &rc, path, root, "an assembly must be a mapping {name, device, slots}, not a %s",
            tsr_ynode_kind_name(root), "");
        goto done;
    }
    int have_device = 0;
    for (int i = 0; i < tsr_ynode_pairs(root); i++) {
        const tsr_ynode *k = tsr_ynode_key(root, i), *v = tsr_ynode_val(root, i);
        const char *s;
        if (!strcmp(k->str, "name")) {
            if (!tsr_ynode_as_str(v, &s) || !s[0])
                add(d, &rc, path, v, "name must be a non-empty string, not a %s", tsr_ynode_kind_name(v), "");
            else
                a->name = dup_or(&rc, s);
        } else if (!strcmp(k->str, "description")) {
            if (!tsr_ynode_as_str(v, &s))
                add(d, &rc, path, v, "description must be a string, not a %s", tsr_ynode_kind_name(v), "");
            else
                a->description = dup_or(&rc, s);
        } else if (!strcmp(k->str, "device")) {
            have_device = 1;
            if (!tsr_ynode_as_str(v, &s) || tsr_device_from_name(s) < 0)
                add(d, &rc, path, v, "unknown device '%s'%s (cpu or cuda)",
                    v->kind == TSR_YNODE_SCALAR ? v->str : tsr_ynode_kind_name(v), "");
            else
                a->device = tsr_device_from_name(s);
        } else if (!strcmp(k->str, "slots")) {
            if (v->kind != TSR_YNODE_MAP) {
                if (!tsr_ynode_is_null(v))
                    add(d, &rc, path, v, "slots must be a mapping of slot -> plugin, not a %s",
                        tsr_ynode_kind_name(v), "");
                continue;
            }
            for (int j = 0; j < tsr_ynode_pairs(v); j++)
                read_slot(a, path, tsr_ynode_key(v, j), tsr_ynode_val(v, j), d, &rc);
        } else if (!strcmp(k->str, "runtime")) {
            read_runtime(a, path, v, d, &rc);
        } else {
            add(d, &rc, path, k, "unknown key '%s'%s (name, description, device, slots, runtime)", k->str, "");
        }
    }
    if (!tsr_ynode_get(root, "name")) add(d, &rc, path, root, "missing required key 'name'%s%s", "", "");
    if (!have_device) add(d, &rc, path, root, "missing required key 'device'%s%s", "", "");
done:
    if (rc == TSR_ERR_NOMEM) tsr_diag_add(d, rc, path, 0, 0, "out of memory");
    if (rc) {
        tsr_assembly_free(a);
        return rc;
    }
    *out = a;
    return TSR_OK;
}

int tsr_assembly_parse(const char *buf, size_t len, const char *path, tsr_assembly **out, tsr_diag *d) {
    *out = NULL;
    tsr_ynode *root = NULL;
    int rc = tsr_ydoc_parse(buf, len, path, &root, d);
    if (rc) return rc;
    return tsr_assembly_from_tree(root, path, out, d);
}

static int has_ext(const char *p, const char *ext) {
    size_t n = strlen(p), m = strlen(ext);
    return n > m && !strcmp(p + n - m, ext);
}

int tsr_assembly_load(const char *path, const tsr_assembly_env *env, tsr_assembly **out, tsr_diag *d) {
    *out = NULL;
    tsr_ynode *root = NULL;
    int rc;
    if (has_ext(path, ".lua")) {
        tsr_assembly_env none = {.device = TSR_DEVICE_CPU};
        rc = tsr_lua_assembly_run(path, env ? env : &none, &root, d);
    } else {
        rc = tsr_ydoc_load(path, &root, d);
    }
    if (rc) return rc;
    return tsr_assembly_from_tree(root, path, out, d);
}

void tsr_assembly_free(tsr_assembly *a) {
    if (!a) return;
    for (int i = 0; i < TSR_SLOT_COUNT; i++) tsr_hfree(a->slots[i].plugin);
    tsr_hfree(a->path);
    tsr_hfree(a->name);
    tsr_hfree(a->description);
    tsr_ynode_free(a->doc);
    tsr_hfree(a);
}
