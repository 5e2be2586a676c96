/*
 * lua_assembly.h - assemblies written as Lua 5.4 scripts.
 *
 * The script runs in a sandbox: only the base (without dofile, loadfile,
 * load, require, print, collectgarbage), string (without dump), table and
 * math libraries; text chunks only; an instruction budget (a count hook) and
 * a memory cap (the state's allocator). It sees a global `tessera`:
 *
 *   tessera.catalog()          array of {name, slot, version, devices, baseline,
 *                              exactness, test}
 *   tessera.device()           "cpu" (or "cuda" once CUDA devices are found)
 *   tessera.model              nil, or {arch, moe, n_experts, n_experts_used,
 *                              n_layers, hidden, n_heads, n_kv_heads, head_dim,
 *                              vocab, max_ctx, ffn, expert_ffn, dtype}
 *   tessera.call(p, fn, ...)   an export of plugin p through libffi (its library
 *                              is sha256- and permission-checked first)
 *
 * and returns the assembly table ({name, device, slots = {...}}), which is
 * converted to a tsr_ynode tree for the shared validator. Errors (a raise, the
 * budget, the cap, a wrong shape) carry the script's file and line.
 *
 * Limit: the instruction budget counts Lua instructions; time spent inside
 * one library call (a pathological string.find pattern) is bounded only by
 * the memory cap and Lua's own limits, not by the budget.
 */
#ifndef TSR_LUA_ASSEMBLY_H
#define TSR_LUA_ASSEMBLY_H

#include "assembly.h"

#define TSR_LUA_DEFAULT_INSTRUCTIONS 20000000ull
#define TSR_LUA_DEFAULT_MEMORY (32u << 20)

int tsr_lua_assembly_run(const char *path, const tsr_assembly_env *env, tsr_ynode **out, tsr_diag *d);
/* The same with the script in memory; path names it in messages. */
int tsr_lua_assembly_run_buffer(const char *buf, size_t len, const char *path,
                                const tsr_assembly_env *env, tsr_ynode **out, tsr_diag *d);

#endif /* TSR_LUA_ASSEMBLY_H */
