/* Model files: every fixture and stories260K in each of its formats opens
 * with the right config; the formats agree tensor for tensor; bad files
 * (built here, table-driven) are refused with the right code and a message
 * naming the file and the field or tensor, never a crash. */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "core/format/format_internal.h"
#include "core/format/gguf.h"
#include "core/format/model_file.h"
#include "core/format/safetensors.h"
#include "kernels/dtype.h"

static char g_src[1024];
static char g_tmp[1024];

static const char *src_path(char *buf, size_t n, const char *rel) {
    snprintf(buf, n, "%s/%s", g_src, rel);
    return buf;
}

static void print_err(const tsr_error *e) {
    char buf[2048];
    print_message("  -> %s\n", tsr_error_format(e, buf, sizeof buf));
}

/* --- fixtures -------------------------------------------------------------------------- */

static const tsr_model_config *open_fixture(const char *fam, tsr_model_file **f) {
    char p[1200], rel[128];
    snprintf(rel, sizeof rel, "tests/data/fixtures/transformers/%s", fam);
    tsr_error e;
    tsr_error_clear(&e);
    int rc = tsr_model_file_open(src_path(p, sizeof p, rel), f, &e);
    if (rc) print_err(&e);
    assert_int_equal(rc, TSR_OK);
    assert_int_equal(tsr_model_file_format(*f), TSR_FORMAT_SAFETENSORS);
    return tsr_model_file_config(*f);
}

static void check_common(const tsr_model_config *c) {
    assert_int_equal(c->vocab, 512);
    assert_int_equal(c->hidden, 64);
    assert_int_equal(c->n_layers, 2);
    assert_int_equal(c->n_heads, 4);
    assert_int_equal(c->n_kv_heads, 2);
    assert_int_equal(c->head_dim, 16);
    assert_int_equal(c->max_ctx, 256);
    assert_true(c->norm_eps == 1e-5f);
    assert_int_equal(c->rope_interleaved, 0);
    assert_int_equal(c->rope_scaling, TSR_ROPE_NONE);
    assert_int_equal(c->tie_embeddings, 0);
    assert_int_equal(c->bos, 1);
    assert_int_equal(c->n_eos, 1);
    assert_int_equal(c->eos[0], 2);
    assert_int_equal(c->dtype, TSR_DTYPE_F32);
    assert_int_equal(c->sliding_window, 0);
}

static void test_fixture_llama(void **state) {
    (void)state;
    tsr_model_file *f;
    const tsr_model_config *c = open_fixture("llama", &f);
    check_common(c);
    assert_int_equal(c->arch, TSR_ARCH_LLAMA);
    assert_string_equal(c->arch_name, "llama");
    assert_int_equal(c->ffn, 128);
    assert_true(c->rope_theta == 10000.0f);
    assert_int_equal(c->attn_bias + c->attn_out_bias + c->qk_norm + c->n_experts, 0);
    const tsr_tensor *t = tsr_model_file_tensor(f, "model.layers.1.self_attn.k_proj.weight");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->shape[0], 32);
    assert_int_equal(t->shape[1], 64);
    assert_int_equal(t->nbytes, 32 * 64 * 4);
    assert_null(tsr_model_file_tensor(f, "model.layers.2.self_attn.k_proj.weight"));
    assert_null(tsr_model_file_gguf(f));
    /* 2 layers x 9 + embed, norm, lm_head */
    assert_int_equal(tsr_model_file_n_tensors(f), 21);
    uint64_t sum = 0;
    for (int i = 0; i < tsr_model_file_n_tensors(f); i++)
        sum += tsr_model_file_tensor_at(f, i)->nbytes;
    assert_int_equal(sum, tsr_model_file_bytes(f));
    assert_true(strstr(tsr_model_file_dir(f), "fixtures/transformers/llama") != NULL);
    tsr_model_file_close(f);
}

static void test_fixture_qwen2(void **state) {
    (void)state;
    tsr_model_file *f;
    const tsr_model_config *c = open_fixture("qwen2", &f);
    check_common(c);
    assert_int_equal(c->arch, TSR_ARCH_QWEN2);
    assert_int_equal(c->attn_bias, 1);
    assert_int_equal(c->attn_out_bias, 0);
    assert_int_equal(c->qk_norm, 0);
    assert_true(c->rope_theta == 1e6f);
    const tsr_tensor *t = tsr_model_file_tensor(f, "model.layers.0.self_attn.v_proj.bias");
    assert_non_null(t);
    assert_int_equal(t->shape[0], 32);
    tsr_model_file_close(f);
}

static void test_fixture_qwen3(void **state) {
    (void)state;
    tsr_model_file *f;
    const tsr_model_config *c = open_fixture("qwen3", &f);
    check_common(c);
    assert_int_equal(c->arch, TSR_ARCH_QWEN3);
    assert_int_equal(c->qk_norm, 1);
    assert_int_equal(c->attn_bias, 0);
    assert_int_equal(c->head_dim, 16);
    assert_non_null(tsr_model_file_tensor(f, "model.layers.1.self_attn.k_norm.weight"));
    tsr_model_file_close(f);
}

static void test_fixture_qwen3_moe(void **state) {
    (void)state;
    tsr_model_file *f;
    const tsr_model_config *c = open_fixture("qwen3_moe", &f);
    check_common(c);
    assert_int_equal(c->arch, TSR_ARCH_QWEN3_MOE);
    assert_int_equal(c->n_experts, 8);
    assert_int_equal(c->n_experts_used, 2);
    assert_int_equal(c->norm_topk_prob, 1);
    assert_int_equal(c->expert_ffn, 32);
    assert_int_equal(c->shared_expert_ffn, 0);
    assert_int_equal(c->ffn, 0); /* every layer is MoE: no dense MLP */
    assert_int_equal(c->qk_norm, 1);
    assert_int_equal(c->layer_moe[0], 1);
    assert_int_equal(c->layer_moe[1], 1);
    const tsr_tensor *t = tsr_model_file_tensor(f, "model.layers.1.mlp.experts.7.down_proj.weight");
    assert_non_null(t);
    assert_int_equal(t->shape[0], 64);
    assert_int_equal(t->shape[1], 32);
    tsr_model_file_close(f);
}

static void test_fixture_mixtral(void **state) {
    (void)state;
    tsr_model_file *f;
    const tsr_model_config *c = open_fixture("mixtral", &f);
    check_common(c);
    assert_int_equal(c->arch, TSR_ARCH_MIXTRAL);
    assert_int_equal(c->n_experts, 8);
    assert_int_equal(c->n_experts_used, 2);
    assert_int_equal(c->expert_ffn, 128);
    assert_int_equal(c->norm_topk_prob, 1);
    assert_true(c->rope_theta == 1e6f);
    for (int i = 0; i < c->n_layers; i++) assert_int_equal(c->layer_moe[i], 1);
    assert_non_null(tsr_model_file_tensor(f, "model.layers.0.block_sparse_moe.experts.3.w2.weight"));
    tsr_model_file_close(f);
}

static void test_reference_safetensors(void **state) {
    (void)state;
    char p[1200];
    tsr_safetensors *st;
    tsr_error e;
    int rc = tsr_safetensors_open(
        src_path(p, sizeof p, "tests/data/fixtures/transformers/qwen3/reference.safetensors"), &st,
        &e);
    if (rc) print_err(&e);
    assert_int_equal(rc, TSR_OK);
    assert_int_equal(tsr_safetensors_n_tensors(st), 3);
    const tsr_tensor *ids = tsr_safetensors_find(st, "input_ids");
    const tsr_tensor *lg = tsr_safetensors_find(st, "logits");
    const tsr_tensor *gr = tsr_safetensors_find(st, "greedy_ids");
    assert_non_null(ids);
    assert_non_null(lg);
    assert_non_null(gr);
    assert_int_equal(ids->dtype, TSR_DTYPE_I32);
    assert_int_equal(ids->shape[0], 24);
    assert_int_equal(lg->dtype, TSR_DTYPE_F32);
    assert_int_equal(lg->n_dims, 2);
    assert_int_equal(lg->shape[0], 24);
    assert_int_equal(lg->shape[1], 512);
    assert_int_equal(gr->shape[0], 16);
    for (int i = 0; i < 24; i++) {
        int32_t v;
        memcpy(&v, (const char *)ids->data + 4 * i, 4);
        assert_true(v >= 0 && v < 512);
    }
    float l0[512];
    tsr_dequant_row(TSR_DTYPE_F32, lg->data, l0, 512);
    for (int i = 0; i < 512; i++) assert_true(isfinite(l0[i]));
    assert_string_equal(tsr_safetensors_metadata(st, "transformers"), "5.17.0");
    assert_null(tsr_safetensors_metadata(st, "nope"));
    assert_null(tsr_safetensors_tensor_at(st, 3));
    tsr_safetensors_free(st);
}

