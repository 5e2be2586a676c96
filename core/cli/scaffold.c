/* scaffold.c - see scaffold.h. The templates are the slot headers'
 * interfaces written out; @N@ stands for the plugin's name. */
#include "scaffold.h"

#include "../../slots/tsr_plugin.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct slot_tpl {
    const char *slot;
    const char *header;   /* slots/...h */
    const char *summary;  /* a line for the README and the manifest */
    const char *body;     /* the instance, the members, the interface table */
} slot_tpl;

static const slot_tpl templates[] = {
    {"gemv", "tsr_gemv.h", "every projection: y = x . W^T",
     "/* What prepare() makes of one stored weight. */\n"
     "typedef struct @N@_weight {\n"
     "    const tsr_weight *w; /* borrowed: outlives the handle */\n"
     "} @N@_weight;\n"
     "\n"
     "/* required: prepare w for run() (convert, transpose, quantise, or borrow).\n"
     " * TSR_ERR_UNSUPPORTED for a dtype this plugin does not read, and for a\n"
     " * scaled weight (tsr_weight_scale_of(p->ctx, w): FP8 checkpoints) whose\n"
     " * scales it does not apply. */\n"
     "static int @N@_prepare(void *inst, const tsr_weight *w, void **out) {\n"
     "    @N@ *p = inst;\n"
     "    (void)w;\n"
     "    *out = NULL;\n"
     "    p->ctx->host->set_error(p->ctx, \"@N@: prepare is not implemented yet\");\n"
     "    return TSR_ERR_NOT_IMPLEMENTED;\n"
     "}\n"
     "\n"
     "/* required: y[rows, w.rows] = x[rows, w.cols] . W^T, f32, on ex->device.\n"
     " * Use p->ctx->host->parallel_for for threads; never start threads. */\n"
     "static int @N@_run(void *inst, const void *prepared, int rows, const float *x, float *y,\n"
     "                   const tsr_exec *ex) {\n"
     "    @N@ *p = inst;\n"
     "    (void)prepared, (void)rows, (void)x, (void)y, (void)ex;\n"
     "    p->ctx->host->set_error(p->ctx, \"@N@: run is not implemented yet\");\n"
     "    return TSR_ERR_NOT_IMPLEMENTED;\n"
     "}\n"
     "\n"
     "static const tsr_gemv_i @N@_iface = {\n"
     "    .struct_size = sizeof(tsr_gemv_i),\n"
     "    .version = TSR_GEMV_IFACE_VERSION,\n"
     "    .prepare = @N@_prepare,\n"
     "    .release = NULL, /* optional (default: nothing): free a prepared handle */\n"
     "    .run = @N@_run,\n"
     "    .bytes = NULL,   /* optional (default: w->nbytes): bytes one pass reads */\n"
     "};\n"},
    {"attention", "tsr_attention.h", "softmax(q K^T * scale) V over the kv_cache plugin's view",
     "/* required: causal attention of every row over a->kv; row i is position\n"
     " * a->pos0 + i and sees KV tokens [0, pos0 + i] (and only the last\n"
     " * a->window of them when window > 0). TSR_ERR_UNSUPPORTED for a KV dtype\n"
     " * or layout it cannot read (declare what it reads under requires). */\n"
     "static int @N@_run(void *inst, const tsr_attn_args *a, const tsr_exec *ex) {\n"
     "    @N@ *p = inst;\n"
     "    (void)a, (void)ex;\n"
     "    p->ctx->host->set_error(p->ctx, \"@N@: run is not implemented yet\");\n"
     "    return TSR_ERR_NOT_IMPLEMENTED;\n"
     "}\n"
     "\n"
     "static const tsr_attention_i @N@_iface = {\n"
     "    .struct_size = sizeof(tsr_attention_i),\n"
     "    .version = TSR_ATTENTION_IFACE_VERSION,\n"
     "    .run = @N@_run,\n"
     "};\n"},
    {"kv_cache", "tsr_kv_cache.h", "where keys and values are kept",
     "/* required: reserve a sequence for up to max_tokens tokens of every layer;\n"
     " * TSR_ERR_RANGE when the budget cannot hold it. */\n"
     "static int @N@_seq_alloc(void *inst, int max_tokens, int *seq) {\n"
     "    @N@ *p = inst;\n"
     "    (void)max_tokens;\n"
     "    *seq = -1;\n"
     "    p->ctx->host->set_error(p->ctx, \"@N@: seq_alloc is not implemented yet\");\n"
     "    return TSR_ERR_NOT_IMPLEMENTED;\n"
     "}\n"
     "\n"
     "/* required: free a sequence; unknown ids are ignored. */\n"
     "static void @N@_seq_free(void *inst, int seq) {\n"
     "    (void)inst, (void)seq;\n"
     "}\n"
     "\n"
     "/* required: store rows tokens at [pos0, pos0 + rows) of layer (pos0 is the\n"
     " * layer's length). k, v: f32 [rows, n_kv_heads, head_dim]. */\n"
     "static int @N@_append(void *inst, int seq, int layer, int pos0, int rows, const float *k,\n"
     "                      const float *v, const tsr_exec *ex) {\n"
     "    @N@ *p = inst;\n"
     "    (void)seq, (void)layer, (void)pos0, (void)rows, (void)k, (void)v, (void)ex;\n"
     "    p->ctx->host->set_error(p->ctx, \"@N@: append is not implemented yet\");\n"
     "    return TSR_ERR_NOT_IMPLEMENTED;\n"
     "}\n"
     "\n"
     "/* required: a view of every token stored for layer (slots/tsr_kv_cache.h\n"
     " * describes the layouts; declare kv_dtype and kv_layout under provides). */\n"
     "static int @N@_view(void *inst, int seq, int layer, tsr_kv_view *out) {\n"
     "    @N@ *p = inst;\n"
     "    (void)seq, (void)layer, (void)out;\n"
     "    p->ctx->host->set_error(p->ctx, \"@N@: view is not implemented yet\");\n"
     "    return TSR_ERR_NOT_IMPLEMENTED;\n"
     "}\n"
     "\n"
     "/* required: shrink every layer of seq to n_tokens (rollback of rejected\n"
     " * drafts); above the current length is an error. */\n"
     "static int @N@_truncate(void *inst, int seq, int n_tokens) {\n"
     "    @N@ *p = inst;\n"
     "    (void)seq, (void)n_tokens;\n"
     "    p->ctx->host->set_error(p->ctx, \"@N@: truncate is not implemented yet\");\n"
     "    return TSR_ERR_NOT_IMPLEMENTED;\n"
     "}\n"
     "\n"
     "static const tsr_kv_cache_i @N@_iface = {\n"
     "    .struct_size = sizeof(tsr_kv_cache_i),\n"
     "    .version = TSR_KV_CACHE_IFACE_VERSION,\n"
     "    .seq_alloc = @N@_seq_alloc,\n"
     "    .seq_free = @N@_seq_free,\n"
     "    .append = @N@_append,\n"
     "    .view = @N@_view,\n"
     "    .truncate = @N@_truncate,\n"
     "    .usage = NULL, /* optional (default: 0 and 0): bytes in use and reserved */\n"
     "};\n"},
    {"drafter", "tsr_drafter.h", "speculative proposals the runtime verifies in one pass",
     "/* required: propose up to r->max_draft tokens that follow r->tokens into\n"
     " * out->tokens (out->n of them); set out->deterministic = 1 if each had\n"
     " * probability 1, else fill out->probs (when not NULL) with each proposal's\n"
     " * draft distribution. */\n"
     "static int @N@_propose(void *inst, const tsr_draft_req *r, tsr_draft_out *out) {\n"
     "    @N@ *p = inst;\n"
     "    (void)r;\n"
     "    out->n = 0;\n"
     "    p->ctx->host->set_error(p->ctx, \"@N@: propose is not implemented yet\");\n"
     "    return TSR_ERR_NOT_IMPLEMENTED;\n"
     "}\n"
     "\n"
     "static const tsr_drafter_i @N@_iface = {\n"
     "    .struct_size = sizeof(tsr_drafter_i),\n"
     "    .version = TSR_DRAFTER_IFACE_VERSION,\n"
     "    .propose = @N@_propose,\n"
     "    .accept = NULL,  /* optional (default: nothing): how many proposals were accepted */\n"
     "    .seq_end = NULL, /* optional (default: nothing): drop a finished sequence's state */\n"
     "};\n"},
    {"expert_cache", "tsr_expert_cache.h", "which experts' prepared weights are resident",
     "/* required: called once after init for a mixture-of-experts model; keep\n"
     " * src (it outlives the instance) and load experts through it. */\n"
     "static int @N@_attach(void *inst, const tsr_expert_source *src) {\n"
     "    @N@ *p = inst;\n"
     "    (void)src;\n"
     "    p->ctx->host->set_error(p->ctx, \"@N@: attach is not implemented yet\");\n"
     "    return TSR_ERR_NOT_IMPLEMENTED;\n"
     "}\n"
     "\n"
     "/* required: out[i] = prepared weights of experts[i] in layer, all valid\n"
     " * until the next lookup; count a hit or a miss per id; TSR_ERR_RANGE if n\n"
     " * experts cannot be held at once. */\n"
     "static int @N@_lookup(void *inst, int layer, int n, const int32_t *experts,\n"
     "                      const tsr_expert_weights **out) {\n"
     "    @N@ *p = inst;\n"
     "    (void)layer, (void)n, (void)experts, (void)out;\n"
     "    p->ctx->host->set_error(p->ctx, \"@N@: lookup is not implemented yet\");\n"
     "    return TSR_ERR_NOT_IMPLEMENTED;\n"
     "}\n"
     "\n"
     "/* required: counters since init. */\n"
     "static void @N@_stats(void *inst, tsr_expert_stats *out) {\n"
     "    (void)inst;\n"
     "    memset(out, 0, sizeof *out);\n"
     "}\n"
     "\n"
     "static const tsr_expert_cache_i @N@_iface = {\n"
     "    .struct_size = sizeof(tsr_expert_cache_i),\n"
     "    .version = TSR_EXPERT_CACHE_IFACE_VERSION,\n"
     "    .attach = @N@_attach,\n"
     "    .lookup = @N@_lookup,\n"
     "    .stats = @N@_stats,\n"
     "    .prefetch = NULL, /* optional (default: nothing): a hint of lookups to come */\n"
     "};\n"},
};

