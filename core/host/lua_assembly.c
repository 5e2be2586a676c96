#include "lua_assembly.h"

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checker.h"
#include "halloc.h"
#include "loader.h"

#define HOOK_EVERY 1000

typedef struct lctx {
    const tsr_assembly_env *env;
    size_t mem_used, mem_cap;
    int mem_hit;
    uint64_t budget, spent;
    void *handles[TSR_SLOT_COUNT * 8];
    int n_handles;
} lctx;

static void *l_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    lctx *c = ud;
    if (!ptr) osize = 0;
    if (nsize == 0) {
        free(ptr);
        c->mem_used -= osize;
        return NULL;
    }
    if (nsize > osize && c->mem_used - osize + nsize > c->mem_cap) {
        c->mem_hit = 1;
        return NULL;
    }
    void *n = realloc(ptr, nsize);
    if (!n) return NULL;
    c->mem_used = c->mem_used - osize + nsize;
    return n;
}

static lctx *get_ctx(lua_State *L) {
    void *ud = NULL;
    lua_getallocf(L, &ud);
    return ud;
}

static void l_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    lctx *c = get_ctx(L);
    c->spent += HOOK_EVERY;
    if (c->spent > c->budget) {
        luaL_where(L, 0); /* the interrupted function's file:line */
        lua_pushfstring(L, "instruction budget of %I exceeded", (lua_Integer)c->budget);
        lua_concat(L, 2);
        lua_error(L);
    }
}

/* --- tessera.* ------------------------------------------------------------- */

static void set_str(lua_State *L, const char *k, const char *v) {
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}

static void set_int(lua_State *L, const char *k, lua_Integer v) {
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}

static void push_devices(lua_State *L, unsigned mask) {
    lua_newtable(L);
    int i = 1;
    for (int dev = 0; dev < 2; dev++)
        if (mask & (1u << dev)) {
            lua_pushstring(L, tsr_device_name(dev));
            lua_rawseti(L, -2, i++);
        }
}