/* --- stories260K in four formats ------------------------------------------------------- */

static tsr_model_file *open_rel(const char *rel) {
    char p[1200];
    tsr_model_file *f = NULL;
    tsr_error e;
    int rc = tsr_model_file_open(src_path(p, sizeof p, rel), &f, &e);
    if (rc) print_err(&e);
    assert_int_equal(rc, TSR_OK);
    return f;
}

static void check_stories_cfg(const tsr_model_config *c, int interleaved, int ctx, int tie) {
    assert_int_equal(c->arch, TSR_ARCH_LLAMA);
    assert_int_equal(c->vocab, 512);
    assert_int_equal(c->hidden, 64);
    assert_int_equal(c->ffn, 172);
    assert_int_equal(c->n_layers, 5);
    assert_int_equal(c->n_heads, 8);
    assert_int_equal(c->n_kv_heads, 4);
    assert_int_equal(c->head_dim, 8);
    assert_int_equal(c->tie_embeddings, tie);
    assert_true(fabsf(c->norm_eps - 1e-5f) < 1e-12f);
    assert_true(c->rope_theta == 10000.0f);
    assert_int_equal(c->rope_interleaved, interleaved);
    assert_int_equal(c->max_ctx, ctx);
    assert_int_equal(c->bos, 1);
    assert_int_equal(c->n_eos, 1);
    assert_int_equal(c->eos[0], 2);
}

static float *read_tensor(const tsr_tensor *t) {
    uint64_t n = t->nbytes / (uint64_t)tsr_dtype_block_bytes(t->dtype) *
                 (uint64_t)tsr_dtype_block_elems(t->dtype);
    float *v = malloc(n * sizeof *v + 4);
    assert_non_null(v);
    tsr_dequant_row(t->dtype, t->data, v, (int64_t)n);
    return v;
}

/* Resident kB of the mapping that holds p (/proc/self/smaps), -1 if none. */
static long rss_kb_of(const void *p) {
    FILE *fp = fopen("/proc/self/smaps", "r");
    if (!fp) return -1;
    char line[512];
    int in = 0;
    long kb = -1;
    while (fgets(line, sizeof line, fp)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
            continue;
        }
        if (in && sscanf(line, "Rss: %ld kB", &kb) == 1) break;
    }
    fclose(fp);
    return kb;
}

/* Giving back the pages of a tensor a reader copied: resident memory drops by
 * what was given back, the bytes read afterwards are the same (read from the
 * file by tsr_model_file_read without mapping a page again, then through
 * the mapping), and a range outside the file's mappings is left alone. */
static void test_give_back(void **state) {
    (void)state;
    const char *rels[] = {"models/stories260K/stories260K.gguf", "models/stories260K/hf",
                          "models/stories260K/stories260K.bin"};
    long page = sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < sizeof rels / sizeof *rels; i++) {
        tsr_model_file *f = open_rel(rels[i]);
        const tsr_tensor *t = tsr_model_file_tensor(f, "model.embed_tokens.weight");
        assert_non_null(t);
        assert_true(t->nbytes >= (uint64_t)(4 * page));
        uint8_t *copy = malloc(t->nbytes);
        assert_non_null(copy);
        memcpy(copy, t->data, t->nbytes); /* every page of the tensor resident */
        long before = rss_kb_of(t->data);
        uint64_t got = tsr_model_file_give_back(f, t->data, t->nbytes);
        long after = rss_kb_of(t->data);
        print_message("  %s: %llu of %llu bytes given back, mapping %ld -> %ld kB resident\n", rels[i],
                      (unsigned long long)got, (unsigned long long)t->nbytes, before, after);
        assert_true(got > 0 && got % (uint64_t)page == 0 && got <= t->nbytes &&
                    got + 2 * (uint64_t)page > t->nbytes);
        assert_true(before >= 0 && after >= 0);
        assert_int_equal(before - after, (long)(got / 1024));
        /* read from the file, not through the mapping: the same bytes, no page made resident */
        uint8_t *via = malloc(t->nbytes);
        assert_non_null(via);
        assert_int_equal(tsr_model_file_read(f, t->data, t->nbytes, via), 1);
        assert_memory_equal(via, copy, t->nbytes);
        assert_int_equal(rss_kb_of(t->data), after);
        assert_int_equal(tsr_model_file_read(f, via, 16, copy), 0); /* not in a file of f */
        assert_int_equal(tsr_model_file_read(f, t->data, (uint64_t)1 << 40, via), 0);
        free(via);
        assert_memory_equal(t->data, copy, t->nbytes); /* faulted back from the file */
        /* not in a mapping of f: a heap block, a range running past the file */
        memset(copy, 0x5a, t->nbytes);
        assert_int_equal(tsr_model_file_give_back(f, copy, t->nbytes), 0);
        for (uint64_t k = 0; k < t->nbytes; k++) assert_int_equal(copy[k], 0x5a);
        assert_int_equal(tsr_model_file_give_back(f, t->data, (uint64_t)1 << 40), 0);
        assert_int_equal(tsr_model_file_give_back(f, NULL, 4096), 0);
        free(copy);
        tsr_model_file_close(f);
    }
}

/* exact: 0 for bitwise equality; 1: b holds a's values rounded to f16 */
static void compare_tensor(const tsr_model_file *a, const tsr_model_file *b, const char *name,
                           int f16) {
    const tsr_tensor *ta = tsr_model_file_tensor(a, name), *tb = tsr_model_file_tensor(b, name);
    if (!ta || !tb) print_message("missing %s\n", name);
    assert_non_null(ta);
    assert_non_null(tb);
    assert_int_equal(ta->n_dims, tb->n_dims);
    for (int d = 0; d < ta->n_dims; d++) assert_int_equal(ta->shape[d], tb->shape[d]);
    float *va = read_tensor(ta), *vb = read_tensor(tb);
    uint64_t n = ta->nbytes / 4;
    for (uint64_t i = 0; i < n; i++) {
        float want = f16 && tb->dtype == TSR_DTYPE_F16 ? tsr_f16_to_f32(tsr_f32_to_f16(va[i]))
                                                         : va[i];
        if (vb[i] != want) print_message("%s[%llu]: %g vs %g\n", name, (unsigned long long)i,
                                         (double)vb[i], (double)want);
        assert_true(vb[i] == want);
    }
    free(va);
    free(vb);
}

/* HF's q/k rows are llama2.c's rows permuted from interleaved pairs to
 * halves: hf[h*hd + j*hd/2 + i] = orig[h*hd + 2*i + j]. */
static void compare_permuted(const tsr_model_file *orig, const tsr_model_file *hf,
                             const char *name, int heads, int hd) {
    const tsr_tensor *to = tsr_model_file_tensor(orig, name), *th = tsr_model_file_tensor(hf, name);
    assert_non_null(to);
    assert_non_null(th);
    assert_int_equal(to->shape[0], heads * hd);
    assert_int_equal(th->shape[0], heads * hd);
    int64_t cols = to->shape[1];
    const float *o = to->data, *h = th->data;
    int differs = 0;
    for (int hh = 0; hh < heads; hh++)
        for (int j = 0; j < 2; j++)
            for (int i = 0; i < hd / 2; i++) {
                int64_t rh = hh * hd + j * hd / 2 + i, ro = hh * hd + 2 * i + j;
                assert_memory_equal(h + rh * cols, o + ro * cols, (size_t)cols * 4);
                differs |= rh != ro && memcmp(h + rh * cols, h + ro * cols, (size_t)cols * 4);
            }
    assert_true(differs); /* the permutation is not the identity on this data */
}

