"""The drop-in's code, as real Python: each module here is one part of every generated drop-in (dropin.py, which a
kernel PR adds beside its kernel), in the order the generator (runner/harness/dropin.py) writes them after the
drop-in's head (its docstring, imports and per-PR constants) and the import of the original class:

- adopt.py: FUSEBOT_DISABLE and `adopt` (a module that binds its class's name to the drop-in);
- runtime.py: loading a library (the shipped one, the per-user build cache);
- guard.py: what a call is checked for before the kernel runs;
- call.py: a call signature's kernel path made once, the kernel run on a call, the custom op;
- device.py: loading device code through the CUDA driver and launching its plans;
- forward.py: the forward's paths (eager, torch.compile, the original);
- subclass.py: the class itself (its name, kernel file, op and target filled in by the generator).

In a drop-in the parts share one namespace. Here each imports what it uses above its line `# ---- the drop-in from
here on` (head.py stands for the generated head; a name a later part defines is reached through a small forwarder):
the generator drops everything above that line and keeps the rest as it is, except two lines it writes from their one
source: the resolver's import marked `# fusebot: inline` (runner/harness/refs.py) and the dtype table marked
`# fusebot: abi dtypes` (runner/dtypes.py). The generator reads these files as text, never imports them.
"""
