"""``python -m gpuproof.rbac``: prints ``deploy/rbac.yaml``, the RBAC gpuproof needs (pipe it to
``kubectl apply -f -``).

A command-line entry kept at its documented name; the rules and the code are :mod:`gpuproof.cluster.rbac`'s.
"""

import sys

from .cluster.rbac import main

if __name__ == "__main__":
    sys.exit(main())
