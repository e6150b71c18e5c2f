"""How, not what: faster versions of lime.py's LIMe mix (and loss), picked by
lime.use_fused_kernels. cpu.py: for a CPU (the default there); fused.py: Triton kernels for CUDA
GPUs."""
