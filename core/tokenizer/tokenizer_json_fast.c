/*
 * tokenizer_json_fast.c - a strict, allocation-light JSON scanner for the two
 * big members of tokenizer.json, model.vocab (150k+ string: id pairs) and
 * model.merges (150k+ strings or pairs). Building a jansson tree for them
 * costs most of the load time; here they are read straight into the
 * vocabulary. Everything else still goes through jansson: the loader blanks
 * these two spans (same length, newlines kept, so jansson's line:column stay
 * right) and parses the rest. If the skeleton cannot be scanned, the caller
 * falls back to jansson on the whole document, which reports the error.
 */
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct jscan {
    const char *s;
    size_t n, i;
    const char *why; /* set on failure, at position i */
} jscan;

static void ws(jscan *j) {
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\n' || j->s[j->i] == '\r' || j->s[j->i] == '\t'))
        j->i++;
}

static int fail(jscan *j, const char *why) {
    j->why = why;
    return -1;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int hex4(jscan *j, unsigned *v) {
    if (j->i + 4 > j->n) return fail(j, "truncated \\u escape");
    unsigned x = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(j->s[j->i + (size_t)k]);
        if (h < 0) return fail(j, "bad \\u escape");
        x = x * 16 + (unsigned)h;
    }
    j->i += 4;
    *v = x;
    return 0;
}

/* A string at j->i; decoded into out (NULL: only skipped). out must hold
 * as many bytes as the raw string (decoding never grows it). */
static int str(jscan *j, char *out, size_t *len) {
    if (j->i >= j->n || j->s[j->i] != '"') return fail(j, "expected a string");
    j->i++;
    size_t o = 0;
    while (j->i < j->n) {
        unsigned char c = (unsigned char)j->s[j->i];
        if (c == '"') {
            j->i++;
            if (len) *len = o;
            return 0;
        }
        if (c < 0x20) return fail(j, "control character in a string");
        if (c != '\\') {
            if (out) out[o] = (char)c;
            o++;
            j->i++;
            continue;
        }
        if (++j->i >= j->n) break;
        char e = j->s[j->i++];
        unsigned cp;
        switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (hex4(j, &cp)) return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (j->i + 2 > j->n || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u')
                    return fail(j, "lone surrogate in \\u escape");
                j->i += 2;
                if (hex4(j, &lo)) return -1;
                if (lo < 0xDC00 || lo > 0xDFFF) return fail(j, "bad surrogate pair");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return fail(j, "lone surrogate in \\u escape");
            }
            break;
        default: return fail(j, "bad escape");
        }
        /* UTF-8 of cp: at most as long as its escape (\uXXXX is 6, 12 for pairs) */
        char u[4];
        size_t k;
        if (cp < 0x80) { u[0] = (char)cp; k = 1; }
        else if (cp < 0x800) { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3F)); k = 2; }
        else if (cp < 0x10000) {
            u[0] = (char)(0xE0 | (cp >> 12)); u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
            u[2] = (char)(0x80 | (cp & 0x3F)); k = 3;
        } else {
            u[0] = (char)(0xF0 | (cp >> 18)); u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
            u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (char)(0x80 | (cp & 0x3F)); k = 4;
        }
        if (out) memcpy(out + o, u, k);
        o += k;
    }
    return fail(j, "unterminated string");
}

/* Skip any JSON value (nesting bounded). */
static int skip(jscan *j, int depth) {
    if (depth > 64) return fail(j, "nested too deeply");
    ws(j);
    if (j->i >= j->n) return fail(j, "expected a value");
    char c = j->s[j->i];
    if (c == '"') return str(j, NULL, NULL);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->i++;
        ws(j);
        if (j->i < j->n && j->s[j->i] == close) {
            j->i++;
            return 0;
        }
        for (;;) {
            if (c == '{') {
                ws(j);
                if (str(j, NULL, NULL)) return -1;
                ws(j);
                if (j->i >= j->n || j->s[j->i] != ':') return fail(j, "expected ':'");
                j->i++;
            }
            if (skip(j, depth + 1)) return -1;
            ws(j);
            if (j->i < j->n && j->s[j->i] == ',') {
                j->i++;
                continue;
            }
            if (j->i < j->n && j->s[j->i] == close) {
                j->i++;
                return 0;
            }
            return fail(j, "expected ',' or a closing bracket");
        }
    }
    /* number, true, false, null: the rest is checked by jansson or the readers */
    size_t st = j->i;
    while (j->i < j->n && (strchr("+-.0123456789eE", j->s[j->i]) || (j->s[j->i] >= 'a' && j->s[j->i] <= 'z')))
        j->i++;
    return j->i > st ? 0 : fail(j, "unexpected character");
}

/* Find "key": value members of the object at j->i; records the spans of the
 * wanted keys (first occurrence). */
