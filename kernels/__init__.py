"""How, not what: fused Triton kernels for LIMe's mix (fused.py, switched on by
lime.use_fused_kernels), and the CPU training loss in less memory (cross_entropy.py)."""
