-- cpu-auto.lua - the reference CPU engine, chosen by a script.
--
-- Shows what a Lua assembly can do: read the catalog, the device and the
-- model's config, and call a plugin's exported function. It returns the
-- same table a YAML assembly holds, and goes through the same checker.
-- Run: tessera check assemblies/cpu-auto.lua [--model PATH]

local function has(name)
  for _, p in ipairs(tessera.catalog()) do
    if p.name == name and not p.test then return true end
  end
  return false
end

local slots = {
  attention = "ref_attention",
  kv_cache = "ref_kv_cache",
  drafter = "drafter_none",
  gemv = "ref_gemv",
}

-- An expert cache only matters for a mixture-of-experts model; for a dense
-- model (or none) the slot is left out and takes its baseline.
local m = tessera.model
if m and m.moe and has("expert_resident") then
  slots.expert_cache = "expert_resident"
end

local desc = "reference plugins, chosen by cpu-auto.lua"
if m then
  -- size hint from the KV plugin's own arithmetic (a libffi export)
  local per_token = tessera.call("ref_kv_cache", "ref_kv_cache_bytes_per_token",
                                 m.n_layers, m.n_kv_heads, m.head_dim)
  desc = string.format("%s for %s (%d KV bytes per token)", desc, m.arch, per_token)
end

return {
  name = "cpu-auto",
  description = desc,
  device = tessera.device(),
  slots = slots,
}