static const char *slot_enum(const char *slot) {
    if (!strcmp(slot, "gemv")) return "TSR_SLOT_GEMV";
    if (!strcmp(slot, "attention")) return "TSR_SLOT_ATTENTION";
    if (!strcmp(slot, "kv_cache")) return "TSR_SLOT_KV_CACHE";
    if (!strcmp(slot, "drafter")) return "TSR_SLOT_DRAFTER";
    return "TSR_SLOT_EXPERT_CACHE";
}

/* text with every @N@ replaced by name; NULL on no memory. */
static char *subst(const char *text, const char *name) {
    size_t n = 0, ln = strlen(name);
    for (const char *p = text; (p = strstr(p, "@N@")); p += 3) n++;
    size_t size = strlen(text) + n * ln + 1;
    char *out = malloc(size), *o = out;
    if (!out) return NULL;
    for (const char *p = text;;) {
        const char *q = strstr(p, "@N@");
        size_t len = q ? (size_t)(q - p) : strlen(p);
        memcpy(o, p, len);
        o += len;
        if (!q) break;
        memcpy(o, name, ln);
        o += ln;
        p = q + 3;
    }
    *o = '\0';
    return out;
}

static int valid_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 48 || s[0] < 'a' || s[0] > 'z') return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_')) return 0;
    return 1;
}