static void test_stories_formats(void **state) {
    (void)state;
    tsr_model_file *hf = open_rel("models/stories260K/hf");
    tsr_model_file *gg = open_rel("models/stories260K/stories260K.gguf");
    tsr_model_file *g16 = open_rel("models/stories260K/stories260K-f16.gguf");
    tsr_model_file *bin = open_rel("models/stories260K/stories260K.bin");
    /* llama.cpp's converter stored context 128 and wrote the tied classifier
     * out as output.weight: those GGUFs are untied with an equal lm_head */
    check_stories_cfg(tsr_model_file_config(hf), 0, 512, 1);
    check_stories_cfg(tsr_model_file_config(gg), 1, 128, 0);
    check_stories_cfg(tsr_model_file_config(g16), 1, 128, 0);
    check_stories_cfg(tsr_model_file_config(bin), 1, 512, 1);
    assert_int_equal(tsr_model_file_format(gg), TSR_FORMAT_GGUF);
    assert_int_equal(tsr_model_file_format(bin), TSR_FORMAT_LLAMA2C);
    assert_non_null(tsr_model_file_gguf(gg));
    assert_int_equal(tsr_model_file_config(gg)->dtype, TSR_DTYPE_F32);
    assert_int_equal(tsr_model_file_config(g16)->dtype, TSR_DTYPE_F16);
    assert_int_equal(tsr_model_file_config(bin)->dtype, TSR_DTYPE_F32);
    assert_null(tsr_model_file_tensor(bin, "lm_head.weight"));
    assert_null(tsr_model_file_tensor(hf, "lm_head.weight"));
    {
        const tsr_tensor *e = tsr_model_file_tensor(bin, "model.embed_tokens.weight");
        const tsr_tensor *o = tsr_model_file_tensor(gg, "lm_head.weight");
        assert_non_null(o);
        assert_int_equal(o->nbytes, e->nbytes);
        assert_memory_equal(o->data, e->data, (size_t)e->nbytes);
    }
    /* llama2.c and GGUF keep the interleaved q/k rows: equal everywhere */
    assert_int_equal(tsr_model_file_n_tensors(bin), 2 + 9 * 5);
    for (int i = 0; i < tsr_model_file_n_tensors(bin); i++) {
        const char *name = tsr_model_file_tensor_at(bin, i)->name;
        compare_tensor(bin, gg, name, 0);
        compare_tensor(bin, g16, name, 1);
        if (strstr(name, "q_proj") || strstr(name, "k_proj")) continue;
        compare_tensor(bin, hf, name, 0);
    }
    for (int l = 0; l < 5; l++) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_proj.weight", l);
        compare_permuted(bin, hf, name, 8, 8);
        snprintf(name, sizeof name, "model.layers.%d.self_attn.k_proj.weight", l);
        compare_permuted(bin, hf, name, 4, 8);
    }
    /* GGUF metadata through the reader */
    const tsr_gguf *g = tsr_model_file_gguf(gg);
    uint64_t len;
    const char *arch = tsr_gguf_get_str(g, tsr_gguf_find(g, "general.architecture"), &len);
    assert_non_null(arch);
    assert_int_equal(len, 5);
    assert_memory_equal(arch, "llama", 5);
    tsr_gguf_type et;
    uint64_t n;
    assert_int_equal(tsr_gguf_get_arr(g, tsr_gguf_find(g, "tokenizer.ggml.tokens"), &et, &n, NULL), 0);
    assert_int_equal(et, TSR_GGUF_STRING);
    assert_int_equal(n, 512);
    const char *tok = tsr_gguf_get_arr_str(g, tsr_gguf_find(g, "tokenizer.ggml.tokens"), 1, &len);
    assert_non_null(tok);
    assert_int_equal(len, 3);
    assert_memory_equal(tok, "<s>", 3);
    tsr_model_file_close(hf);
    tsr_model_file_close(gg);
    tsr_model_file_close(g16);
    tsr_model_file_close(bin);
}

static void test_sharded(void **state) {
    (void)state;
    const char *sh = getenv("TESSERA_SHARED_DIR");
    char p[1200];
    struct stat st;
    snprintf(p, sizeof p, "%s/data/models/pystd/target", sh ? sh : "");
    if (!sh || stat(p, &st) != 0) {
        print_message("skipped: TESSERA_SHARED_DIR/data/models/pystd/target is absent\n");
        skip();
    }
    tsr_model_file *f;
    tsr_error e;
    int rc = tsr_model_file_open(p, &f, &e);
    if (rc) print_err(&e);
    assert_int_equal(rc, TSR_OK);
    const tsr_model_config *c = tsr_model_file_config(f);
    assert_int_equal(c->arch, TSR_ARCH_QWEN3);
    assert_int_equal(c->dtype, TSR_DTYPE_BF16);
    assert_int_equal(c->head_dim, 64);
    assert_int_equal(c->n_layers, 6);
    assert_int_equal(c->tie_embeddings, 1);
    assert_int_equal(c->vocab, 4096);
    assert_int_equal(c->n_eos, 1);
    assert_int_equal(c->eos[0], 0);
    /* the index's tensors, from both shards: 6 layers x 11 + embed + norm */
    assert_int_equal(tsr_model_file_n_tensors(f), 6 * 11 + 2);
    assert_int_equal(tsr_model_file_bytes(f), 22031616);
    tsr_model_file_close(f);
}

/* An index over one linked shard: good, then with a bad shard name and a
 * tensor the shard lacks. */
static void index_case(const char *extra, int code, const char *needle) {
    char dir[1200], p[1300], w[1300];
    snprintf(dir, sizeof dir, "%s/idx", g_tmp);
    mkdir(dir, 0700);
    snprintf(p, sizeof p, "%s/config.json", dir);
    src_path(w, sizeof w, "tests/data/fixtures/transformers/llama/config.json");
    assert_int_equal(symlink(w, p), 0);
    snprintf(p, sizeof p, "%s/model-1.safetensors", dir);
    src_path(w, sizeof w, "tests/data/fixtures/transformers/llama/model.safetensors");
    assert_int_equal(symlink(w, p), 0);
    tsr_safetensors *st;
    tsr_error e;
    assert_int_equal(tsr_safetensors_open(w, &st, &e), TSR_OK);
    json_t *wm = json_object();
    for (int i = 0; i < tsr_safetensors_n_tensors(st); i++)
        json_object_set_new(wm, tsr_safetensors_tensor_at(st, i)->name,
                            json_string("model-1.safetensors"));
    tsr_safetensors_free(st);
    if (extra) json_object_set_new(wm, extra, json_string(strchr(extra, '/') ? extra
                                                                             : "model-1.safetensors"));
    json_t *root = json_pack("{s:{s:i},s:o}", "metadata", "total_size", 1, "weight_map", wm);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    assert_int_equal(json_dump_file(root, p, 0), 0);
    json_decref(root);
    tsr_model_file *f = NULL;
    tsr_error_clear(&e);
    int rc = tsr_model_file_open(dir, &f, &e);
    if (rc != code) print_err(&e);
    assert_int_equal(rc, code);
    if (code == TSR_OK) {
        assert_int_equal(tsr_model_file_n_tensors(f), 21);
        tsr_model_file_close(f);
    } else {
        assert_string_equal(e.file, p);
        assert_non_null(strstr(e.msg, needle));
    }
    unlink(p);
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model-1.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

static void test_sharded_index_errors(void **state) {
    (void)state;
    index_case(NULL, TSR_OK, NULL);
    index_case("model.extra.weight", TSR_ERR_FORMAT,
               "tensor \"model.extra.weight\" listed in \"weight_map\" is not in shard "
               "model-1.safetensors");
    index_case("../evil.safetensors", TSR_ERR_FORMAT, "plain file name");
}

/* --- safetensors bad files ---------------------------------------------------------------- */

/* A small valid file: header then data; hdr is the JSON text. */
static uint8_t *make_st(const char *hdr, uint64_t data_len, uint64_t *size) {
    uint64_t hl = strlen(hdr);
    *size = 8 + hl + data_len;
    uint8_t *b = calloc(1, *size + 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hl >> (8 * i));
    memcpy(b + 8, hdr, hl);
    for (uint64_t i = 0; i < data_len; i++) b[8 + hl + i] = (uint8_t)(i * 7);
    return b;
}

static const char *VALID_ST =
    "{\"__metadata__\":{\"k\":\"v\"},"
    "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
    "\"s\":{\"dtype\":\"F8_E4M3\",\"shape\":[],\"data_offsets\":[32,33]}}";

static void test_st_valid_and_truncated(void **state) {
    (void)state;
    uint64_t size;
    uint8_t *b = make_st(VALID_ST, 33, &size);
    tsr_safetensors *st;
    tsr_error e;
    assert_int_equal(tsr_safetensors_parse(b, size, "valid.safetensors", &st, &e), TSR_OK);
    assert_int_equal(tsr_safetensors_n_tensors(st), 3);
    const tsr_tensor *w = tsr_safetensors_find(st, "w");
    assert_ptr_equal(w->data, b + 8 + strlen(VALID_ST));
    assert_int_equal(tsr_safetensors_find(st, "s")->n_dims, 0);
    assert_string_equal(tsr_safetensors_metadata(st, "k"), "v");
    tsr_safetensors_free(st);
    /* every truncation, header and data, is refused */
    for (uint64_t n = 0; n < size; n++) {
        uint8_t *c = malloc(n ? n : 1);
        memcpy(c, b, n);
        tsr_error_clear(&e);
        st = (tsr_safetensors *)0x1;
        int rc = tsr_safetensors_parse(c, n, "cut.safetensors", &st, &e);
        assert_int_equal(rc, TSR_ERR_FORMAT);
        assert_null(st);
        assert_string_equal(e.file, "cut.safetensors");
        assert_true(e.msg[0] != '\0');
        free(c);
    }
    free(b);
}

static void test_st_bad_table(void **state) {
    (void)state;
    static const struct {
        const char *hdr;
        uint64_t data;
        int code;
        const char *needle; /* in the message */
    } cases[] = {
        {"[1,2]", 0, TSR_ERR_FORMAT, "not a JSON object"},
        {"{\"w\":", 0, TSR_ERR_FORMAT, "header JSON"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, TSR_ERR_FORMAT,
         "duplicate"},
        {"{\"w\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16,
         TSR_ERR_UNSUPPORTED, "\"w\": unsupported dtype \"F64\""},
        {"{\"w\":{\"dtype\":\"Q9\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, TSR_ERR_UNSUPPORTED,
         "unsupported dtype"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
         TSR_ERR_FORMAT, "overflow"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, TSR_ERR_FORMAT,
         "needs 12 bytes"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[250],\"data_offsets\":[0,1000]}}", 8,
         TSR_ERR_FORMAT, "outside the data section"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[0,24]},"
         "\"v\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[16,40]}}", 40, TSR_ERR_FORMAT,
         "overlap"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, TSR_ERR_FORMAT,
         "gap"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, TSR_ERR_FORMAT,
         "data section holds 12"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, TSR_ERR_FORMAT,
         "\"shape\"[0]"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, TSR_ERR_FORMAT,
         "outside"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, TSR_ERR_FORMAT,
         "data_offsets"},
        {"{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, TSR_ERR_FORMAT, "\"dtype\""},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,2],\"data_offsets\":[0,8]}}", 8,
         TSR_ERR_UNSUPPORTED, "5 dims"},
        {"{\"__metadata__\":[1],\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         8, TSR_ERR_FORMAT, "__metadata__"},
        {"{\"w\":3}", 0, TSR_ERR_FORMAT, "not an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t size;
        uint8_t *b = make_st(cases[i].hdr, cases[i].data, &size);
        tsr_safetensors *st;
        tsr_error e;
        tsr_error_clear(&e);
        int rc = tsr_safetensors_parse(b, size, "bad.safetensors", &st, &e);
        if (rc != cases[i].code || !strstr(e.msg, cases[i].needle)) {
            print_message("case %zu: rc %d\n", i, rc);
            print_err(&e);
        }
        assert_int_equal(rc, cases[i].code);
        assert_string_equal(e.file, "bad.safetensors");
        assert_non_null(strstr(e.msg, cases[i].needle));
        free(b);
    }
    /* header length absurd, or past the end */
    uint8_t hdr[16] = {0};
    uint64_t big = 1ull << 40;
    for (int i = 0; i < 8; i++) hdr[i] = (uint8_t)(big >> (8 * i));
    tsr_safetensors *st;
    tsr_error e;
    assert_int_equal(tsr_safetensors_parse(hdr, 16, "huge.safetensors", &st, &e), TSR_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "exceeds the limit"));
    memset(hdr, 0, 8);
    hdr[0] = 100;
    assert_int_equal(tsr_safetensors_parse(hdr, 16, "short.safetensors", &st, &e), TSR_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "past the end"));
    /* a missing file is an I/O error naming it */
    char p[1200];
    snprintf(p, sizeof p, "%s/nope.safetensors", g_tmp);
    assert_int_equal(tsr_safetensors_open(p, &st, &e), TSR_ERR_IO);
    assert_string_equal(e.file, p);
}

