/*
 * scaffold.h - `tessera plugins new SLOT NAME`: the files of a new plugin.
 *
 * Writes, under a source tree root:
 *   plugins/NAME/NAME.c          the slot's interface as documented stubs:
 *                                every required member returns
 *                                TSR_ERR_NOT_IMPLEMENTED after set_error,
 *                                optional members are left NULL with their
 *                                defaults described
 *   plugins/NAME/CMakeLists.txt  tessera_add_plugin(NAME ...), a test stanza
 *   plugins/NAME/README.md       technique, when it helps, quality contract,
 *                                limits, params: to fill in
 *   manifests/NAME.yaml          CPU, exact, version 0.1.0
 * so that it builds at once and the conformance harness picks it up from
 * the catalog and fails its cases until they are implemented.
 */
#ifndef TSR_CLI_SCAFFOLD_H
#define TSR_CLI_SCAFFOLD_H

#include "../util/error.h"

/* slot: "gemv", "attention", "kv_cache", "drafter" or "expert_cache".
 * name: [a-z][a-z0-9_]*, at most 48 characters. Refuses (TSR_ERR_INVALID)
 * a bad slot or name and (TSR_ERR_REFUSED) a plugin folder or manifest
 * that exists already; writes nothing unless every file can be written, and
 * removes what it wrote if a later write fails. On success, paths (if not
 * NULL) receives the written files, one per line. */
int tsr_scaffold_plugin(const char *root, const char *slot, const char *name, char *paths, size_t size,
                        tsr_error *err);

#endif /* TSR_CLI_SCAFFOLD_H */
