return {name = 'e', device = 'cpu', slots = {gemv = {plugin = 'gemv', params = {}}}, runtime = {}}
