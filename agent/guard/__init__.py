"""The package-manager guard: one neutral Transaction evaluated by the policy; apt (and later dnf) adapters.

Modules on the apt hook's path (transaction, apt, apt_hook, overrides, state) use the standard library only.
"""