static int members(jscan *j, const char *const *keys, int nk, size_t *beg, size_t *end, char *kbuf,
                   size_t kcap) {
    ws(j);
    if (j->i >= j->n || j->s[j->i] != '{') return fail(j, "expected an object");
    j->i++;
    ws(j);
    if (j->i < j->n && j->s[j->i] == '}') {
        j->i++;
        return 0;
    }
    for (;;) {
        ws(j);
        size_t ks = j->i, kl = 0;
        if (str(j, NULL, NULL)) return -1;
        if (j->i - ks <= kcap) { /* decode keys short enough to be one of ours */
            j->i = ks;
            if (str(j, kbuf, &kl)) return -1;
        } else {
            kl = (size_t)-1;
        }
        ws(j);
        if (j->i >= j->n || j->s[j->i] != ':') return fail(j, "expected ':'");
        j->i++;
        ws(j);
        size_t vs = j->i;
        if (skip(j, 1)) return -1;
        for (int k = 0; k < nk; k++)
            if (kl == strlen(keys[k]) && memcmp(kbuf, keys[k], kl) == 0 && !end[k]) {
                beg[k] = vs;
                end[k] = j->i;
            }
        ws(j);
        if (j->i < j->n && j->s[j->i] == ',') {
            j->i++;
            continue;
        }
        if (j->i < j->n && j->s[j->i] == '}') {
            j->i++;
            return 0;
        }
        return fail(j, "expected ',' or '}'");
    }
}

int tsr_json_fast_locate(const char *s, size_t n, size_t span[4]) {
    jscan j = {s, n, 0, NULL};
    static const char *const top[] = {"model"};
    static const char *const inner[] = {"vocab", "merges"};
    size_t mb[1] = {0}, me[1] = {0}, ib[2] = {0, 0}, ie[2] = {0, 0};
    char kbuf[32];
    if (members(&j, top, 1, mb, me, kbuf, sizeof kbuf)) return -1;
    ws(&j);
    if (j.i != n || !me[0] || s[mb[0]] != '{') return -1;
    jscan m = {s, me[0], mb[0], NULL};
    if (members(&m, inner, 2, ib, ie, kbuf, sizeof kbuf)) return -1;
    if (!ie[0] || s[ib[0]] != '{') return -1;                   /* vocab must be an object */
    if (ie[1] && s[ib[1]] != '[') ie[1] = ib[1] = 0;            /* merges: leave errors to jansson */
    span[0] = ib[0];
    span[1] = ie[0];
    span[2] = ib[1];
    span[3] = ie[1];
    return 0;
}

void tsr_json_fast_blank(char *s, size_t beg, size_t end) {
    char open = s[beg];
    for (size_t i = beg; i < end; i++)
        if (s[i] != '\n') s[i] = ' ';
    s[beg] = open;
    s[beg + 1] = open == '{' ? '}' : ']';
}

