"""hotpaths: reference and SM90 kernels for the three hot paths of MoE LLM serving.

Subpackages: ``hotpaths.reference`` (pure-PyTorch references), ``hotpaths.kernels`` (CUDA C++ for sm_90a and their
loaders), ``hotpaths.harness`` (timing, checking, tables, the command-line tool).
"""

__version__ = "0.1.0"
