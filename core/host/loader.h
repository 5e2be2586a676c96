/*
 * loader.h - dlopen, the descriptor cross-check, and the host services.
 *
 * After the checker passes, each chosen plugin is loaded with
 * dlopen(RTLD_NOW | RTLD_LOCAL); its one entry symbol (TSR_PLUGIN_ENTRY_NAME)
 * is called and the descriptor is cross-checked against the manifest (ABI,
 * name, slot, version, device and exactness capability bits); init and iface
 * are required, the interface's struct_size and version are checked before
 * any member is read, and the members each slot header documents as
 * required must be set; the exports the manifest lists must resolve. Only
 * then is the instance allocated (zeroed, instance_size bytes, through the
 * accounted allocator) and init called; a failing init is followed by fini
 * and reported as "plugin NAME (path): init failed: <its set_error text>".
 */
#ifndef TSR_LOADER_H
#define TSR_LOADER_H

#include "engine.h"
#include "manifest.h"

/* Check m's library (sha256, permissions), dlopen it and resolve export fn.
 * On success the caller owns *handle (dlclose). Exports are pure functions:
 * no instance, no init needed. */
int tsr_export_bind(const tsr_manifest *m, const char *fn, void **handle, void (**out)(void), tsr_error *err);

/* Bytes of the smallest interface table of version 1 of slot s, and whether
 * each required member of iface (a table of that slot) is set: 0 when all
 * are, else the name of a missing one is written to missing. */
size_t tsr_slot_iface_min_size(tsr_slot s);
int tsr_slot_iface_check(tsr_slot s, const void *iface, char *missing, size_t size);

#endif /* TSR_LOADER_H */
