"""``python -m gpuproof.cli``: the same as ``gpuproof``."""

import sys

from .main import main

sys.exit(main())
