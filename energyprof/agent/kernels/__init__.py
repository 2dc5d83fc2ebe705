"""The program's half of the op and kernel capture (module names are agent/modules.py: the sampler uses them),
its reduction, the autograd link and torch's private surface (torch_compat.py). Stdlib-only at import:
torch is reached through `sys.modules` once the program has loaded it."""
