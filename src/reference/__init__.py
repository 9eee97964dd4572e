"""Pure-PyTorch references (exact and same-precision emulations), host plans and simulators, CPU and GPU."""