static void test_st_write_roundtrip(void **state) {
    (void)state;
    float w[6] = {1, 2, 3, 4, 5, 6};
    int32_t ids[3] = {7, -8, 9};
    tsr_tensor t[2] = {
        {.name = "logits", .dtype = TSR_DTYPE_F32, .n_dims = 2, .shape = {2, 3}, .data = w,
         .nbytes = 24},
        {.name = "ids", .dtype = TSR_DTYPE_I32, .n_dims = 1, .shape = {3}, .data = ids,
         .nbytes = 12},
    };
    char p[1200];
    snprintf(p, sizeof p, "%s/rt.safetensors", g_tmp);
    const char *meta[] = {"note", "hello", NULL};
    tsr_error e;
    assert_int_equal(tsr_safetensors_write(p, t, 2, meta, &e), TSR_OK);
    tsr_safetensors *st;
    assert_int_equal(tsr_safetensors_open(p, &st, &e), TSR_OK);
    const tsr_tensor *r = tsr_safetensors_find(st, "logits");
    assert_non_null(r);
    assert_int_equal(r->shape[1], 3);
    assert_memory_equal(r->data, w, 24);
    assert_memory_equal(tsr_safetensors_find(st, "ids")->data, ids, 12);
    assert_string_equal(tsr_safetensors_metadata(st, "note"), "hello");
    tsr_safetensors_free(st);
    t[1].name = "logits";
    assert_int_equal(tsr_safetensors_write(p, t, 2, NULL, &e), TSR_ERR_INVALID);
    t[1].name = "ids";
    t[1].nbytes = 8;
    assert_int_equal(tsr_safetensors_write(p, t, 2, NULL, &e), TSR_ERR_INVALID);
    unlink(p);
}

/* --- GGUF builder --------------------------------------------------------------------------- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_str(buf *b, const char *k, const char *v) {
    put_str(b, k);
    put_u32(b, TSR_GGUF_STRING);
    put_str(b, v);
}
static void kv_u32(buf *b, const char *k, uint32_t v) {
    put_str(b, k);
    put_u32(b, TSR_GGUF_UINT32);
    put_u32(b, v);
}
static void kv_f32(buf *b, const char *k, float v) {
    put_str(b, k);
    put_u32(b, TSR_GGUF_FLOAT32);
    put(b, &v, 4);
}

typedef struct gt {
    const char *name;
    int nd;
    uint64_t ne[4];
    uint32_t type;
    uint64_t nbytes;
} gt;

/* Tensors placed one after another, each aligned to 32, data bytes i*3+k. */
static void put_tensors(buf *b, const gt *t, int n) {
    uint64_t off = 0;
    uint64_t offs[64];
    for (int i = 0; i < n; i++) {
        put_str(b, t[i].name);
        put_u32(b, (uint32_t)t[i].nd);
        for (int d = 0; d < t[i].nd; d++) put_u64(b, t[i].ne[d]);
        put_u32(b, t[i].type);
        put_u64(b, off);
        offs[i] = off;
        off = i + 1 < n ? (off + t[i].nbytes + 31) & ~31ull : off + t[i].nbytes;
    }
    while (b->n % 32) put(b, "", 1);
    size_t base = b->n;
    uint8_t z = 0;
    for (uint64_t i = 0; i < off; i++) put(b, &z, 1);
    for (int i = 0; i < n; i++)
        for (uint64_t k = 0; k < t[i].nbytes; k++) b->p[base + offs[i] + k] = (uint8_t)(i * 3 + k);
}

/* The small valid GGUF of the bad-file table. */
static buf make_gguf(void) {
    buf b = {0};
    put_u32(&b, 0x46554747u);
    put_u32(&b, 3);
    put_u64(&b, 2); /* tensors */
    put_u64(&b, 4); /* kv */
    kv_str(&b, "general.architecture", "llama");
    kv_u32(&b, "general.alignment", 32);
    put_str(&b, "tokenizer.ggml.tokens");
    put_u32(&b, TSR_GGUF_ARRAY);
    put_u32(&b, TSR_GGUF_STRING);
    put_u64(&b, 3);
    put_str(&b, "a");
    put_str(&b, "bc");
    put_str(&b, "");
    put_str(&b, "tokenizer.ggml.scores");
    put_u32(&b, TSR_GGUF_ARRAY);
    put_u32(&b, TSR_GGUF_FLOAT32);
    put_u64(&b, 3);
    float sc[3] = {0.5f, -1.0f, 2.0f};
    put(&b, sc, 12);
    gt t[2] = {{"a", 2, {4, 2}, 0, 32}, {"b", 1, {8}, 1, 16}};
    put_tensors(&b, t, 2);
    return b;
}

