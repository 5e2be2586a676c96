local t = {}
for i = 1, 10 do t[i] = {i, tostring(i)} end
return {name = 'l', device = 'cpu', slots = {}, list = t}
