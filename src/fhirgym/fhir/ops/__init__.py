"""One module per REST interaction or operation; each handler takes ``(server, req, **path params)``.

:mod:`.._routes` maps method + path pattern to these handlers; a new operation is a module here plus
one line in that table.
"""
