"""Run pip as if it were the target distribution's Python: ``pip_for_target.py X.Y pip-arguments...``.

pip's ``--python-version`` picks wheels and checks Requires-Python for X.Y but still evaluates environment markers
(``tomli; python_version < "3.11"``, ``exceptiongroup; python_version < "3.11"``) against the interpreter running
pip. Building RHEL 9's (3.9) vendor tree on a 3.11 machine would then silently leave such dependencies out. This
wrapper makes pip's marker environment say X.Y before pip starts; everything else is plain pip.
"""

import sys


def main(argv):
    if len(argv) < 2 or argv[0].count(".") != 1:
        sys.stderr.write("usage: pip_for_target.py X.Y PIP-ARGS...\n")
        return 2
    version = argv[0]
    from pip._vendor.packaging import markers

    environment = markers.default_environment()
    environment.update(python_version=version, python_full_version=version + ".0",
                       implementation_name="cpython", platform_python_implementation="CPython",
                       implementation_version=version + ".0", sys_platform="linux", platform_system="Linux",
                       platform_machine="x86_64", os_name="posix")
    markers.default_environment = lambda: dict(environment)
    from pip._internal.cli.main import main as pip_main

    return pip_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