/* line:col of offset i */
static void where(const char *s, size_t i, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t k = 0; k < i; k++) {
        if (s[k] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *col = c;
}

static int jerr(const jscan *j, const char *file, const char *what, tsr_error *err) {
    int line, col;
    where(j->s, j->i, &line, &col);
    return tsr_error_set_at(err, TSR_ERR_FORMAT, file, line, col, "%s: %s", what, j->why ? j->why : "malformed");
}

typedef struct entry {
    size_t off, len;
    int64_t id;
} entry;

/* model.vocab: {"text": id, ...} -> max id + 1 and the entries. */
int tsr_json_fast_vocab_scan(const char *s, size_t beg, size_t end, const char *file, char **dec, void **ents,
                             int *n_ents, int *n_vocab, tsr_error *err) {
    jscan j = {s, end, beg + 1, NULL};
    char *buf = malloc(end - beg + 1);
    size_t cap = 1024, o = 0;
    int n = 0, maxid = -1;
    entry *e = malloc(cap * sizeof *e);
    if (!buf || !e) {
        free(buf);
        free(e);
        return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    }
    ws(&j);
    if (j.i < end && s[j.i] == '}') j.i = end;
    while (j.i < end) {
        ws(&j);
        size_t len;
        if (str(&j, buf + o, &len)) goto bad;
        ws(&j);
        if (j.i >= end || s[j.i] != ':') {
            fail(&j, "expected ':'");
            goto bad;
        }
        j.i++;
        ws(&j);
        int64_t v = 0;
        size_t st = j.i;
        while (j.i < end && s[j.i] >= '0' && s[j.i] <= '9' && v < TSR_TOKEN_MAX_ID) v = v * 10 + (s[j.i++] - '0');
        int lead0 = j.i > st + 1 && s[st] == '0'; /* JSON has no leading zeros */
        if (j.i == st || lead0 || v >= TSR_TOKEN_MAX_ID || (j.i < end && strchr(".eE0123456789", s[j.i]))) {
            j.i = st;
            char key[160];
            snprintf(key, sizeof key, "model.vocab['%.*s']", (int)(len > 100 ? 100 : len), buf + o);
            fail(&j, "not an integer id in range");
            free(buf);
            free(e);
            return jerr(&j, file, key, err);
        }
        if (n == (int)cap) {
            entry *q = realloc(e, 2 * cap * sizeof *e);
            if (!q) {
                free(buf);
                free(e);
                return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
            }
            e = q;
            cap *= 2;
        }
        e[n++] = (entry){o, len, v};
        o += len;
        if (v > maxid) maxid = (int)v;
        ws(&j);
        if (j.i < end && s[j.i] == ',') {
            j.i++;
            continue;
        }
        if (j.i < end && s[j.i] == '}') break;
        fail(&j, "expected ',' or '}'");
        goto bad;
    }
    *dec = buf;
    *ents = e;
    *n_ents = n;
    *n_vocab = maxid + 1;
    return TSR_OK;
bad:
    free(buf);
    free(e);
    return jerr(&j, file, "model.vocab", err);
}

int tsr_json_fast_vocab_set(tsr_tokenizer *t, const char *dec, const void *ents, int n, tsr_error *err) {
    const entry *e = ents;
    for (int k = 0; k < n; k++) {
        int rc = tsr_tok_set(t, (int)e[k].id, dec + e[k].off, e[k].len, TSR_TOKATTR_NORMAL, "model.vocab", err);
        if (rc) return rc;
    }
    return TSR_OK;
}

/* model.merges: ["a b", ...] or [["a", "b"], ...] */
int tsr_json_fast_merges(tsr_tokenizer *t, const char *s, size_t beg, size_t end, const char *file,
                         tsr_error *err) {
    jscan j = {s, end, beg + 1, NULL};
    /* count the elements for the hash table: top-level commas + 1 */
    uint64_t count = 0;
    {
        jscan c = {s, end, beg + 1, NULL};
        ws(&c);
        while (c.i < end && s[c.i] != ']') {
            if (skip(&c, 1)) break;
            count++;
            ws(&c);
            if (c.i < end && s[c.i] == ',') c.i++;
            else break;
            ws(&c);
        }
    }
    int rc = tsr_bpe_reserve_merges(t, count, err);
    if (rc) return rc;
    char *buf = malloc(end - beg + 1);
    if (!buf) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    char what[64];
    size_t idx = 0;
    ws(&j);
    if (j.i < end && s[j.i] == ']') j.i = end;
    while (j.i < end) {
        ws(&j);
        size_t st = j.i, al, bl;
        const char *a, *b;
        if (j.i < end && s[j.i] == '"') {
            if (str(&j, buf, &al)) goto bad;
            char *sp = memchr(buf, ' ', al);
            if (!sp || memchr(sp + 1, ' ', al - (size_t)(sp + 1 - buf))) {
                j.i = st;
                fail(&j, "not two tokens separated by one space");
                goto bad;
            }
            a = buf;
            b = sp + 1;
            bl = al - (size_t)(b - buf);
            al = (size_t)(sp - buf);
        } else if (j.i < end && s[j.i] == '[') {
            j.i++;
            ws(&j);
            if (str(&j, buf, &al)) goto pair;
            ws(&j);
            if (j.i >= end || s[j.i] != ',') goto pair;
            j.i++;
            ws(&j);
            if (str(&j, buf + al, &bl)) goto pair;
            ws(&j);
            if (j.i >= end || s[j.i] != ']') goto pair;
            j.i++;
            a = buf;
            b = buf + al;
        } else {
            fail(&j, "neither \"a b\" nor a pair of strings");
            goto bad;
        }
        rc = tsr_bpe_add_merge(t, a, al, b, bl, "model.merges", err);
        if (rc) {
            free(buf);
            if (err) { /* name the element only now: formatting it per merge is measurable */
                char msg[sizeof err->msg];
                snprintf(msg, sizeof msg, "model.merges[%zu]%s", idx, err->msg + strlen("model.merges"));
                memcpy(err->msg, msg, sizeof msg);
            }
            int line, col;
            where(s, st, &line, &col);
            if (err) {
                snprintf(err->file, sizeof err->file, "%s", file);
                err->line = line;
                err->col = col;
            }
            return rc;
        }
        idx++;
        ws(&j);
        if (j.i < end && s[j.i] == ',') {
            j.i++;
            continue;
        }
        if (j.i < end && s[j.i] == ']') break;
        fail(&j, "expected ',' or ']'");
        goto bad;
    }
    free(buf);
    return TSR_OK;
pair:
    j.why = "neither \"a b\" nor a pair of strings";
bad:
    free(buf);
    snprintf(what, sizeof what, "model.merges[%zu]", idx);
    return jerr(&j, file, what, err);
}