static void test_gguf_valid_and_truncated(void **state) {
    (void)state;
    buf b = make_gguf();
    tsr_gguf *g;
    tsr_error e;
    int rc = tsr_gguf_parse(b.p, b.n, "valid.gguf", &g, &e);
    if (rc) print_err(&e);
    assert_int_equal(rc, TSR_OK);
    assert_int_equal(tsr_gguf_n_kv(g), 4);
    assert_int_equal(tsr_gguf_n_tensors(g), 2);
    int64_t a;
    assert_int_equal(tsr_gguf_get_int(g, tsr_gguf_find(g, "general.alignment"), &a), 0);
    assert_int_equal(a, 32);
    assert_int_equal(tsr_gguf_get_int(g, tsr_gguf_find(g, "missing"), &a), -1);
    assert_int_equal(tsr_gguf_get_int(g, tsr_gguf_find(g, "general.architecture"), &a), -1);
    uint64_t len;
    int ti = tsr_gguf_find(g, "tokenizer.ggml.tokens");
    assert_memory_equal(tsr_gguf_get_arr_str(g, ti, 1, &len), "bc", 2);
    assert_int_equal(len, 2);
    assert_non_null(tsr_gguf_get_arr_str(g, ti, 2, &len));
    assert_int_equal(len, 0);
    assert_null(tsr_gguf_get_arr_str(g, ti, 3, &len));
    const void *data;
    tsr_gguf_type et;
    uint64_t n;
    assert_int_equal(tsr_gguf_get_arr(g, tsr_gguf_find(g, "tokenizer.ggml.scores"), &et, &n, &data), 0);
    assert_int_equal(et, TSR_GGUF_FLOAT32);
    assert_int_equal(n, 3);
    float s2;
    memcpy(&s2, (const char *)data + 8, 4);
    assert_true(s2 == 2.0f);
    const tsr_gguf_tensor_info *t = tsr_gguf_tensor(g, tsr_gguf_find_tensor(g, "b"));
    assert_int_equal(t->dtype, TSR_DTYPE_F16);
    assert_int_equal(t->nbytes, 16);
    assert_int_equal(t->offset % 32, 0);
    assert_int_equal(((const uint8_t *)t->data)[1], 4); /* tensor 1, byte 1: 1*3+1 */
    assert_int_equal(tsr_gguf_find_tensor(g, "c"), -1);
    size_t data_start = (size_t)tsr_gguf_tensor(g, 0)->offset;
    tsr_gguf_free(g);
    /* every cut inside the header, the tensor infos, the padding and the data */
    for (size_t cut = 0; cut < b.n; cut++) {
        tsr_error_clear(&e);
        uint8_t *c = malloc(cut ? cut : 1);
        memcpy(c, b.p, cut);
        g = (tsr_gguf *)0x1;
        rc = tsr_gguf_parse(c, cut, "cut.gguf", &g, &e);
        if (rc != TSR_ERR_FORMAT) print_message("cut at %zu (data at %zu): rc %d\n", cut,
                                                data_start, rc);
        assert_int_equal(rc, TSR_ERR_FORMAT);
        assert_null(g);
        assert_string_equal(e.file, "cut.gguf");
        free(c);
    }
    free(b.p);
}

/* Offsets of fields in make_gguf()'s image. */
#define OFF_VERSION 4
#define OFF_NT 8
#define OFF_NKV 16

static size_t find_bytes(const buf *b, const void *needle, size_t n) {
    for (size_t i = 0; i + n <= b->n; i++)
        if (memcmp(b->p + i, needle, n) == 0) return i;
    fail_msg("pattern not found");
    return 0;
}

/* Offset of tensor info `name`'s n_dims field. */
static size_t tinfo(const buf *b, const char *name) {
    uint8_t pat[16];
    uint64_t l = strlen(name);
    memcpy(pat, &l, 8);
    memcpy(pat + 8, name, l);
    /* search after the metadata: the last match */
    size_t last = 0;
    for (size_t i = 0; i + 8 + l <= b->n && i < 400; i++)
        if (memcmp(b->p + i, pat, 8 + l) == 0) last = i;
    return last + 8 + l;
}

static void set_u32(buf *b, size_t off, uint32_t v) { memcpy(b->p + off, &v, 4); }
static void set_u64(buf *b, size_t off, uint64_t v) { memcpy(b->p + off, &v, 8); }

static void test_gguf_bad_table(void **state) {
    (void)state;
    enum { MAGIC, V1, V4, NT_HUGE, NKV_HUGE, STRLEN_HUGE, ARR_HUGE, NESTED, NDIMS0, NDIMS5,
           DIM_OVF, TYPE_UNK, BLOCK, OFF_UNALIGNED, OFF_OUTSIDE, OVERLAP, DUP_TENSOR, DUP_KEY,
           ALIGN0, ALIGN3, KVTYPE, NCASES };
    static const struct {
        int code;
        const char *needle;
    } want[NCASES] = {
        [MAGIC] = {TSR_ERR_FORMAT, "wrong magic"},
        [V1] = {TSR_ERR_UNSUPPORTED, "version 1"},
        [V4] = {TSR_ERR_UNSUPPORTED, "version 4"},
        [NT_HUGE] = {TSR_ERR_FORMAT, "tensor count"},
        [NKV_HUGE] = {TSR_ERR_FORMAT, "metadata count"},
        [STRLEN_HUGE] = {TSR_ERR_FORMAT, "string length"},
        [ARR_HUGE] = {TSR_ERR_FORMAT, "tokenizer.ggml.scores"},
        [NESTED] = {TSR_ERR_UNSUPPORTED, "nested arrays"},
        [NDIMS0] = {TSR_ERR_FORMAT, "n_dims 0"},
        [NDIMS5] = {TSR_ERR_FORMAT, "n_dims 5"},
        [DIM_OVF] = {TSR_ERR_FORMAT, "overflows"},
        [TYPE_UNK] = {TSR_ERR_UNSUPPORTED, "unsupported ggml type 99 for tensor a"},
        [BLOCK] = {TSR_ERR_FORMAT, "block size"},
        [OFF_UNALIGNED] = {TSR_ERR_FORMAT, "alignment"},
        [OFF_OUTSIDE] = {TSR_ERR_FORMAT, "outside the file"},
        [OVERLAP] = {TSR_ERR_FORMAT, "overlaps"},
        [DUP_TENSOR] = {TSR_ERR_FORMAT, "duplicate tensor name \"a\""},
        [DUP_KEY] = {TSR_ERR_FORMAT, "duplicate metadata key"},
        [ALIGN0] = {TSR_ERR_FORMAT, "general.alignment"},
        [ALIGN3] = {TSR_ERR_FORMAT, "general.alignment"},
        [KVTYPE] = {TSR_ERR_FORMAT, "unknown value type"},
    };
    for (int c = 0; c < NCASES; c++) {
        buf b = make_gguf();
        size_t ta = tinfo(&b, "a"), tb = tinfo(&b, "b");
        /* tensor info layout: n_dims u32, ne u64 x n_dims, type u32, offset u64 */
        switch (c) {
        case MAGIC: b.p[0] = 'X'; break;
        case V1: set_u32(&b, OFF_VERSION, 1); break;
        case V4: set_u32(&b, OFF_VERSION, 4); break;
        case NT_HUGE: set_u64(&b, OFF_NT, 1ull << 60); break;
        case NKV_HUGE: set_u64(&b, OFF_NKV, UINT64_MAX); break;
        case STRLEN_HUGE: set_u64(&b, 24, UINT64_MAX - 4); break; /* first key's length */
        case ARR_HUGE: {
            size_t k = find_bytes(&b, "tokenizer.ggml.scores", 21);
            set_u64(&b, k + 21 + 8, 1ull << 62);
            break;
        }
        case NESTED: {
            size_t k = find_bytes(&b, "tokenizer.ggml.scores", 21);
            set_u32(&b, k + 21 + 4, TSR_GGUF_ARRAY);
            break;
        }
        case NDIMS0: set_u32(&b, ta, 0); break;
        case NDIMS5: set_u32(&b, ta, 5); break;
        case DIM_OVF:
            set_u64(&b, ta + 4, 1ull << 32);
            set_u64(&b, ta + 12, 1ull << 32);
            break;
        case TYPE_UNK: set_u32(&b, ta + 20, 99); break;
        case BLOCK: set_u32(&b, ta + 20, 8); break; /* Q8_0 with ne0 = 4 */
        case OFF_UNALIGNED: set_u64(&b, tb + 16, 8); break;
        case OFF_OUTSIDE: set_u64(&b, tb + 16, 1ull << 40); break;
        case OVERLAP: set_u64(&b, tb + 16, 0); break;
        case DUP_TENSOR: b.p[tb - 1] = 'a'; break;
        case DUP_KEY: {
            size_t k = find_bytes(&b, "tokenizer.ggml.scores", 21);
            memcpy(b.p + k, "tokenizer.ggml.tokens", 21);
            break;
        }
        case ALIGN0: set_u32(&b, find_bytes(&b, "general.alignment", 17) + 17 + 4, 0); break;
        case ALIGN3: set_u32(&b, find_bytes(&b, "general.alignment", 17) + 17 + 4, 3); break;
        case KVTYPE: set_u32(&b, find_bytes(&b, "general.alignment", 17) + 17, 13); break;
        }
        tsr_gguf *g = NULL;
        tsr_error e;
        tsr_error_clear(&e);
        int rc = tsr_gguf_parse(b.p, b.n, "bad.gguf", &g, &e);
        if (rc != want[c].code || !strstr(e.msg, want[c].needle)) {
            print_message("case %d: rc %d\n", c, rc);
            print_err(&e);
        }
        assert_int_equal(rc, want[c].code);
        assert_null(g);
        assert_string_equal(e.file, "bad.gguf");
        assert_non_null(strstr(e.msg, want[c].needle));
        free(b.p);
    }
}

