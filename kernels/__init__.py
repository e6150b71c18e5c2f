"""Fused Triton kernels for LIMe's mix (fused.py); lime.use_fused_kernels() turns them on."""
