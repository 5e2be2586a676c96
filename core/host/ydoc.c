#include "ydoc.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

#include "halloc.h"

tsr_ynode *tsr_ynode_new(tsr_ynode_kind kind, int line, int col) {
    tsr_ynode *n = tsr_hcalloc(1, sizeof *n);
    if (!n) return NULL;
    n->kind = kind;
    n->line = line;
    n->col = col;
    return n;
}

tsr_ynode *tsr_ynode_scalar(const char *s, size_t len, int quoted, int line, int col) {
    tsr_ynode *n = tsr_ynode_new(TSR_YNODE_SCALAR, line, col);
    if (!n) return NULL;
    n->str = tsr_halloc(len + 1);
    if (!n->str) {
        tsr_hfree(n);
        return NULL;
    }
    memcpy(n->str, s, len);
    n->str[len] = '\0';
    n->quoted = quoted;
    return n;
}

int tsr_ynode_push(tsr_ynode *parent, tsr_ynode *child) {
    if (tsr_hgrow((void **)&parent->items, sizeof *parent->items, parent->n + 1, &parent->cap))
        return -1;
    parent->items[parent->n++] = child;
    return 0;
}

void tsr_ynode_free(tsr_ynode *n) {
    if (!n) return;
    for (int i = 0; i < n->n; i++) tsr_ynode_free(n->items[i]);
    tsr_hfree(n->items);
    tsr_hfree(n->str);
    tsr_hfree(n);
}

const tsr_ynode *tsr_ynode_get(const tsr_ynode *m, const char *key) {
    if (!m || m->kind != TSR_YNODE_MAP) return NULL;
    for (int i = 0; i + 1 < m->n; i += 2)
        if (!strcmp(m->items[i]->str, key)) return m->items[i + 1];
    return NULL;
}

/* --- typed scalars ---------------------------------------------------------- */

int tsr_ynode_is_null(const tsr_ynode *n) {
    if (!n || n->kind != TSR_YNODE_SCALAR || n->quoted) return 0;
    const char *s = n->str;
    return !s[0] || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
           !strcmp(s, "NULL");
}

int tsr_ynode_as_bool(const tsr_ynode *n, int *out) {
    if (!n || n->kind != TSR_YNODE_SCALAR || n->quoted) return 0;
    const char *s = n->str;
    if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE")) {
        *out = 1;
        return 1;
    }
    if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE")) {
        *out = 0;
        return 1;
    }
    return 0;
}

int tsr_ynode_as_int(const tsr_ynode *n, int64_t *out) {
    if (!n || n->kind != TSR_YNODE_SCALAR || n->quoted) return 0;
    const char *s = n->str;
    if (!s[0]) return 0;
    const char *p = s;
    if (*p == '-' || *p == '+') p++;
    if (!*p) return 0;
    int base = 10;
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) base = 16;
    else if (p[0] == '0' && p[1] == 'o') base = 8;
    const char *digits = base == 10 ? p : p + 2;
    if (!*digits) return 0;
    for (const char *q = digits; *q; q++) {
        int ok = base == 16 ? (*q >= '0' && *q <= '9') || (*q >= 'a' && *q <= 'f') ||
                                  (*q >= 'A' && *q <= 'F')
                 : base == 8 ? (*q >= '0' && *q <= '7')
                             : (*q >= '0' && *q <= '9');
        if (!ok) return 0;
    }
    if (base != 10 && p != s) return 0; /* no sign on hex/octal */
    errno = 0;
    long long v = strtoll(base == 10 ? s : digits, NULL, base);
    if (errno == ERANGE) return 0;
    *out = (int64_t)v;
    return 1;
}

int tsr_ynode_as_float(const tsr_ynode *n, double *out) {
    int64_t i;
    if (tsr_ynode_as_int(n, &i)) {
        *out = (double)i;
        return 1;
    }
    if (!n || n->kind != TSR_YNODE_SCALAR || n->quoted) return 0;
    const char *s = n->str;
    if (!strcmp(s, ".inf") || !strcmp(s, "+.inf") || !strcmp(s, "-.inf") || !strcmp(s, ".nan"))
        return 0; /* no infinities or NaNs anywhere in our documents */
    const char *p = s;
    if (*p == '-' || *p == '+') p++;
    int digits = 0;
    while (*p >= '0' && *p <= '9') p++, digits++;
    if (*p == '.') {
        p++;
        while (*p >= '0' && *p <= '9') p++, digits++;
    }
    if (!digits) return 0;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '-' || *p == '+') p++;
        if (!(*p >= '0' && *p <= '9')) return 0;
        while (*p >= '0' && *p <= '9') p++;
    }
    if (*p) return 0;
    double v = strtod(s, NULL);
    if (!isfinite(v)) return 0;
    *out = v;
    return 1;
}