/* A one-layer qwen3moe GGUF: merged experts become per-expert views. */
static void test_gguf_moe_model(void **state) {
    (void)state;
    buf b = {0};
    put_u32(&b, 0x46554747u);
    put_u32(&b, 3);
    gt t[] = {
        {"token_embd.weight", 2, {8, 16}, 0, 8 * 16 * 4},
        {"output_norm.weight", 1, {8}, 0, 32},
        {"blk.0.attn_norm.weight", 1, {8}, 0, 32},
        {"blk.0.ffn_norm.weight", 1, {8}, 0, 32},
        {"blk.0.attn_q.weight", 2, {8, 8}, 0, 256},
        {"blk.0.attn_k.weight", 2, {8, 4}, 0, 128},
        {"blk.0.attn_v.weight", 2, {8, 4}, 1, 64},
        {"blk.0.attn_output.weight", 2, {8, 8}, 0, 256},
        {"blk.0.attn_q_norm.weight", 1, {4}, 0, 16},
        {"blk.0.attn_k_norm.weight", 1, {4}, 0, 16},
        {"blk.0.ffn_gate_inp.weight", 2, {8, 2}, 0, 64},
        {"blk.0.ffn_gate_exps.weight", 3, {8, 4, 2}, 0, 256},
        {"blk.0.ffn_up_exps.weight", 3, {8, 4, 2}, 0, 256},
        {"blk.0.ffn_down_exps.weight", 3, {4, 8, 2}, 0, 256},
    };
    int nt = (int)(sizeof t / sizeof t[0]);
    put_u64(&b, (uint64_t)nt);
    put_u64(&b, 10);
    kv_str(&b, "general.architecture", "qwen3moe");
    kv_u32(&b, "qwen3moe.context_length", 64);
    kv_u32(&b, "qwen3moe.embedding_length", 8);
    kv_u32(&b, "qwen3moe.block_count", 1);
    kv_u32(&b, "qwen3moe.attention.head_count", 2);
    kv_u32(&b, "qwen3moe.attention.head_count_kv", 1);
    kv_u32(&b, "qwen3moe.attention.key_length", 4);
    kv_f32(&b, "qwen3moe.attention.layer_norm_rms_epsilon", 1e-6f);
    kv_u32(&b, "qwen3moe.expert_count", 2);
    kv_u32(&b, "qwen3moe.expert_used_count", 1);
    /* expert_feed_forward_length is missing at first: a clear error */
    put_tensors(&b, t, nt);
    char p[1200];
    snprintf(p, sizeof p, "%s/moe.gguf", g_tmp);
    FILE *fp = fopen(p, "wb");
    fwrite(b.p, 1, b.n, fp);
    fclose(fp);
    tsr_model_file *f;
    tsr_error e;
    assert_int_equal(tsr_model_file_open(p, &f, &e), TSR_ERR_FORMAT);
    assert_string_equal(e.file, p);
    assert_non_null(strstr(e.msg, "qwen3moe.expert_feed_forward_length"));
    /* now with the key (the kv count grows by one; rebuild) */
    buf b2 = {0};
    put(&b2, b.p, 16);
    put_u64(&b2, 11);
    size_t kv_start = 24;
    size_t ti_start = find_bytes(&b, "\x11\0\0\0\0\0\0\0token_embd", 18);
    put(&b2, b.p + kv_start, ti_start - kv_start);
    kv_u32(&b2, "qwen3moe.expert_feed_forward_length", 4);
    /* re-place the tensors after the longer metadata */
    put_tensors(&b2, t, nt);
    fp = fopen(p, "wb");
    fwrite(b2.p, 1, b2.n, fp);
    fclose(fp);
    int rc = tsr_model_file_open(p, &f, &e);
    if (rc) print_err(&e);
    assert_int_equal(rc, TSR_OK);
    const tsr_model_config *c = tsr_model_file_config(f);
    assert_int_equal(c->arch, TSR_ARCH_QWEN3_MOE);
    assert_int_equal(c->n_experts, 2);
    assert_int_equal(c->expert_ffn, 4);
    assert_int_equal(c->norm_topk_prob, 1);
    assert_int_equal(c->qk_norm, 1);
    assert_int_equal(c->rope_interleaved, 0);
    assert_int_equal(c->tie_embeddings, 1);
    assert_int_equal(c->vocab, 16);
    assert_int_equal(c->layer_moe[0], 1);
    assert_int_equal(c->head_dim, 4);
    const tsr_tensor *up0 = tsr_model_file_tensor(f, "model.layers.0.mlp.experts.0.up_proj.weight");
    const tsr_tensor *up1 = tsr_model_file_tensor(f, "model.layers.0.mlp.experts.1.up_proj.weight");
    const tsr_tensor *dn1 = tsr_model_file_tensor(f, "model.layers.0.mlp.experts.1.down_proj.weight");
    const tsr_tensor *v = tsr_model_file_tensor(f, "model.layers.0.self_attn.v_proj.weight");
    assert_non_null(up0);
    assert_non_null(up1);
    assert_non_null(dn1);
    assert_int_equal(up1->n_dims, 2);
    assert_int_equal(up1->shape[0], 4);
    assert_int_equal(up1->shape[1], 8);
    assert_int_equal(dn1->shape[0], 8);
    assert_int_equal(dn1->shape[1], 4);
    assert_int_equal(up1->nbytes, 128);
    assert_ptr_equal((const uint8_t *)up1->data, (const uint8_t *)up0->data + 128);
    assert_int_equal(((const uint8_t *)up1->data)[0], (uint8_t)(12 * 3 + 128));
    assert_int_equal(v->dtype, TSR_DTYPE_F16);
    assert_int_equal(v->shape[0], 4);
    assert_non_null(tsr_model_file_tensor(f, "model.layers.0.mlp.gate.weight"));
    assert_non_null(tsr_model_file_tensor(f, "model.layers.0.input_layernorm.weight"));
    assert_non_null(tsr_model_file_tensor(f, "model.layers.0.post_attention_layernorm.weight"));
    tsr_model_file_close(f);
    unlink(p);
    free(b.p);
    free(b2.p);
}

