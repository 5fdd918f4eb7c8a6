"""``python -m gpuproof.sim.kubelet reap <dir>``: the reaper of a private cluster's kubelet nodes
(:func:`gpuproof.sim.kubelet.nodes._spawn_reaper` starts it)."""

import sys

from .nodes import _reap

if sys.argv[1:2] == ["reap"]:
    _reap(sys.argv[2])