int tsr_ynode_as_str(const tsr_ynode *n, const char **out) {
    int b;
    double f;
    if (!n || n->kind != TSR_YNODE_SCALAR) return 0;
    if (!n->quoted && (tsr_ynode_is_null(n) || tsr_ynode_as_bool(n, &b) || tsr_ynode_as_float(n, &f))) return 0;
    *out = n->str;
    return 1;
}

const char *tsr_ynode_kind_name(const tsr_ynode *n) {
    int64_t i;
    double f;
    int b;
    if (!n) return "nothing";
    if (n->kind == TSR_YNODE_MAP) return "mapping";
    if (n->kind == TSR_YNODE_SEQ) return "list";
    if (n->quoted) return "string";
    if (tsr_ynode_is_null(n)) return "null";
    if (tsr_ynode_as_bool(n, &b)) return "boolean";
    if (tsr_ynode_as_int(n, &i)) return "integer";
    if (tsr_ynode_as_float(n, &f)) return "float";
    return "string";
}

/* --- parsing ---------------------------------------------------------------- */

typedef struct yparse {
    const char *file;
    tsr_diag *d;
    tsr_ynode *stack[TSR_YDOC_MAX_DEPTH + 1];
    int depth;
    tsr_ynode *root;
    int n_docs;
} yparse;

static int mark_line(yaml_mark_t m) { return (int)m.line + 1; }
static int mark_col(yaml_mark_t m) { return (int)m.column + 1; }

/* Attach n to the node on top of the stack (or make it the root). */
static int attach(yparse *p, tsr_ynode *n) {
    if (p->depth == 0) {
        if (p->root) {
            tsr_ynode_free(n);
            return tsr_diag_add(p->d, TSR_ERR_FORMAT, p->file, n->line, n->col,
                                "more than one document");
        }
        p->root = n;
        return 0;
    }
    tsr_ynode *parent = p->stack[p->depth - 1];
    if (parent->kind == TSR_YNODE_MAP && parent->n % 2 == 0) {
        /* n is a key */
        if (n->kind != TSR_YNODE_SCALAR) {
            int line = n->line, col = n->col;
            tsr_ynode_free(n);
            return tsr_diag_add(p->d, TSR_ERR_FORMAT, p->file, line, col,
                                "mapping keys must be plain scalars");
        }
        for (int i = 0; i < parent->n; i += 2) {
            if (!strcmp(parent->items[i]->str, n->str)) {
                int r = tsr_diag_add(p->d, TSR_ERR_FORMAT, p->file, n->line, n->col,
                                     "duplicate key '%s' (first at line %d)", n->str,
                                     parent->items[i]->line);
                tsr_ynode_free(n);
                return r;
            }
        }
    }
    if (tsr_ynode_push(parent, n)) {
        tsr_ynode_free(n);
        return tsr_diag_add(p->d, TSR_ERR_NOMEM, p->file, 0, 0, "out of memory");
    }
    return 0;
}

static int refuse_props(yparse *p, yaml_event_t *ev, const yaml_char_t *anchor,
                        const yaml_char_t *tag) {
    if (anchor)
        return tsr_diag_add(p->d, TSR_ERR_FORMAT, p->file, mark_line(ev->start_mark),
                            mark_col(ev->start_mark), "anchors are not allowed (&%s)",
                            (const char *)anchor);
    if (tag)
        return tsr_diag_add(p->d, TSR_ERR_FORMAT, p->file, mark_line(ev->start_mark),
                            mark_col(ev->start_mark), "tags are not allowed (%s)",
                            (const char *)tag);
    return 0;
}