static void test_gguf_names(void **state) {
    (void)state;
    static const struct {
        tsr_arch arch;
        const char *g, *hf;
    } cases[] = {
        {TSR_ARCH_LLAMA, "token_embd.weight", "model.embed_tokens.weight"},
        {TSR_ARCH_LLAMA, "output.weight", "lm_head.weight"},
        {TSR_ARCH_LLAMA, "output_norm.weight", "model.norm.weight"},
        {TSR_ARCH_LLAMA, "blk.3.attn_norm.weight", "model.layers.3.input_layernorm.weight"},
        {TSR_ARCH_LLAMA, "blk.3.ffn_norm.weight", "model.layers.3.post_attention_layernorm.weight"},
        {TSR_ARCH_QWEN2, "blk.10.attn_k.bias", "model.layers.10.self_attn.k_proj.bias"},
        {TSR_ARCH_QWEN2, "blk.0.attn_output.weight", "model.layers.0.self_attn.o_proj.weight"},
        {TSR_ARCH_QWEN3, "blk.1.attn_q_norm.weight", "model.layers.1.self_attn.q_norm.weight"},
        {TSR_ARCH_QWEN2, "blk.2.ffn_down.weight", "model.layers.2.mlp.down_proj.weight"},
        {TSR_ARCH_QWEN2_MOE, "blk.0.ffn_gate_inp.weight", "model.layers.0.mlp.gate.weight"},
        {TSR_ARCH_QWEN2_MOE, "blk.0.ffn_up_shexp.weight",
         "model.layers.0.mlp.shared_expert.up_proj.weight"},
        {TSR_ARCH_QWEN2_MOE, "blk.0.ffn_gate_inp_shexp.weight",
         "model.layers.0.mlp.shared_expert_gate.weight"},
        {TSR_ARCH_MIXTRAL, "blk.5.ffn_gate_inp.weight",
         "model.layers.5.block_sparse_moe.gate.weight"},
        {TSR_ARCH_MIXTRAL, "blk.5.ffn_down.7.weight",
         "model.layers.5.block_sparse_moe.experts.7.w2.weight"},
        {TSR_ARCH_QWEN3_MOE, "blk.5.ffn_up.2.weight", "model.layers.5.mlp.experts.2.up_proj.weight"},
        {TSR_ARCH_LLAMA, "rope_freqs.weight", NULL},
        {TSR_ARCH_LLAMA, "blk.1.unknown.weight", NULL},
        {TSR_ARCH_LLAMA, "blk.x.attn_q.weight", NULL},
        {TSR_ARCH_LLAMA, "blk.1.attn_q.scale", NULL},
        {TSR_ARCH_MIXTRAL, "blk.5.ffn_side.1.weight", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[192] = "";
        int ok = tsr_gguf_name_to_hf(cases[i].g, cases[i].arch, out, sizeof out);
        assert_int_equal(ok, cases[i].hf != NULL);
        if (cases[i].hf) assert_string_equal(out, cases[i].hf);
    }
}

/* --- config.json ------------------------------------------------------------------------------ */

/* A folder with a modified copy of a fixture's config.json and a link to its
 * weights; opens it and checks the error. */
static void config_case(const char *fam, const char *key, json_t *value, int code,
                        const char *needle) {
    char src[1200], dir[1200], cfg[1300], lnk[1300], wts[1300];
    snprintf(src, sizeof src, "%s/tests/data/fixtures/transformers/%s", g_src, fam);
    snprintf(dir, sizeof dir, "%s/cfg_%s", g_tmp, fam);
    mkdir(dir, 0700);
    snprintf(cfg, sizeof cfg, "%s/config.json", src);
    json_error_t je;
    json_t *root = json_load_file(cfg, 0, &je);
    assert_non_null(root);
    if (value)
        json_object_set_new(root, key, value);
    else
        json_object_del(root, key);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    assert_int_equal(json_dump_file(root, cfg, JSON_INDENT(2)), 0);
    json_decref(root);
    snprintf(lnk, sizeof lnk, "%s/model.safetensors", dir);
    snprintf(wts, sizeof wts, "%s/model.safetensors", src);
    unlink(lnk);
    assert_int_equal(symlink(wts, lnk), 0);
    tsr_model_file *f = NULL;
    tsr_error e;
    tsr_error_clear(&e);
    int rc = tsr_model_file_open(dir, &f, &e);
    if (rc != code || (needle && !strstr(e.msg, needle))) {
        print_message("%s/%s: rc %d\n", fam, key, rc);
        print_err(&e);
    }
    assert_int_equal(rc, code);
    if (code == TSR_OK) {
        tsr_model_file_close(f);
    } else {
        assert_null(f);
        assert_string_equal(e.file, cfg);
        assert_non_null(strstr(e.msg, needle));
    }
    unlink(lnk);
    unlink(cfg);
    rmdir(dir);
}

static void test_config_errors(void **state) {
    (void)state;
    config_case("llama", "hidden_size", NULL, TSR_ERR_FORMAT, "missing field \"hidden_size\"");
    config_case("llama", "model_type", NULL, TSR_ERR_FORMAT, "missing field \"model_type\"");
    config_case("llama", "vocab_size", NULL, TSR_ERR_FORMAT, "\"vocab_size\"");
    config_case("qwen3_moe", "moe_intermediate_size", NULL, TSR_ERR_FORMAT,
                "\"moe_intermediate_size\"");
    config_case("mixtral", "num_local_experts", NULL, TSR_ERR_FORMAT, "\"num_local_experts\"");
    config_case("llama", "model_type", json_string("gpt2"), TSR_ERR_UNSUPPORTED, "\"gpt2\"");
    config_case("llama", "hidden_size", json_string("64"), TSR_ERR_FORMAT,
                "\"hidden_size\" must be an integer");
    config_case("llama", "num_key_value_heads", json_integer(3), TSR_ERR_FORMAT,
                "does not divide");
    /* disagreements with the tensors name the tensor and both shapes */
    config_case("llama", "num_key_value_heads", json_integer(4), TSR_ERR_FORMAT,
                "tensor \"model.layers.0.self_attn.k_proj.weight\" has shape [32, 64] but the "
                "config implies [64, 64]");
    config_case("llama", "vocab_size", json_integer(500), TSR_ERR_FORMAT,
                "\"model.embed_tokens.weight\" has shape [512, 64] but the config implies "
                "[500, 64]");
    config_case("llama", "num_hidden_layers", json_integer(3), TSR_ERR_FORMAT,
                "tensor \"model.layers.2.input_layernorm.weight\" is missing");
    config_case("qwen3_moe", "num_local_experts", json_integer(9), TSR_ERR_FORMAT,
                "model.layers.0.mlp.gate.weight");
    config_case("qwen3", "head_dim", json_null(), TSR_OK, NULL); /* 64 / 4 = 16 anyway */
    config_case("qwen2", "rope_parameters",
                json_pack("{s:f,s:s}", "rope_theta", 1e6, "rope_type", "yarn"),
                TSR_ERR_UNSUPPORTED, "yarn");
    config_case("llama", "rope_parameters",
                json_pack("{s:f,s:s,s:f}", "rope_theta", 1e4, "rope_type", "llama3", "factor",
                          8.0),
                TSR_ERR_FORMAT, "missing field \"low_freq_factor\"");
    config_case("llama", "eos_token_id", json_pack("[i,s]", 2, "x"), TSR_ERR_FORMAT,
                "eos_token_id");
}

static void test_config_spellings(void **state) {
    (void)state;
    /* transformers-4 spelling of a qwen2_moe model, from config text alone */
    const char *text =
        "{\"model_type\":\"qwen2_moe\",\"vocab_size\":100,\"hidden_size\":32,"
        "\"num_hidden_layers\":6,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
        "\"intermediate_size\":64,\"moe_intermediate_size\":16,\"num_experts\":4,"
        "\"num_experts_per_tok\":2,\"shared_expert_intermediate_size\":48,"
        "\"decoder_sparse_step\":2,\"mlp_only_layers\":[3],\"norm_topk_prob\":false,"
        "\"rope_theta\":500000.0,\"rope_scaling\":{\"type\":\"linear\",\"factor\":4.0},"
        "\"torch_dtype\":\"bfloat16\",\"eos_token_id\":[5,6,7],\"bos_token_id\":null,"
        "\"use_sliding_window\":true,\"sliding_window\":1024,\"tie_word_embeddings\":true,"
        "\"max_position_embeddings\":4096,\"rms_norm_eps\":1e-6}";
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", g_tmp);
    FILE *fp = fopen(p, "w");
    fputs(text, fp);
    fclose(fp);
    tsr_model_config c;
    tsr_error e;
    int rc = tsr_model_config_load(p, &c, &e);
    if (rc) print_err(&e);
    assert_int_equal(rc, TSR_OK);
    assert_int_equal(c.arch, TSR_ARCH_QWEN2_MOE);
    assert_string_equal(c.arch_name, "qwen2_moe");
    assert_int_equal(c.head_dim, 8);
    assert_int_equal(c.n_experts, 4);
    assert_int_equal(c.expert_ffn, 16);
    assert_int_equal(c.shared_expert_ffn, 48);
    assert_int_equal(c.norm_topk_prob, 0);
    assert_int_equal(c.attn_bias, 1);
    assert_int_equal(c.attn_out_bias, 0);
    /* layers 1 and 5 are MoE ((i+1) % 2 == 0), 3 is listed as dense */
    static const uint8_t moe[6] = {0, 1, 0, 0, 0, 1};
    assert_memory_equal(c.layer_moe, moe, 6);
    assert_true(c.rope_theta == 500000.0f);
    assert_int_equal(c.rope_scaling, TSR_ROPE_LINEAR);
    assert_true(c.rope_factor == 4.0f);
    assert_int_equal(c.n_eos, 3);
    assert_int_equal(c.eos[2], 7);
    assert_int_equal(c.bos, -1);
    assert_int_equal(c.sliding_window, 1024);
    assert_int_equal(c.tie_embeddings, 1);
    assert_int_equal(c.max_ctx, 4096);

    /* llama3 rope scaling, transformers-5 spelling, attention_bias honoured */
    const char *t5 =
        "{\"model_type\":\"llama\",\"vocab_size\":100,\"hidden_size\":32,"
        "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"intermediate_size\":64,"
        "\"attention_bias\":true,\"head_dim\":null,\"sliding_window\":512,"
        "\"rope_parameters\":{\"rope_theta\":500000.0,\"rope_type\":\"llama3\",\"factor\":8.0,"
        "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
        "\"original_max_position_embeddings\":8192}}";
    fp = fopen(p, "w");
    fputs(t5, fp);
    fclose(fp);
    rc = tsr_model_config_load(p, &c, &e);
    if (rc) print_err(&e);
    assert_int_equal(rc, TSR_OK);
    assert_int_equal(c.rope_scaling, TSR_ROPE_LLAMA3);
    assert_true(c.rope_factor == 8.0f && c.rope_high_freq_factor == 4.0f);
    assert_int_equal(c.rope_orig_ctx, 8192);
    assert_int_equal(c.n_kv_heads, 4);
    assert_int_equal(c.head_dim, 8);
    assert_int_equal(c.attn_bias, 1);
    assert_int_equal(c.attn_out_bias, 1);
    assert_int_equal(c.sliding_window, 0); /* use_sliding_window absent */
    assert_int_equal(c.tie_embeddings, 0);
    assert_int_equal(c.bos, 1); /* llama defaults */
    assert_int_equal(c.eos[0], 2);
    /* malformed JSON: file, line and column */
    fp = fopen(p, "w");
    fputs("{\n  \"model_type\": \"llama\",\n  oops\n}", fp);
    fclose(fp);
    assert_int_equal(tsr_model_config_load(p, &c, &e), TSR_ERR_FORMAT);
    assert_string_equal(e.file, p);
    assert_int_equal(e.line, 3);
    assert_true(e.col > 0);
    unlink(p);
}

/* A tiny llama2.c file with an untied classifier (negative vocab_size). */
static void test_llama2c_untied(void **state) {
    (void)state;
    int32_t h[7] = {8, 16, 1, 2, 1, -10, 4};
    enum { N = 80 + 8 + 64 + 32 + 32 + 64 + 8 + 3 * 128 + 8 + 16 + 80 };
    static float w[N + 1];
    for (int i = 0; i <= N; i++) w[i] = (float)i;
    char p[1200];
    snprintf(p, sizeof p, "%s/tiny.bin", g_tmp);
    for (int extra = -1; extra <= 1; extra++) {
        FILE *fp = fopen(p, "wb");
        fwrite(h, 4, 7, fp);
        fwrite(w, 4, (size_t)(N + extra), fp);
        fclose(fp);
        tsr_model_file *f = NULL;
        tsr_error e;
        int rc = tsr_model_file_open(p, &f, &e);
        if (extra) {
            assert_int_equal(rc, TSR_ERR_FORMAT);
            continue;
        }
        if (rc) print_err(&e);
        assert_int_equal(rc, TSR_OK);
        const tsr_model_config *c = tsr_model_file_config(f);
        assert_int_equal(c->tie_embeddings, 0);
        assert_int_equal(c->vocab, 10);
        assert_int_equal(c->head_dim, 4);
        assert_int_equal(c->max_ctx, 4);
        const tsr_tensor *lm = tsr_model_file_tensor(f, "lm_head.weight");
        assert_non_null(lm);
        assert_true(((const float *)lm->data)[0] == (float)(N - 80));
        const tsr_tensor *q = tsr_model_file_tensor(f, "model.layers.0.self_attn.q_proj.weight");
        assert_true(((const float *)q->data)[0] == 88.0f);
        const tsr_tensor *dn = tsr_model_file_tensor(f, "model.layers.0.mlp.down_proj.weight");
        assert_int_equal(dn->shape[0], 8);
        assert_int_equal(dn->shape[1], 16);
        assert_true(((const float *)dn->data)[0] == (float)(80 + 8 + 64 + 32 + 32 + 64 + 8 + 128));
        tsr_model_file_close(f);
    }
    unlink(p);
}

/* --- other bad model files ---------------------------------------------------------------------- */

static void test_bad_model_files(void **state) {
    (void)state;
    char src[1200], p[1200];
    tsr_model_file *f;
    tsr_error e;
    /* llama2.c: truncated at every 4th byte of the header and beyond */
    src_path(src, sizeof src, "models/stories260K/stories260K.bin");
    FILE *in = fopen(src, "rb");
    assert_non_null(in);
    uint8_t head[4096];
    assert_int_equal(fread(head, 1, sizeof head, in), sizeof head);
    fclose(in);
    snprintf(p, sizeof p, "%s/cut.bin", g_tmp);
    for (size_t cut = 0; cut < sizeof head; cut += cut < 64 ? 1 : 509) {
        FILE *fp = fopen(p, "wb");
        fwrite(head, 1, cut, fp);
        fclose(fp);
        tsr_error_clear(&e);
        assert_int_equal(tsr_model_file_open(p, &f, &e), TSR_ERR_FORMAT);
        assert_string_equal(e.file, p);
    }
    /* a negative dim */
    int32_t neg = -5;
    memcpy(head + 8, &neg, 4);
    FILE *fp = fopen(p, "wb");
    fwrite(head, 1, sizeof head, fp);
    fclose(fp);
    assert_int_equal(tsr_model_file_open(p, &f, &e), TSR_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "n_layers"));
    unlink(p);
    /* GGUF model truncated anywhere in its first 64 KiB of header and metadata */
    src_path(src, sizeof src, "models/stories260K/stories260K-f16.gguf");
    in = fopen(src, "rb");
    static uint8_t gbuf[1 << 16];
    assert_int_equal(fread(gbuf, 1, sizeof gbuf, in), sizeof gbuf);
    fclose(in);
    for (size_t cut = 0; cut < sizeof gbuf; cut += cut < 200 ? 1 : 97) {
        tsr_gguf *g = NULL;
        tsr_error_clear(&e);
        assert_int_equal(tsr_gguf_parse(gbuf, cut, "cut-f16.gguf", &g, &e), TSR_ERR_FORMAT);
        assert_null(g);
    }
    /* unknown format, missing folder contents */
    snprintf(p, sizeof p, "%s/model.xyz", g_tmp);
    fp = fopen(p, "wb");
    fputs("hello", fp);
    fclose(fp);
    assert_int_equal(tsr_model_file_open(p, &f, &e), TSR_ERR_UNSUPPORTED);
    unlink(p);
    assert_int_equal(tsr_model_file_open(g_tmp, &f, &e), TSR_ERR_IO);
    assert_non_null(strstr(e.msg, "model.safetensors"));
    snprintf(p, sizeof p, "%s/none.gguf", g_tmp);
    assert_int_equal(tsr_model_file_open(p, &f, &e), TSR_ERR_IO);
    /* weights without their config.json */
    char w[1300];
    snprintf(p, sizeof p, "%s/model.safetensors", g_tmp);
    src_path(w, sizeof w, "tests/data/fixtures/transformers/llama/model.safetensors");
    assert_int_equal(symlink(w, p), 0);
    tsr_error_clear(&e);
    assert_int_equal(tsr_model_file_open(g_tmp, &f, &e), TSR_ERR_IO);
    assert_non_null(strstr(e.file, "config.json"));
    unlink(p);
    tsr_model_file_close(NULL);
    tsr_safetensors_free(NULL);
    tsr_gguf_free(NULL);
}

int main(void) {
    const char *s = getenv("TESSERA_SOURCE_DIR");
    snprintf(g_src, sizeof g_src, "%s", s ? s : ".");
    snprintf(g_tmp, sizeof g_tmp, "/tmp/tsr_format_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_llama),
        cmocka_unit_test(test_fixture_qwen2),
        cmocka_unit_test(test_fixture_qwen3),
        cmocka_unit_test(test_fixture_qwen3_moe),
        cmocka_unit_test(test_fixture_mixtral),
        cmocka_unit_test(test_reference_safetensors),
        cmocka_unit_test(test_stories_formats),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_sharded_index_errors),
        cmocka_unit_test(test_st_valid_and_truncated),
        cmocka_unit_test(test_st_bad_table),
        cmocka_unit_test(test_st_write_roundtrip),
        cmocka_unit_test(test_gguf_valid_and_truncated),
        cmocka_unit_test(test_gguf_bad_table),
        cmocka_unit_test(test_gguf_moe_model),
        cmocka_unit_test(test_gguf_names),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_config_spellings),
        cmocka_unit_test(test_llama2c_untied),
        cmocka_unit_test(test_bad_model_files),
        cmocka_unit_test(test_give_back),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(g_tmp);
    return rc;
}