static int l_catalog(lua_State *L) {
    lctx *c = get_ctx(L);
    lua_newtable(L);
    const tsr_catalog *cat = c->env->catalog;
    for (int i = 0; cat && i < cat->n; i++) {
        const tsr_manifest *m = cat->items[i];
        lua_newtable(L);
        set_str(L, "name", m->name);
        set_str(L, "slot", tsr_slot_name(m->slot));
        set_str(L, "version", m->version);
        push_devices(L, m->devices);
        lua_setfield(L, -2, "devices");
        push_devices(L, m->baseline);
        lua_setfield(L, -2, "baseline");
        set_str(L, "exactness", m->exact ? "exact" : "lossy");
        lua_pushboolean(L, m->test);
        lua_setfield(L, -2, "test");
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

static int l_device(lua_State *L) {
    lua_pushstring(L, tsr_device_name(get_ctx(L)->env->device));
    return 1;
}

static int l_call(lua_State *L) {
    lctx *c = get_ctx(L);
    const char *pname = luaL_checkstring(L, 1);
    const char *fname = luaL_checkstring(L, 2);
    const tsr_manifest *m = c->env->catalog ? tsr_catalog_find(c->env->catalog, pname) : NULL;
    if (!m) return luaL_error(L, "tessera.call: no plugin '%s' in the catalog", pname);
    if (m->test && !c->env->allow_test)
        return luaL_error(L, "tessera.call: '%s' is a test plugin", pname);
    const tsr_mexport *ex = tsr_manifest_export(m, fname);
    if (!ex) return luaL_error(L, "tessera.call: plugin '%s' exports no '%s'", pname, fname);
    int nargs = lua_gettop(L) - 2;
    if (nargs != ex->sig.n_args)
        return luaL_error(L, "tessera.call(%s, %s): expected %d arguments, got %d", pname, fname,
                          ex->sig.n_args, nargs);
    tsr_ffi_value args[TSR_FFI_MAX_ARGS];
    for (int i = 0; i < nargs; i++) {
        int idx = i + 3;
        tsr_ffi_type t = ex->sig.args[i];
        memset(&args[i], 0, sizeof args[i]);
        args[i].type = t;
        int ok = 1;
        if (t == TSR_FFI_BOOL) {
            ok = lua_isboolean(L, idx);
            args[i].v.b = lua_toboolean(L, idx);
        } else if (t == TSR_FFI_FLOAT || t == TSR_FFI_DOUBLE) {
            args[i].v.f = lua_tonumberx(L, idx, &ok);
        } else if (t == TSR_FFI_STRING) {
            ok = lua_type(L, idx) == LUA_TSTRING;
            args[i].v.s = lua_tostring(L, idx);
        } else {
            lua_Integer v = lua_tointegerx(L, idx, &ok);
            args[i].type = TSR_FFI_INT64;
            args[i].v.i = v;
            if (ok && (t == TSR_FFI_UINT32 || t == TSR_FFI_UINT64) && v < 0) ok = 0;
        }
        if (!ok)
            return luaL_error(L, "tessera.call(%s, %s): argument %d must be %s, got %s", pname, fname,
                              i + 1, tsr_ffi_type_name(t), luaL_typename(L, idx));
    }
    if (c->n_handles >= (int)(sizeof c->handles / sizeof c->handles[0]))
        return luaL_error(L, "tessera.call: too many plugin libraries opened");
    tsr_error err;
    tsr_error_clear(&err);
    void *handle = NULL;
    void (*fn)(void) = NULL;
    if (tsr_export_bind(m, fname, &handle, &fn, &err)) {
        char buf[1600];
        return luaL_error(L, "tessera.call(%s, %s): %s", pname, fname, tsr_error_format(&err, buf, sizeof buf));
    }
    c->handles[c->n_handles++] = handle;
    tsr_ffi_value ret;
    if (tsr_ffi_call(fn, &ex->sig, args, nargs, &ret, &err))
        return luaL_error(L, "tessera.call(%s, %s): %s", pname, fname, err.msg);
    switch (ret.type) {
    case TSR_FFI_VOID: return 0;
    case TSR_FFI_BOOL: lua_pushboolean(L, ret.v.b); return 1;
    case TSR_FFI_INT32:
    case TSR_FFI_INT64: lua_pushinteger(L, (lua_Integer)ret.v.i); return 1;
    case TSR_FFI_UINT32:
    case TSR_FFI_UINT64:
        if (ret.v.u > (uint64_t)INT64_MAX) lua_pushnumber(L, (lua_Number)ret.v.u);
        else lua_pushinteger(L, (lua_Integer)ret.v.u);
        return 1;
    case TSR_FFI_FLOAT:
    case TSR_FFI_DOUBLE: lua_pushnumber(L, ret.v.f); return 1;
    case TSR_FFI_STRING:
        if (ret.v.s) lua_pushstring(L, ret.v.s);
        else lua_pushnil(L);
        return 1;
    default: return 0;
    }
}

static void push_model(lua_State *L, const tsr_model_config *m) {
    lua_newtable(L);
    set_str(L, "arch", m->arch_name);
    lua_pushboolean(L, m->n_experts > 0);
    lua_setfield(L, -2, "moe");
    set_int(L, "n_experts", m->n_experts);
    set_int(L, "n_experts_used", m->n_experts_used);
    set_int(L, "n_layers", m->n_layers);
    set_int(L, "hidden", m->hidden);
    set_int(L, "n_heads", m->n_heads);
    set_int(L, "n_kv_heads", m->n_kv_heads);
    set_int(L, "head_dim", m->head_dim);
    set_int(L, "vocab", m->vocab);
    set_int(L, "max_ctx", m->max_ctx);
    set_int(L, "ffn", m->ffn);
    set_int(L, "expert_ffn", m->expert_ffn);
    set_str(L, "dtype", tsr_dtype_short_name(m->dtype));
}

static void open_sandbox(lua_State *L, const tsr_assembly_env *env) {
    luaL_requiref(L, "_G", luaopen_base, 1);
    lua_pop(L, 1);
    luaL_requiref(L, LUA_STRLIBNAME, luaopen_string, 1);
    lua_pushnil(L);
    lua_setfield(L, -2, "dump");
    lua_pop(L, 1);
    luaL_requiref(L, LUA_TABLIBNAME, luaopen_table, 1);
    lua_pop(L, 1);
    luaL_requiref(L, LUA_MATHLIBNAME, luaopen_math, 1);
    lua_pop(L, 1);
    static const char *const banned[] = {"dofile", "loadfile", "load", "require", "print",
                                         "collectgarbage", NULL};
    for (int i = 0; banned[i]; i++) {
        lua_pushnil(L);
        lua_setglobal(L, banned[i]);
    }
    lua_newtable(L);
    lua_pushcfunction(L, l_catalog);
    lua_setfield(L, -2, "catalog");
    lua_pushcfunction(L, l_device);
    lua_setfield(L, -2, "device");
    lua_pushcfunction(L, l_call);
    lua_setfield(L, -2, "call");
    if (env->model) push_model(L, env->model);
    else lua_pushnil(L);
    lua_setfield(L, -2, "model");
    lua_setglobal(L, "tessera");
}

static int l_open_sandbox(lua_State *L) {
    open_sandbox(L, get_ctx(L)->env);
    return 0;
}

/* --- the returned table -> tsr_ynode -------------------------------------- */

typedef struct conv {
    const char *path;
    tsr_diag *d;
    int rc;
    int line; /* of the return, for messages */
} conv;

static int conv_fail(conv *c, int code, const char *where, const char *what) {
    tsr_diag_add(c->d, code, c->path, c->line, 0, "wrong shape: %s%s%s", where[0] ? where : "",
                 where[0] ? ": " : "", what);
    if (!c->rc) c->rc = code;
    return c->rc;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static tsr_ynode *convert(lua_State *L, int idx, conv *c, const char *where, int depth);

static tsr_ynode *convert_table(lua_State *L, int idx, conv *c, const char *where, int depth) {
    if (depth > TSR_YDOC_MAX_DEPTH) {
        conv_fail(c, TSR_ERR_FORMAT, where, "nested deeper than 64 levels");
        return NULL;
    }
    if (!lua_checkstack(L, 8)) {
        conv_fail(c, TSR_ERR_NOMEM, where, "out of Lua stack");
        return NULL;
    }
    idx = lua_absindex(L, idx);
    lua_Integer n_int = 0, max_int = 0;
    int n_str = 0, n_other = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (lua_type(L, -2) == LUA_TSTRING) n_str++;
        else if (lua_isinteger(L, -2) && lua_tointeger(L, -2) >= 1) {
            n_int++;
            if (lua_tointeger(L, -2) > max_int) max_int = lua_tointeger(L, -2);
        } else n_other++;
        lua_pop(L, 1);
    }
    if (n_other || (n_str && n_int)) {
        conv_fail(c, TSR_ERR_FORMAT, where, "a table must have only string keys or be a list");
        return NULL;
    }
    if (n_int && max_int != n_int) {
        conv_fail(c, TSR_ERR_FORMAT, where, "a list must not have holes");
        return NULL;
    }
    char sub[256];
    if (n_int) {
        tsr_ynode *seq = tsr_ynode_new(TSR_YNODE_SEQ, c->line, 0);
        if (!seq) goto nomem;
        for (lua_Integer i = 1; i <= n_int; i++) {
            lua_rawgeti(L, idx, i);
            snprintf(sub, sizeof sub, "%s[%lld]", where, (long long)i);
            tsr_ynode *it = convert(L, -1, c, sub, depth + 1);
            lua_pop(L, 1);
            if (!it || tsr_ynode_push(seq, it)) {
                tsr_ynode_free(it);
                tsr_ynode_free(seq);
                if (!c->rc) goto nomem;
                return NULL;
            }
        }
        return seq;
    }
    tsr_ynode *map = tsr_ynode_new(TSR_YNODE_MAP, c->line, 0);
    char **keys = n_str ? tsr_hcalloc((size_t)n_str, sizeof *keys) : NULL;
    if (!map || (n_str && !keys)) {
        tsr_ynode_free(map);
        tsr_hfree(keys);
        goto nomem;
    }
    int nk = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        /* the strings stay alive: they are keys of the table */
        if (nk < n_str) keys[nk++] = (char *)lua_tostring(L, -2);
        lua_pop(L, 1);
    }
    if (nk > 1) qsort(keys, (size_t)nk, sizeof *keys, cmp_str); /* keys: NULL for an empty table */
    for (int i = 0; i < nk; i++) {
        lua_getfield(L, idx, keys[i]);
        snprintf(sub, sizeof sub, "%s%s%s", where, where[0] ? "." : "", keys[i]);
        tsr_ynode *k = tsr_ynode_scalar(keys[i], strlen(keys[i]), 1, c->line, 0);
        tsr_ynode *v = k ? convert(L, -1, c, sub, depth + 1) : NULL;
        lua_pop(L, 1);
        if (!k || !v || tsr_ynode_push(map, k)) {
            tsr_ynode_free(k);
            tsr_ynode_free(v);
            tsr_ynode_free(map);
            tsr_hfree(keys);
            if (!c->rc) goto nomem;
            return NULL;
        }
        if (tsr_ynode_push(map, v)) {
            tsr_ynode_free(v);
            tsr_ynode_free(map);
            tsr_hfree(keys);
            goto nomem;
        }
    }
    tsr_hfree(keys);
    return map;
nomem:
    conv_fail(c, TSR_ERR_NOMEM, where, "out of memory");
    return NULL;
}

static tsr_ynode *convert(lua_State *L, int idx, conv *c, const char *where, int depth) {
    char buf[64];
    switch (lua_type(L, idx)) {
    case LUA_TTABLE: return convert_table(L, idx, c, where, depth);
    case LUA_TSTRING: {
        size_t len;
        const char *s = lua_tolstring(L, idx, &len);
        if (strlen(s) != len) {
            conv_fail(c, TSR_ERR_FORMAT, where, "NUL character in a string");
            return NULL;
        }
        tsr_ynode *n = tsr_ynode_scalar(s, len, 1, c->line, 0);
        if (!n) conv_fail(c, TSR_ERR_NOMEM, where, "out of memory");
        return n;
    }
    case LUA_TBOOLEAN:
    case LUA_TNUMBER: {
        if (lua_type(L, idx) == LUA_TBOOLEAN) snprintf(buf, sizeof buf, "%s", lua_toboolean(L, idx) ? "true" : "false");
        else if (lua_isinteger(L, idx)) snprintf(buf, sizeof buf, "%lld", (long long)lua_tointeger(L, idx));
        else {
            lua_Number f = lua_tonumber(L, idx);
            if (f != f || f - f != 0) {
                conv_fail(c, TSR_ERR_FORMAT, where, "numbers must be finite");
                return NULL;
            }
            snprintf(buf, sizeof buf, "%.17g", (double)f);
            if (!strpbrk(buf, ".eE")) strcat(buf, ".0");
        }
        tsr_ynode *n = tsr_ynode_scalar(buf, strlen(buf), 0, c->line, 0);
        if (!n) conv_fail(c, TSR_ERR_NOMEM, where, "out of memory");
        return n;
    }
    default: {
        char what[96];
        snprintf(what, sizeof what, "a %s cannot be part of an assembly", luaL_typename(L, idx));
        conv_fail(c, TSR_ERR_FORMAT, where, what);
        return NULL;
    }
    }
}

/* "path:LINE: msg" -> line and msg (after the prefix). */
static int split_location(const char *msg, const char *path, int *line, const char **rest) {
    *line = 0;
    *rest = msg;
    size_t n = strlen(path);
    if (strncmp(msg, path, n) || msg[n] != ':') return 0;
    const char *p = msg + n + 1;
    int l = 0;
    while (*p >= '0' && *p <= '9' && l < 100000000) l = l * 10 + (*p++ - '0');
    if (*p != ':' || l == 0) return 0;
    *line = l;
    *rest = p[1] == ' ' ? p + 2 : p + 1;
    return 1;
}

int tsr_lua_assembly_run_buffer(const char *buf, size_t len, const char *path,
                                const tsr_assembly_env *env, tsr_ynode **out, tsr_diag *d) {
    *out = NULL;
    lctx c;
    memset(&c, 0, sizeof c);
    c.env = env;
    c.mem_cap = env->lua_memory ? env->lua_memory : TSR_LUA_DEFAULT_MEMORY;
    c.budget = env->lua_instructions ? env->lua_instructions : TSR_LUA_DEFAULT_INSTRUCTIONS;
    lua_State *L = lua_newstate(l_alloc, &c);
    if (!L) return tsr_diag_add(d, TSR_ERR_NOMEM, path, 0, 0, "cannot create a Lua state");
    int rc = TSR_OK;
    char chunk[600];
    snprintf(chunk, sizeof chunk, "@%s", path);
    /* the sandbox is set up under a protected call: it may hit the memory cap */
    lua_pushcfunction(L, l_open_sandbox);
    int st = lua_pcall(L, 0, 0, 0);
    if (st == LUA_OK) st = luaL_loadbufferx(L, buf, len, chunk, "t");
    if (st == LUA_OK) {
        lua_sethook(L, l_hook, LUA_MASKCOUNT, HOOK_EVERY);
        st = lua_pcall(L, 0, LUA_MULTRET, 0);
        lua_sethook(L, NULL, 0, 0);
    }
    if (st != LUA_OK) {
        const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "(error object is not a string)";
        int line;
        const char *rest;
        split_location(msg, path, &line, &rest);
        if (st == LUA_ERRMEM || c.mem_hit)
            rc = tsr_diag_add(d, TSR_ERR_RANGE, path, line, 0, "Lua memory cap of %zu bytes exceeded", c.mem_cap);
        else if (st == LUA_ERRSYNTAX)
            rc = tsr_diag_add(d, TSR_ERR_FORMAT, path, line, 0, "Lua syntax error: %s", rest);
        else if (c.spent > c.budget)
            rc = tsr_diag_add(d, TSR_ERR_RANGE, path, line, 0, "%s", rest);
        else
            rc = tsr_diag_add(d, TSR_ERR_INVALID, path, line, 0, "Lua error: %s", rest);
    } else if (lua_gettop(L) != 1 || !lua_istable(L, 1)) {
        rc = tsr_diag_add(d, TSR_ERR_FORMAT, path, 0, 0,
                          "wrong shape: the script must return one table (it returned %d value%s%s%s)",
                          lua_gettop(L), lua_gettop(L) == 1 ? "" : "s", lua_gettop(L) >= 1 ? ", the first a " : "",
                          lua_gettop(L) >= 1 ? luaL_typename(L, 1) : "");
    } else {
        conv cv = {.path = path, .d = d, .line = 0};
        tsr_ynode *root = convert(L, 1, &cv, "", 0);
        rc = cv.rc;
        if (!rc && !root) rc = tsr_diag_add(d, TSR_ERR_NOMEM, path, 0, 0, "out of memory");
        if (!rc) *out = root;
        else tsr_ynode_free(root);
    }
    lua_close(L);
    for (int i = 0; i < c.n_handles; i++) dlclose(c.handles[i]);
    return rc;
}

int tsr_lua_assembly_run(const char *path, const tsr_assembly_env *env, tsr_ynode **out, tsr_diag *d) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return tsr_diag_add(d, TSR_ERR_IO, path, 0, 0, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > TSR_YDOC_MAX_BYTES) {
        fclose(f);
        return tsr_diag_add(d, TSR_ERR_IO, path, 0, 0, "not a regular file of at most %u bytes", TSR_YDOC_MAX_BYTES);
    }
    size_t size = (size_t)st.st_size;
    char *buf = tsr_halloc(size + 1);
    if (!buf) {
        fclose(f);
        return tsr_diag_add(d, TSR_ERR_NOMEM, path, 0, 0, "out of memory");
    }
    size_t got = fread(buf, 1, size, f);
    fclose(f);
    int rc = got == size ? tsr_lua_assembly_run_buffer(buf, size, path, env, out, d)
                         : tsr_diag_add(d, TSR_ERR_IO, path, 0, 0, "short read");
    tsr_hfree(buf);
    return rc;
}
