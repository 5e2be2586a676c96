/* abl_compact_attention: ref_attention's code under another name, whose
 * manifest reads compact KV only (f16, int8): paired with the f32 baseline
 * kv_cache (ref_kv_cache) it is refused by the checker, which is what the
 * ablation test of a refused variant needs. For the ablation tests only. */
#define REF_ATTENTION_NAME "abl_compact_attention"
#include "plugins/ref_attention/ref_attention.c"
