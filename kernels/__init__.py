"""Triton kernels of specdec, each beside its plain PyTorch reference (imported as `specdec.kernels`)."""
