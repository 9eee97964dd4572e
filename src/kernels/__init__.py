"""CUDA C++ kernels for sm_90a and their Python loaders (see ``hotpaths.kernels._build``)."""
