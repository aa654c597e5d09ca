"""The options and rules of the command line's reference models, one module per model: what a
model takes (which encodings, which sizes) belongs with it, not with the shared vocabulary of
:mod:`posenc.cli.options`. The train commands, the benches and the demo import them from here
(train and bench never import each other)."""
