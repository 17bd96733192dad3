"""``trioserve dev PATH``: serve a model from its files in place and reload it on each edit.

- :mod:`.target` (sans-IO): what PATH is (a handler file, a handler folder, an MLServer
  folder, an unpacked archive), which changed files call for a reload, the sample body;
- :mod:`.announce` (sans-IO): the lines dev prints, the ready-to-run curl line among them;
- :mod:`.loop` (trio): the server, the file watcher and the reloads.

This package is wiring: it starts :func:`trioserve.server.serve` and drives the model
manager. docs/dev.md describes the loop for users.
"""