static int write_file(const char *path, const char *text, tsr_error *err) {
    FILE *f = fopen(path, "wx"); /* never overwrite */
    if (!f) return tsr_error_set(err, TSR_ERR_IO, "%s: %s", path, strerror(errno));
    size_t len = strlen(text);
    int bad = fwrite(text, 1, len, f) != len;
    bad |= fclose(f) != 0;
    if (bad) {
        unlink(path);
        return tsr_error_set(err, TSR_ERR_IO, "%s: write failed", path);
    }
    return TSR_OK;
}

static char *source_text(const slot_tpl *t, const char *name) {
    static const char head[] =
        "/*\n"
        " * @N@ - a @SLOT@ plugin: @SUMMARY@.\n"
        " *\n"
        " * Scaffolded by `tessera plugins new`: every required member of the\n"
        " * interface is a stub returning TSR_ERR_NOT_IMPLEMENTED, so the\n"
        " * conformance harness fails this plugin's cases until they are written.\n"
        " * The host gives everything through ctx->host (alloc/free, parallel_for,\n"
        " * param, set_error, log); never link the host, never start threads,\n"
        " * run no code at load (no constructors).\n"
        " */\n"
        "#include <string.h>\n"
        "\n"
        "#include \"slots/@HEADER@\"\n"
        "\n"
        "typedef struct @N@ {\n"
        "    const tsr_plugin_ctx *ctx;\n"
        "} @N@;\n"
        "\n"
        "/* required: set up the zeroed instance (read params with\n"
        " * ctx->host->param(ctx, \"name\")). On failure: set_error, a negative status. */\n"
        "static int @N@_init(void *inst, const tsr_plugin_ctx *ctx) {\n"
        "    ((@N@ *)inst)->ctx = ctx;\n"
        "    return TSR_OK;\n"
        "}\n"
        "\n"
        "/* optional: release what init (and later calls) acquired; copes with a\n"
        " * partly initialised instance. */\n"
        "static void @N@_fini(void *inst) {\n"
        "    (void)inst;\n"
        "}\n"
        "\n";
    static const char tail[] =
        "\n"
        "static const tsr_plugin_desc @N@_desc = {\n"
        "    .abi_major = TSR_ABI_MAJOR,\n"
        "    .abi_minor = TSR_ABI_MINOR,\n"
        "    .name = \"@N@\",\n"
        "    .slot = @ENUM@,\n"
        "    .version = \"0.1.0\", /* equals the manifest's version */\n"
        "    .instance_size = sizeof(@N@),\n"
        "    /* must agree with the manifest: devices and exactness */\n"
        "    .caps = TSR_CAP_DEVICE_CPU | TSR_CAP_EXACT,\n"
        "    .init = @N@_init,\n"
        "    .fini = @N@_fini,\n"
        "    .iface = &@N@_iface,\n"
        "};\n"
        "\n"
        "TSR_PLUGIN_EXPORT const tsr_plugin_desc *TSR_PLUGIN_ENTRY(void) { return &@N@_desc; }\n";
    size_t size = sizeof head + strlen(t->body) + sizeof tail + 256;
    char *text = malloc(size);
    if (!text) return NULL;
    snprintf(text, size, "%s%s%s", head, t->body, tail);
    /* the few per-slot words, then the name */
    const char *keys[] = {"@SLOT@", "@SUMMARY@", "@HEADER@", "@ENUM@"};
    const char *vals[] = {t->slot, t->summary, t->header, slot_enum(t->slot)};
    for (int k = 0; k < 4; k++) {
        char *at = strstr(text, keys[k]);
        if (!at) continue;
        size_t need = strlen(text) - strlen(keys[k]) + strlen(vals[k]) + 1;
        char *next = malloc(need);
        if (!next) {
            free(text);
            return NULL;
        }
        snprintf(next, need, "%.*s%s%s", (int)(at - text), text, vals[k], at + strlen(keys[k]));
        free(text);
        text = next;
    }
    char *out = subst(text, name);
    free(text);
    return out;
}

