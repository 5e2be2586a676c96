-- every slot named, with params; the catalog and the model consulted
local n = 0
for _, p in ipairs(tessera.catalog()) do
  if p.slot == 'attention' then n = n + 1 end
end
local slots = {gemv = 'gemv', attention = {plugin = 'att', params = {scale = 0.5, on = n > 0}},
               kv_cache = {plugin = 'kv', params = {dtype = 'f16', block = 16}}, drafter = 'dr'}
if tessera.model and tessera.model.moe then slots.expert_cache = 'ec' end
return {name = 'fz-' .. tessera.device(), description = 'seed', device = tessera.device(), slots = slots,
        runtime = {cuda_graphs = false}}
