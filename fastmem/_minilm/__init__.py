"""MiniLM in numpy, from the int8 weights packaged with the default model: the vector of a
query while onnxruntime is still loading (a fresh process answers without waiting for it).

``wordpiece`` is the query's tokenizer, ``bert`` the float32 pieces both numpy paths share
(``fastmem.embed.NumpyMiniLM`` uses them too), ``int8`` the graph itself. It imports nothing
of fastmem's but ``fastmem.errors``; ``fastmem.embed`` imports it.
"""
