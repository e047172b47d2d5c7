"""Triton kernels of specdec, each beside its plain PyTorch reference (`specdec.kernels`)."""
