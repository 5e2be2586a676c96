#include "workload.h"

#include <stdlib.h>
#include <string.h>

static const char *const kinds[] = {"chat", "code", "math", "tool_call", "summary", "agent"};

void tsr_workload_free(tsr_workload *w) {
    if (!w) return;
    for (int i = 0; i < w->n_cases; i++) {
        free(w->cases[i].name);
        free(w->cases[i].kind);
        json_decref(w->cases[i].messages);
    }
    free(w->cases);
    free(w->path);
    free(w->name);
    free(w->score_text);
    free(w);
}

static int int_field(const json_t *o, const char *key, int def, int min, int max, const char *path,
                     const char *where, int *out, tsr_error *err) {
    const json_t *v = json_object_get(o, key);
    if (!v) {
        if (def < min)
            return tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "%s%s: missing", where, key);
        *out = def;
        return TSR_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "%s%s: expected an integer in [%d, %d]",
                                where, key, min, max);
    *out = (int)json_integer_value(v);
    return TSR_OK;
}

static int check_keys(const json_t *o, const char *const *allowed, int n, const char *path,
                      const char *where, tsr_error *err) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        int ok = 0;
        for (int i = 0; i < n; i++) ok |= !strcmp(k, allowed[i]);
        if (!ok) return tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "%s%s: unknown key", where, k);
    }
    return TSR_OK;
}

static int parse_root(json_t *root, const char *path, tsr_workload *w, tsr_error *err) {
    static const char *const top[] = {"schema", "name", "version", "description", "warmup",
                                      "repeats", "score_text", "cases"};
    static const char *const ck[] = {"name", "kind", "max_tokens", "messages", "note"};
    if (!json_is_object(root))
        return tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "the workload must be a JSON object");
    int rc = check_keys(root, top, 8, path, "", err);
    if (rc) return rc;
    const json_t *s = json_object_get(root, "schema");
    if (!json_is_string(s) || strcmp(json_string_value(s), TSR_WORKLOAD_SCHEMA))
        return tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "schema: expected \"%s\"",
                                TSR_WORKLOAD_SCHEMA);
    const json_t *nm = json_object_get(root, "name");
    if (!json_is_string(nm) || !json_string_length(nm))
        return tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "name: expected a non-empty string");
    if (!(w->name = strdup(json_string_value(nm)))) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    if ((rc = int_field(root, "version", -1, 1, 1 << 30, path, "", &w->version, err)) ||
        (rc = int_field(root, "warmup", 1, 0, TSR_WORKLOAD_MAX_REPEATS, path, "", &w->warmup, err)) ||
        (rc = int_field(root, "repeats", 3, 1, TSR_WORKLOAD_MAX_REPEATS, path, "", &w->repeats, err)))
        return rc;
    const json_t *st = json_object_get(root, "score_text");
    if (st && !json_is_string(st))
        return tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "score_text: expected a string");
    if (!(w->score_text = strdup(st ? json_string_value(st) : "")))
        return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    const json_t *cases = json_object_get(root, "cases");
    if (!json_is_array(cases) || json_array_size(cases) == 0 ||
        json_array_size(cases) > TSR_WORKLOAD_MAX_CASES)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "cases: expected an array of 1..%d cases",
                                TSR_WORKLOAD_MAX_CASES);
    size_t n = json_array_size(cases);
    if (!(w->cases = calloc(n, sizeof *w->cases))) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        char where[64];
        snprintf(where, sizeof where, "cases[%zu].", i);
        const json_t *c = json_array_get(cases, i);
        if (!json_is_object(c))
            return tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "cases[%zu]: expected an object", i);
        if ((rc = check_keys(c, ck, 5, path, where, err))) return rc;
        tsr_wl_case *k = &w->cases[w->n_cases++];
        const json_t *cn = json_object_get(c, "name"), *kind = json_object_get(c, "kind");
        if (!json_is_string(cn) || !json_string_length(cn))
            return tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "%sname: expected a non-empty string", where);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(w->cases[j].name, json_string_value(cn)))
                return tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "%sname: '%s' is used twice", where,
                                        json_string_value(cn));
        int kind_ok = 0;
        for (size_t j = 0; json_is_string(kind) && j < sizeof kinds / sizeof kinds[0]; j++)
            kind_ok |= !strcmp(json_string_value(kind), kinds[j]);
        if (!kind_ok)
            return tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0,
                                    "%skind: expected chat, code, math, tool_call, summary or agent", where);
        if (!(k->name = strdup(json_string_value(cn))) || !(k->kind = strdup(json_string_value(kind))))
            return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
        if ((rc = int_field(c, "max_tokens", -1, 1, TSR_WORKLOAD_MAX_TOKENS, path, where, &k->max_tokens, err)))
            return rc;
        json_t *msgs = json_object_get(c, "messages");
        if (!json_is_array(msgs) || json_array_size(msgs) == 0)
            return tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "%smessages: expected a non-empty array",
                                    where);
        for (size_t j = 0; j < json_array_size(msgs); j++) {
            const json_t *m = json_array_get(msgs, j);
            const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
            if (!json_is_object(m) || !json_is_string(role) || !json_is_string(content))
                return tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0,
                                        "%smessages[%zu]: expected {\"role\": string, \"content\": string}",
                                        where, j);
        }
        k->messages = json_incref(msgs);
    }
    return TSR_OK;
}

int tsr_workload_parse(const char *buf, size_t len, const char *path, tsr_workload **out, tsr_error *err) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, path, je.line > 0 ? je.line : 0,
                                je.column > 0 ? je.column : 0, "%s", je.text);
    tsr_workload *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        json_decref(root);
        return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    }
    int rc = parse_root(root, path, w, err);
    json_decref(root);
    if (rc) {
        tsr_workload_free(w);
        return rc;
    }
    *out = w;
    return TSR_OK;
}

int tsr_workload_load(const char *path, tsr_workload **out, tsr_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return tsr_error_set_at(err, TSR_ERR_IO, path, 0, 0, "cannot open the workload");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            if (cap >= (16u << 20)) {
                free(buf);
                fclose(f);
                return tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "workload over 16 MiB");
            }
            cap = cap ? cap * 2 : 65536;
            char *g = realloc(buf, cap);
            if (!g) {
                free(buf);
                fclose(f);
                return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
            }
            buf = g;
        }
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return tsr_error_set_at(err, TSR_ERR_IO, path, 0, 0, "read error");
    }
    int rc = tsr_workload_parse(buf, len, path, out, err);
    free(buf);
    return rc;
}
