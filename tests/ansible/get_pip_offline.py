"""Stand-in for the pip bootstrap script (``get-pip.py``) that ``ansible-test`` downloads from
Ansible's own file host, which this machine cannot reach: it installs pip in the sanity test's
new virtual environment from the wheel bundled with Python (``ensurepip``), then the pinned
pip version and packages ansible-test asks for from the package index (PyPI).

ansible-test runs it, in place of get-pip.py, as ``python get_pip_X_Y.py [OPTIONS] PACKAGES``
(``GET_PIP`` names it; ``tests/ansible/sanity.py`` puts it in ansible-test's cache). Only
``tests/run.sh`` (setup, with the package index reachable) makes ansible-test bootstrap;
the tests then reuse the environments it made.
"""

from __future__ import annotations

import ensurepip
import os
import subprocess
import sys

GET_PIP_ONLY = ("--no-setuptools", "--no-wheel")  # get-pip.py's own options, not pip's


def main(argv: list[str]) -> int:
    """Bootstrap pip, then ``pip install`` the arguments; return pip's exit status."""
    env = dict(os.environ)  # ensurepip points PIP_CONFIG_FILE at /dev/null: keep pip's config
    ensurepip.bootstrap(upgrade=True)
    args = [a for a in argv if a not in GET_PIP_ONLY]
    return subprocess.call([sys.executable, "-m", "pip", "install", *args], env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