int tsr_ydoc_parse(const char *buf, size_t len, const char *file, tsr_ynode **out, tsr_diag *d) {
    *out = NULL;
    if (!file) file = "<memory>";
    if (len > TSR_YDOC_MAX_BYTES)
        return tsr_diag_add(d, TSR_ERR_FORMAT, file, 0, 0,
                            "document is %zu bytes, more than the limit of %u", len,
                            TSR_YDOC_MAX_BYTES);
    yparse p = {.file = file, .d = d};
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) return tsr_diag_add(d, TSR_ERR_NOMEM, file, 0, 0, "out of memory");
    yaml_parser_set_input_string(&parser, (const unsigned char *)buf, len);
    int rc = 0, done = 0;
    while (!done && rc == 0) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            yaml_mark_t m = parser.problem_mark;
            if (parser.error == YAML_MEMORY_ERROR)
                rc = tsr_diag_add(d, TSR_ERR_NOMEM, file, 0, 0, "out of memory");
            else
                rc = tsr_diag_add(d, TSR_ERR_FORMAT, file, mark_line(m), mark_col(m),
                                  "malformed YAML: %s%s%s",
                                  parser.problem ? parser.problem : "syntax error",
                                  parser.context ? " " : "", parser.context ? parser.context : "");
            break;
        }
        int line = mark_line(ev.start_mark), col = mark_col(ev.start_mark);
        switch (ev.type) {
        case YAML_STREAM_END_EVENT: done = 1; break;
        case YAML_DOCUMENT_START_EVENT:
            if (++p.n_docs > 1)
                rc = tsr_diag_add(d, TSR_ERR_FORMAT, file, line, col, "more than one document");
            break;
        case YAML_ALIAS_EVENT:
            rc = tsr_diag_add(d, TSR_ERR_FORMAT, file, line, col, "aliases are not allowed (*%s)",
                              (const char *)ev.data.alias.anchor);
            break;
        case YAML_SCALAR_EVENT: {
            rc = refuse_props(&p, &ev, ev.data.scalar.anchor, ev.data.scalar.tag);
            if (rc) break;
            if (strlen((const char *)ev.data.scalar.value) != ev.data.scalar.length) {
                rc = tsr_diag_add(d, TSR_ERR_FORMAT, file, line, col, "NUL character in a scalar");
                break;
            }
            tsr_ynode *n = tsr_ynode_scalar((const char *)ev.data.scalar.value,
                                            ev.data.scalar.length,
                                            ev.data.scalar.style != YAML_PLAIN_SCALAR_STYLE, line, col);
            rc = n ? attach(&p, n) : tsr_diag_add(d, TSR_ERR_NOMEM, file, 0, 0, "out of memory");
            break;
        }
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT: {
            int is_map = ev.type == YAML_MAPPING_START_EVENT;
            rc = is_map ? refuse_props(&p, &ev, ev.data.mapping_start.anchor, ev.data.mapping_start.tag)
                        : refuse_props(&p, &ev, ev.data.sequence_start.anchor,
                                       ev.data.sequence_start.tag);
            if (rc) break;
            if (p.depth >= TSR_YDOC_MAX_DEPTH) {
                rc = tsr_diag_add(d, TSR_ERR_FORMAT, file, line, col,
                                  "nested deeper than %d levels", TSR_YDOC_MAX_DEPTH);
                break;
            }
            tsr_ynode *n = tsr_ynode_new(is_map ? TSR_YNODE_MAP : TSR_YNODE_SEQ, line, col);
            if (!n) {
                rc = tsr_diag_add(d, TSR_ERR_NOMEM, file, 0, 0, "out of memory");
                break;
            }
            rc = attach(&p, n);
            if (rc == 0) p.stack[p.depth++] = n;
            break;
        }
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            if (p.depth > 0) p.depth--;
            break;
        default: break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    if (rc) {
        tsr_ynode_free(p.root);
        return rc;
    }
    if (!p.root) {
        p.root = tsr_ynode_new(TSR_YNODE_MAP, 1, 1);
        if (!p.root) return tsr_diag_add(d, TSR_ERR_NOMEM, file, 0, 0, "out of memory");
    } else if (tsr_ynode_is_null(p.root)) {
        tsr_ynode *m = tsr_ynode_new(TSR_YNODE_MAP, p.root->line, p.root->col);
        tsr_ynode_free(p.root);
        if (!m) return tsr_diag_add(d, TSR_ERR_NOMEM, file, 0, 0, "out of memory");
        p.root = m;
    }
    *out = p.root;
    return 0;
}

int tsr_ydoc_load(const char *path, tsr_ynode **out, tsr_diag *d) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return tsr_diag_add(d, TSR_ERR_IO, path, 0, 0, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return tsr_diag_add(d, TSR_ERR_IO, path, 0, 0, "not a regular file");
    }
    if ((uint64_t)st.st_size > TSR_YDOC_MAX_BYTES) {
        fclose(f);
        return tsr_diag_add(d, TSR_ERR_FORMAT, path, 0, 0,
                            "document is %lld bytes, more than the limit of %u",
                            (long long)st.st_size, TSR_YDOC_MAX_BYTES);
    }
    size_t size = (size_t)st.st_size;
    char *buf = tsr_halloc(size + 1);
    if (!buf) {
        fclose(f);
        return tsr_diag_add(d, TSR_ERR_NOMEM, path, 0, 0, "out of memory");
    }
    size_t got = fread(buf, 1, size, f);
    fclose(f);
    if (got != size) {
        tsr_hfree(buf);
        return tsr_diag_add(d, TSR_ERR_IO, path, 0, 0, "short read");
    }
    int rc = tsr_ydoc_parse(buf, size, path, out, d);
    tsr_hfree(buf);
    return rc;
}