int tsr_scaffold_plugin(const char *root, const char *slot, const char *name, char *paths, size_t size,
                        tsr_error *err) {
    const slot_tpl *t = NULL;
    for (size_t i = 0; i < sizeof templates / sizeof templates[0]; i++)
        if (slot && !strcmp(slot, templates[i].slot)) t = &templates[i];
    if (!t)
        return tsr_error_set(err, TSR_ERR_INVALID,
                             "unknown slot '%s' (gemv, attention, kv_cache, drafter, expert_cache)", slot ? slot : "");
    if (!name || !valid_name(name))
        return tsr_error_set(err, TSR_ERR_INVALID,
                             "bad plugin name '%s': a lowercase letter, then lowercase letters, digits or '_' "
                             "(at most 48)",
                             name ? name : "");
    char dir[1024], src[1200], cml[1200], readme[1200], man[1200];
    snprintf(dir, sizeof dir, "%s/plugins/%s", root, name);
    snprintf(src, sizeof src, "%s/%s.c", dir, name);
    snprintf(cml, sizeof cml, "%s/CMakeLists.txt", dir);
    snprintf(readme, sizeof readme, "%s/README.md", dir);
    snprintf(man, sizeof man, "%s/manifests/%s.yaml", root, name);
    struct stat st;
    if (stat(dir, &st) == 0) return tsr_error_set(err, TSR_ERR_REFUSED, "%s exists already", dir);
    if (stat(man, &st) == 0) return tsr_error_set(err, TSR_ERR_REFUSED, "%s exists already", man);
    char mdir[1100];
    snprintf(mdir, sizeof mdir, "%s/manifests", root);
    if (stat(mdir, &st) != 0 || !S_ISDIR(st.st_mode))
        return tsr_error_set(err, TSR_ERR_INVALID, "%s is not a tessera source tree (no manifests/ folder)", root);

    static const char cml_tpl[] =
        "tessera_add_plugin(@N@ SOURCES @N@.c)\n"
        "# The plugin's own tests (CMocka), beside the conformance harness, e.g.:\n"
        "# if(CMOCKA_FOUND)\n"
        "#   tessera_add_test(test_@N@ SOURCES test_@N@.c LIBS tsr_util LABELS plugins)\n"
        "# endif()\n";
    static const char readme_tpl[] =
        "# @N@ — (one line: what it does)\n"
        "\n"
        "- **Technique**: (what it does, in a few sentences; cite the idea it builds on).\n"
        "- **When it helps**: (models, shapes, machines where it wins; measured with `tessera ablate` once that\n"
        "  command lands, until then with `tessera run ... -n 64`, median of >= 3 runs).\n"
        "- **Quality contract**: exact (output identical to the slot's reference plugin within the conformance\n"
        "  harness's tolerance) — or lossy with the bound declared in the manifest's `quality`.\n"
        "- **Limits**: (dtypes, layouts, shapes, devices it refuses, with TSR_ERR_UNSUPPORTED).\n"
        "- **Params**: none yet (declare each under `params` in manifests/@N@.yaml).\n"
        "\n"
        "Status: scaffolded; every member returns TSR_ERR_NOT_IMPLEMENTED, so\n"
        "`test_conformance @N@` fails until it is implemented (see CONTRIBUTING.md).\n";
    char man_tpl[1024];
    snprintf(man_tpl, sizeof man_tpl,
             "name: @N@\n"
             "slot: %s\n"
             "version: 0.1.0\n"
             "abi: \"%d.%d\"\n"
             "library: lib@N@.so\n"
             "sha256: \"@SHA256@\"\n"
             "devices: [cpu]\n"
             "# exact: identical to the reference within the harness's tolerance; else\n"
             "# exactness: lossy plus quality: {max_mean_kl: ..., max_ppl_ratio: ...}\n"
             "exactness: exact\n"
             "description: \"(one line)\"\n"
             "# provides:   capabilities other slots' plugins may require\n"
             "# requires:   e.g. kv_cache.kv_dtype: [f32]\n"
             "# params:     e.g. threads: {type: int, default: 0, min: 0, max: 256, description: \"...\"}\n",
             t->slot, TSR_ABI_MAJOR, TSR_ABI_MINOR);

    char *texts[4] = {source_text(t, name), subst(cml_tpl, name), subst(readme_tpl, name), subst(man_tpl, name)};
    const char *files[4] = {src, cml, readme, man};
    int rc = TSR_OK, written = 0;
    for (int i = 0; i < 4; i++)
        if (!texts[i]) rc = tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    if (rc == TSR_OK && mkdir(dir, 0755) != 0) rc = tsr_error_set(err, TSR_ERR_IO, "%s: %s", dir, strerror(errno));
    for (int i = 0; i < 4 && rc == TSR_OK; i++)
        if ((rc = write_file(files[i], texts[i], err)) == TSR_OK) written++;
    if (rc != TSR_OK) { /* leave nothing half made */
        for (int i = 0; i < written; i++) unlink(files[i]);
        if (written || access(dir, F_OK) == 0) rmdir(dir);
    }
    if (rc == TSR_OK && paths)
        snprintf(paths, size, "%s\n%s\n%s\n%s\n", src, cml, readme, man);
    for (int i = 0; i < 4; i++) free(texts[i]);
    return rc;
}
